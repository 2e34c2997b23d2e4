//! The pools under autodiff: each forward on the inner backend with its backward step.

use super::*;

/// The autodiff step of an average pool (also [`PoolBackend::pool_avg2d_rounded`]'s).
#[derive(Debug)]
struct AvgStep;

impl<B: Backend + PoolBackend> Backward<B, 1> for AvgStep {
    type State = (PlaneGeom, bool);

    fn backward(
        self,
        ops: Ops<Self::State, 1>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let (geom, include_pad) = ops.state;
        unary::<B, _>(ops.parents, ops.node, grads, |grad| {
            B::pool_avg2d_backward(grad, geom, include_pad)
        });
    }
}

/// `forward` of `x` on `B`, differentiated as an average pool of `geom` (and whether the
/// padding counts).
fn avg_step<B: Backend + PoolBackend, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    state: (PlaneGeom, bool),
    forward: impl FnOnce(FloatTensor<B>) -> FloatTensor<B>,
) -> FloatTensor<Autodiff<B, C>> {
    match AvgStep.prepare::<C>([x.node()]).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish(state, forward(x.into_primitive())),
        OpsKind::UnTracked(prep) => prep.finish(forward(x.into_primitive())),
    }
}

impl<B: Backend + PoolBackend, C: CheckpointStrategy> PoolBackend for Autodiff<B, C> {
    fn pool_max2d(x: FloatTensor<Self>, geom: PlaneGeom) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct MaxStep;

        impl<B: Backend + PoolBackend> Backward<B, 1> for MaxStep {
            type State = (FloatTensor<B>, PlaneGeom);

            fn backward(
                self,
                ops: Ops<Self::State, 1>,
                grads: &mut Gradients,
                _checkpointer: &mut Checkpointer,
            ) {
                let (x, geom) = ops.state;
                unary::<B, _>(ops.parents, ops.node, grads, |grad| {
                    B::pool_max2d_backward(x, grad, geom)
                });
            }
        }

        match MaxStep.prepare::<C>([x.node()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let xp = x.primitive().clone();
                let out = B::pool_max2d(xp.clone(), geom);
                prep.finish((xp, geom), out)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::pool_max2d(x.into_primitive(), geom)),
        }
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
