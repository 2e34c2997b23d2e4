//! The scaling kernels as a CubeCL backend extension, with their autodiff steps.

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, binary};
use burn::backend::{
    AutodiffBackend, Backend, TensorMetadata, backend_extension, tensor::FloatTensor,
};

/// The scaling kernels (see [`scale_available`](super::scale_available)).
#[backend_extension(Cube, Autodiff)]
pub trait ScaleBackend: Backend {
    /// `y · w[index]`.
    fn scale_by(y: FloatTensor<Self>, w: FloatTensor<Self>, index: u32) -> FloatTensor<Self>;

    /// `acc + y · w[index]` (`acc`'s shape).
    fn add_scaled(
        acc: FloatTensor<Self>,
        y: FloatTensor<Self>,
        w: FloatTensor<Self>,
        index: u32,
    ) -> FloatTensor<Self>;

    /// `(∂y, ∂w) = (∂out · w[index], Σ ∂out ⊙ y at index and 0 elsewhere)`.
    fn scale_by_backward(
        y: FloatTensor<Self>,
        w: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        index: u32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// `∂w` alone: `Σ ∂out ⊙ y` at `index` of `len` values, 0 elsewhere.
    fn scale_by_weight_grad(
        y: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        index: u32,
        len: u32,
    ) -> FloatTensor<Self>;
}

/// The length of a rank-1 weight vector, as the kernels' index type.
fn len_of<B: Backend>(w: &FloatTensor<B>) -> u32 {
    u32::try_from(w.shape().num_elements()).unwrap_or(u32::MAX)
}

impl<B: Backend + ScaleBackend, C: CheckpointStrategy> ScaleBackend for Autodiff<B, C> {
    fn scale_by(y: FloatTensor<Self>, w: FloatTensor<Self>, index: u32) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct ScaleStep(u32);

        impl<B: Backend + ScaleBackend> Backward<B, 2> for ScaleStep {
            type State = (FloatTensor<B>, FloatTensor<B>);

            fn backward(
                self,
                ops: Ops<Self::State, 2>,
                grads: &mut Gradients,
                _checkpointer: &mut Checkpointer,
            ) {
                let (y, w) = ops.state;
                let index = self.0;
                if let [Some(node_y), Some(node_w)] = &ops.parents {
                    let grad = grads.consume::<B>(&ops.node);
                    let (dy, dw) = B::scale_by_backward(y, w, grad, index);
                    grads.register::<B>(node_y.id, dy);
                    grads.register::<B>(node_w.id, dw);
                    return;
                }
                let len = len_of::<B>(&w);
                binary::<B, _, _>(
                    ops.parents,
                    ops.node,
                    grads,
                    |grad| B::scale_by(grad, w, index),
                    |grad| B::scale_by_weight_grad(y, grad, index, len),
                );
            }
        }

        match ScaleStep(index).prepare::<C>([y.node(), w.node()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let (yp, wp) = (y.primitive().clone(), w.primitive().clone());
                let out = B::scale_by(yp.clone(), wp.clone(), index);
                prep.finish((yp, wp), out)
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(B::scale_by(y.into_primitive(), w.into_primitive(), index))
            }
        }
    }

    fn add_scaled(
        acc: FloatTensor<Self>,
        y: FloatTensor<Self>,
        w: FloatTensor<Self>,
        index: u32,
    ) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct AddScaledStep(u32);

        impl<B: Backend + ScaleBackend> Backward<B, 3> for AddScaledStep {
            type State = (FloatTensor<B>, FloatTensor<B>);

            fn backward(
                self,
                ops: Ops<Self::State, 3>,
                grads: &mut Gradients,
                _checkpointer: &mut Checkpointer,
            ) {
                let [node_acc, node_y, node_w] = ops.parents;
                let grad = grads.consume::<B>(&ops.node);
                let (y, w) = ops.state;
                let index = self.0;
                // `∂acc` is `∂out` itself; while it is held here the kernels see the buffer
                // shared and write `∂y` into one of its own.
                match (node_y, node_w) {
                    (Some(node_y), Some(node_w)) => {
                        let (dy, dw) = B::scale_by_backward(y, w, grad.clone(), index);
                        grads.register::<B>(node_y.id, dy);
                        grads.register::<B>(node_w.id, dw);
                    }
                    (Some(node_y), None) => {
                        grads.register::<B>(node_y.id, B::scale_by(grad.clone(), w, index));
                    }
                    (None, Some(node_w)) => {
                        let len = len_of::<B>(&w);
                        let dw = B::scale_by_weight_grad(y, grad.clone(), index, len);
                        grads.register::<B>(node_w.id, dw);
                    }
                    (None, None) => {}
                }
                if let Some(node_acc) = node_acc {
                    grads.register::<B>(node_acc.id, grad);
                }
            }
        }

        let nodes = [acc.node(), y.node(), w.node()];
        match AddScaledStep(index).prepare::<C>(nodes).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let (yp, wp) = (y.primitive().clone(), w.primitive().clone());
                let out = B::add_scaled(acc.into_primitive(), yp.clone(), wp.clone(), index);
                prep.finish((yp, wp), out)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::add_scaled(
                acc.into_primitive(),
                y.into_primitive(),
                w.into_primitive(),
                index,
            )),
        }
    }

    fn scale_by_backward(
        y: FloatTensor<Self>,
        w: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        index: u32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (dy, dw) = B::scale_by_backward(
            y.into_primitive(),
            w.into_primitive(),
            grad.into_primitive(),
            index,
        );
        (Self::from_inner(dy), Self::from_inner(dw))
    }

    fn scale_by_weight_grad(
        y: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        index: u32,
        len: u32,
    ) -> FloatTensor<Self> {
        Self::from_inner(B::scale_by_weight_grad(
            y.into_primitive(),
            grad.into_primitive(),
            index,
            len,
        ))
    }
}
