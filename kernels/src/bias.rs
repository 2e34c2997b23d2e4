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
}

#[cfg(feature = "cube")]
mod cube {
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
            let step = f32::abs(unit[i]);
            let small = step < tiny;
            let safe = select(small, 1.0, step);
            let r = round_ties(bi / safe, ties_away);
            let q = select(lt(r, INT_MIN), INT_MIN, select(lt(INT_MAX, r), INT_MAX, r));
            let bq = select(small, bi, q * safe);
            out[i] = bq - bi;
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
    }
}
