//! ReLU as a CubeCL backend extension, with its autodiff step.

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn::backend::{AutodiffBackend, Backend, backend_extension, tensor::FloatTensor};

/// The ReLU kernels (see [`relu_available`](super::relu_available)).
#[backend_extension(Cube, Autodiff)]
pub trait ReluBackend: Backend {
    /// `y = 0 if x ≤ 0 else x`.
    fn single_relu(x: FloatTensor<Self>) -> FloatTensor<Self>;

    /// `∂x = 0 if y ≤ 0 else ∂y`, from the output `y` and its gradient.
    fn single_relu_backward(y: FloatTensor<Self>, grad: FloatTensor<Self>) -> FloatTensor<Self>;
}

impl<B: Backend + ReluBackend, C: CheckpointStrategy> ReluBackend for Autodiff<B, C> {
    fn single_relu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct ReluStep;

        impl<B: Backend + ReluBackend> Backward<B, 1> for ReluStep {
            type State = FloatTensor<B>;

            fn backward(
                self,
                ops: Ops<Self::State, 1>,
                grads: &mut Gradients,
                _checkpointer: &mut Checkpointer,
            ) {
                let y = ops.state;
                unary::<B, _>(ops.parents, ops.node, grads, |grad| {
                    B::single_relu_backward(y, grad)
                });
            }
        }

        match ReluStep.prepare::<C>([x.node()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let y = B::single_relu(x.into_primitive());
                prep.finish(y.clone(), y)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::single_relu(x.into_primitive())),
        }
    }

    fn single_relu_backward(y: FloatTensor<Self>, grad: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::from_inner(B::single_relu_backward(y.into_primitive(), grad.into_primitive()))
    }
}
