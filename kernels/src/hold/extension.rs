//! The held fake quantization and ReLU gate as a CubeCL backend extension, with their autodiff
//! steps.

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn::backend::{AutodiffBackend, Backend, backend_extension, tensor::FloatTensor};

use crate::fake_quant::FusedLayout;

/// The held-rounding kernels (see [`hold_available`](super::hold_available)).
#[backend_extension(Cube, Autodiff)]
pub trait HoldBackend: Backend {
    /// `x·m + (at_w − x_w·m)` (see [`held_fake_quant`](super::held_fake_quant)).
    fn held_fake_quant(
        x: FloatTensor<Self>,
        x_w: FloatTensor<Self>,
        at_w: FloatTensor<Self>,
        mult: FloatTensor<Self>,
        zero_point: FloatTensor<Self>,
        layout: FusedLayout,
    ) -> FloatTensor<Self>;

    /// `∂out·m`, `m` as in [`held_fake_quant`](Self::held_fake_quant).
    fn held_fake_quant_backward(
        x_w: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        mult: FloatTensor<Self>,
        zero_point: FloatTensor<Self>,
        layout: FusedLayout,
    ) -> FloatTensor<Self>;

    /// `x·[key > 0]`; its own backward (of the gradient, with the same key).
    fn gate(x: FloatTensor<Self>, key: FloatTensor<Self>) -> FloatTensor<Self>;
}

impl<B: Backend + HoldBackend, C: CheckpointStrategy> HoldBackend for Autodiff<B, C> {
    fn held_fake_quant(
        x: FloatTensor<Self>,
        x_w: FloatTensor<Self>,
        at_w: FloatTensor<Self>,
        mult: FloatTensor<Self>,
        zero_point: FloatTensor<Self>,
        layout: FusedLayout,
    ) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct HeldStep;

        impl<B: Backend + HoldBackend> Backward<B, 1> for HeldStep {
            type State = (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>, FusedLayout);

            fn backward(
                self,
                ops: Ops<Self::State, 1>,
                grads: &mut Gradients,
                _checkpointer: &mut Checkpointer,
            ) {
                let (x_w, mult, zp, layout) = ops.state;
                unary::<B, _>(ops.parents, ops.node, grads, |grad| {
                    B::held_fake_quant_backward(x_w, grad, mult, zp, layout)
                });
            }
        }

        let (x_w, at_w) = (x_w.into_primitive(), at_w.into_primitive());
        let (mult, zp) = (mult.into_primitive(), zero_point.into_primitive());
        match HeldStep.prepare::<C>([x.node()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let out = B::held_fake_quant(
                    x.into_primitive(),
                    x_w.clone(),
                    at_w,
                    mult.clone(),
                    zp.clone(),
                    layout,
                );
                prep.finish((x_w, mult, zp, layout), out)
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(B::held_fake_quant(x.into_primitive(), x_w, at_w, mult, zp, layout))
            }
        }
    }

    fn held_fake_quant_backward(
        x_w: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        mult: FloatTensor<Self>,
        zero_point: FloatTensor<Self>,
        layout: FusedLayout,
    ) -> FloatTensor<Self> {
        Self::from_inner(B::held_fake_quant_backward(
            x_w.into_primitive(),
            grad.into_primitive(),
            mult.into_primitive(),
            zero_point.into_primitive(),
            layout,
        ))
    }

    fn gate(x: FloatTensor<Self>, key: FloatTensor<Self>) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct GateStep;

        impl<B: Backend + HoldBackend> Backward<B, 1> for GateStep {
            type State = FloatTensor<B>;

            fn backward(
                self,
                ops: Ops<Self::State, 1>,
                grads: &mut Gradients,
                _checkpointer: &mut Checkpointer,
            ) {
                let key = ops.state;
                unary::<B, _>(ops.parents, ops.node, grads, |grad| B::gate(grad, key));
            }
        }

        let key = key.into_primitive();
        match GateStep.prepare::<C>([x.node()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let out = B::gate(x.into_primitive(), key.clone());
                prep.finish(key, out)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::gate(x.into_primitive(), key)),
        }
    }
}
