//! The int32 rounding of a bias at its derived scale in one launch on the CubeCL backends.
//!
//! A bias added to an integer accumulator is stored as int32 in units of the accumulator
//! (`qdarts_ops::candidates::quantize_bias`): `b_q = round(b/s)·s` with `s = |unit|`, the bias
//! left as it is where `s` vanishes. As tensor expressions that is a dozen launches per
//! BatchNorm and training forward (abs, two compares and fills, a division, a rounding, a
//! clamp, a product, a select, a difference); here the difference `b_q − b` is one kernel, and
//! the caller adds it to `b` with a straight-through gradient. The arithmetic is the
//! expressions', operation for operation in f32 (on CUDA `q·s − b` may be contracted into one
//! fused multiply-add).

use burn::tensor::{DType, Tensor};

/// Steps below this leave the bias unrounded (the expressions' threshold).
pub const TINY_STEP: f32 = 1e-30;

/// Whether [`int32_residual`] runs for `b` and `unit` (the CubeCL backends, f32, one unit per
/// bias value).
pub fn residual_available(b: &Tensor<1>, unit: &Tensor<1>) -> bool {
    crate::support::on_cube(&b.device())
        && b.dtype() == DType::F32
        && unit.dtype() == DType::F32
        && b.dims() == unit.dims()
        && b.device() == unit.device()
}

/// `b_q − b` with `b_q = clamp(round(b/s), −2³¹, 2³¹ − 1)·s`, `s = |unit|` (ties away from
/// zero or to even), or 0 where `s < TINY_STEP`; not differentiated. The output uses autodiff
/// where `b` does.
///
/// # Panics
/// Where [`residual_available`] is false.
pub fn int32_residual(b: Tensor<1>, unit: Tensor<1>, ties_away: bool) -> Tensor<1> {
    assert!(residual_available(&b, &unit), "int32_residual: not available for {b:?}, {unit:?}");
    #[cfg(feature = "cube")]
    {
        let autodiff = b.is_autodiff();
        let out =
            Tensor::<1>::from_dispatch(<burn::backend::Dispatch as BiasBackend>::int32_residual(
                b.inner().into_dispatch(),
                unit.inner().into_dispatch(),
                ties_away,
            ));
        if autodiff { out.autodiff() } else { out }
    }
    #[cfg(not(feature = "cube"))]
    unreachable!("residual_available is false without the CubeCL backends ({ties_away})")
}

/// Whether [`int32_rounded`] runs for `b` and `factors` (the CubeCL backends, f32, one to three
/// factors, each `[1]` or as long as `b`).
pub fn rounded_available(b: &Tensor<1>, factors: &[Tensor<1>]) -> bool {
    let c = b.dims()[0];
    crate::support::on_cube(&b.device())
        && b.dtype() == DType::F32
        && (1..=3).contains(&factors.len())
        && factors.iter().all(|f| {
            f.dtype() == DType::F32
                && (f.dims()[0] == c || f.dims()[0] == 1)
                && f.device() == b.device()
        })
}

/// `b + (b_q − b)`, [`int32_residual`] added back to `b` in the same launch, with the unit the
/// product of `factors` in order (each `[1]`, broadcast, or per channel): the value of
/// `b.add(int32_residual(b, f₀·f₁·f₂))`, without its two products and its sum as launches of
/// their own. Not differentiated (for a bias folded from statistics that are not, as
/// `batch_norm::normalize` takes it). Bit for bit that sum on Mesa's lavapipe for a bias within
/// the int32 range; past it (`b_q` clamped, far from `b`) the sum in one kernel may come out as
/// `b_q` itself, within a rounding at `b`'s magnitude.
///
/// # Panics
/// Where [`rounded_available`] is false.
pub fn int32_rounded(b: Tensor<1>, factors: &[Tensor<1>], ties_away: bool) -> Tensor<1> {
    assert!(
        rounded_available(&b, factors),
        "int32_rounded: not available for {b:?} and {} factors",
        factors.len()
    );
    #[cfg(feature = "cube")]
    {
        let b = b.detach().inner();
        // Three operands whatever the count (the extension takes no lists): the unused ones
        // repeat the first, and the kernel multiplies by `count` of them.
        let f = |k: usize| factors.get(k).unwrap_or(&factors[0]).clone().detach().inner();
        Tensor::<1>::from_dispatch(<burn::backend::Dispatch as BiasBackend>::int32_rounded(
            b.into_dispatch(),
            f(0).into_dispatch(),
            f(1).into_dispatch(),
            f(2).into_dispatch(),
            factors.len() as u32,
            ties_away,
        ))
    }
    #[cfg(not(feature = "cube"))]
    unreachable!("rounded_available is false without the CubeCL backends ({ties_away})")
}

#[cfg(feature = "cube")]
use burn::backend::{Backend, backend_extension, tensor::FloatTensor};

/// The bias kernel (see [`residual_available`]); CubeCL only, on tensors without autodiff.
#[cfg(feature = "cube")]
#[backend_extension(Cube)]
pub trait BiasBackend: Backend {
    /// `b_q − b` (see [`int32_residual`]).
    fn int32_residual(
        b: FloatTensor<Self>,
        unit: FloatTensor<Self>,
        ties_away: bool,
    ) -> FloatTensor<Self>;

    /// `b + (b_q − b)` with the unit the product of the first `count` of `f0`, `f1`, `f2` (see
    /// [`int32_rounded`]).
    fn int32_rounded(
        b: FloatTensor<Self>,
        f0: FloatTensor<Self>,
        f1: FloatTensor<Self>,
        f2: FloatTensor<Self>,
        count: u32,
        ties_away: bool,
    ) -> FloatTensor<Self>;
}

#[cfg(feature = "cube")]
pub(crate) mod cube;
