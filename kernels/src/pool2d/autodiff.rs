//! The pools under autodiff: each forward on the inner backend with its backward step.

use super::*;
use crate::support::autodiff::unary_step;

/// `forward` of `x` on `B`, differentiated as an average pool of `geom` (and whether the
/// padding counts; also [`PoolBackend::pool_avg2d_rounded`]'s step).
fn avg_step<B: Backend + PoolBackend, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    state: (PlaneGeom, bool),
    forward: impl FnOnce(FloatTensor<B>) -> FloatTensor<B>,
) -> FloatTensor<Autodiff<B, C>> {
    unary_step::<B, C, _>(
        x,
        |x| (forward(x), state),
        |(geom, include_pad), grad| B::pool_avg2d_backward(grad, geom, include_pad),
    )
}

impl<B: Backend + PoolBackend, C: CheckpointStrategy> PoolBackend for Autodiff<B, C> {
    fn pool_max2d(x: FloatTensor<Self>, geom: PlaneGeom) -> FloatTensor<Self> {
        let forward = |x: FloatTensor<B>| (B::pool_max2d(x.clone(), geom), (x, geom));
        unary_step::<B, C, _>(x, forward, |(x, geom), grad| B::pool_max2d_backward(x, grad, geom))
    }

    fn pool_max2d_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        geom: PlaneGeom,
    ) -> FloatTensor<Self> {
        Self::from_inner(B::pool_max2d_backward(x.into_primitive(), grad.into_primitive(), geom))
    }

    fn pool_avg2d(x: FloatTensor<Self>, geom: PlaneGeom, include_pad: bool) -> FloatTensor<Self> {
        avg_step::<B, C>(x, (geom, include_pad), |x| B::pool_avg2d(x, geom, include_pad))
    }

    fn pool_avg2d_backward(
        grad: FloatTensor<Self>,
        geom: PlaneGeom,
        include_pad: bool,
    ) -> FloatTensor<Self> {
        Self::from_inner(B::pool_avg2d_backward(grad.into_primitive(), geom, include_pad))
    }

    fn pool_avg2d_rounded(
        x: FloatTensor<Self>,
        mult: FloatTensor<Self>,
        step: FloatTensor<Self>,
        geom: PlaneGeom,
        rounding: Rounding,
    ) -> FloatTensor<Self> {
        let (mult, step) = (mult.into_primitive(), step.into_primitive());
        avg_step::<B, C>(x, (geom, rounding.include_pad), |x| {
            B::pool_avg2d_rounded(x, mult, step, geom, rounding)
        })
    }
}
