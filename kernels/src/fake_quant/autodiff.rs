//! The fused fake quantization under autodiff: the straight-through gradient as its own step.

use super::*;

/// The autodiff step of a fused fake quantization: the straight-through gradient, from the
/// input, the grid's multiplier and zero point, and the layout. (Also the step of
/// [`crate::observe::observe_fake_quant`]'s output.)
#[derive(Debug)]
pub(crate) struct FakeQuantStep;

impl<B: Backend + FakeQuantBackend> Backward<B, 1> for FakeQuantStep {
    type State = (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>, FusedLayout);

    fn backward(
        self,
        ops: Ops<Self::State, 1>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let (x, mult, zero_point, layout) = ops.state;
        unary::<B, _>(ops.parents, ops.node, grads, |grad| {
            B::fake_quant_fused_backward(x, grad, mult, zero_point, layout)
        });
    }
}

impl<B: Backend + FakeQuantBackend, C: CheckpointStrategy> FakeQuantBackend for Autodiff<B, C> {
    fn fake_quant_fused(
        x: FloatTensor<Self>,
        mult: FloatTensor<Self>,
        step: FloatTensor<Self>,
        zero_point: FloatTensor<Self>,
        layout: FusedLayout,
    ) -> FloatTensor<Self> {
        let (mult, step, zp) =
            (mult.into_primitive(), step.into_primitive(), zero_point.into_primitive());
        match FakeQuantStep.prepare::<C>([x.node()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let xp = x.primitive().clone();
                let out = B::fake_quant_fused(xp.clone(), mult.clone(), step, zp.clone(), layout);
                prep.finish((xp, mult, zp, layout), out)
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(B::fake_quant_fused(x.into_primitive(), mult, step, zp, layout))
            }
        }
    }

    fn fake_quant_fused_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        mult: FloatTensor<Self>,
        zero_point: FloatTensor<Self>,
        layout: FusedLayout,
    ) -> FloatTensor<Self> {
        Self::from_inner(B::fake_quant_fused_backward(
            x.into_primitive(),
            grad.into_primitive(),
            mult.into_primitive(),
            zero_point.into_primitive(),
            layout,
        ))
    }
}
