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
    crate::lanes::on_cube(&b.device())
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
    crate::lanes::on_cube(&b.device())
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
pub(crate) mod cube {
    use burn_cubecl::CubeBackend;
    use burn_cubecl::tensor::CubeTensor;
    use cubecl::prelude::*;

    use super::{BiasBackend, TINY_STEP};
    use crate::lanes::cube::{elementwise, empty_like, f32_contiguous, lt, round_ties};

    /// `out = b_q − b` per element (see the module docs).
    #[cube(launch)]
    fn residual_kernel(
        b: &[f32],
        unit: &[f32],
        out: &mut [f32],
        tiny: f32,
        #[comptime] ties_away: bool,
    ) {
        let i = ABSOLUTE_POS;
        if i < out.len() {
            let bi = b[i];
            out[i] = int32_of(bi, unit[i], tiny, ties_away) - bi;
        }
    }

    /// `b_q = clamp(round(b/s), −2³¹, 2³¹ − 1)·s` with `s = |unit|`, or `b` where
    /// `s < tiny` (see the module docs).
    #[cube]
    pub(crate) fn int32_of(bi: f32, unit: f32, tiny: f32, #[comptime] ties_away: bool) -> f32 {
        let step = f32::abs(unit);
        let small = step < tiny;
        let safe = select(small, 1.0, step);
        let r = round_ties(bi / safe, ties_away);
        let q = select(lt(r, INT_MIN), INT_MIN, select(lt(INT_MAX, r), INT_MAX, r));
        select(small, bi, q * safe)
    }

    /// `out = b + (b_q − b)` per element, the unit `|f₀·f₁·f₂|` (the factors past `factors`
    /// unused, each read at its index modulo its length: a `[1]` factor is broadcast).
    #[cube(launch)]
    #[allow(clippy::too_many_arguments)]
    fn rounded_kernel(
        b: &[f32],
        f0: &[f32],
        f1: &[f32],
        f2: &[f32],
        out: &mut [f32],
        n0: u32,
        n1: u32,
        n2: u32,
        tiny: f32,
        #[comptime] factors: u32,
        #[comptime] ties_away: bool,
    ) {
        let i = ABSOLUTE_POS;
        if i < out.len() {
            let i32 = i as u32;
            let bi = b[i];
            let mut unit = f0[(i32 % n0) as usize];
            if factors > 1 {
                unit *= f1[(i32 % n1) as usize];
            }
            if factors > 2 {
                unit *= f2[(i32 % n2) as usize];
            }
            out[i] = bi + (int32_of(bi, unit, tiny, ties_away) - bi);
        }
    }

    /// −2³¹ and 2³¹ − 1 as f32 (the latter rounds to 2³¹, as in the expressions' clamp).
    const INT_MIN: f32 = -2_147_483_648.0;
    const INT_MAX: f32 = 2_147_483_648.0;

    /// The panics' name for this kernel.
    const OP: &str = "bias rounding";

    impl BiasBackend for CubeBackend {
        fn int32_residual(b: CubeTensor, unit: CubeTensor, ties_away: bool) -> CubeTensor {
            let (b, unit) = (f32_contiguous(b, OP), f32_contiguous(unit, OP));
            let out = empty_like(&b);
            let (cubes, dim) = elementwise(&b.client, b.meta.num_elements());
            residual_kernel::launch(
                &b.client,
                cubes,
                dim,
                b.clone().into_buffer_arg(),
                unit.into_buffer_arg(),
                out.clone().into_buffer_arg(),
                TINY_STEP,
                ties_away,
            );
            out
        }

        fn int32_rounded(
            b: CubeTensor,
            f0: CubeTensor,
            f1: CubeTensor,
            f2: CubeTensor,
            count: u32,
            ties_away: bool,
        ) -> CubeTensor {
            let b = f32_contiguous(b, OP);
            let factors = [f0, f1, f2].map(|f| f32_contiguous(f, OP));
            let len = |k: usize| factors[k].meta.num_elements() as u32;
            let arg = |k: usize| factors[k].clone().into_buffer_arg();
            let out = empty_like(&b);
            let (cubes, dim) = elementwise(&b.client, b.meta.num_elements());
            rounded_kernel::launch(
                &b.client,
                cubes,
                dim,
                b.clone().into_buffer_arg(),
                arg(0),
                arg(1),
                arg(2),
                out.clone().into_buffer_arg(),
                len(0),
                len(1),
                len(2),
                TINY_STEP,
                count,
                ties_away,
            );
            out
        }
    }
}
