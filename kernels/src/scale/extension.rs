//! The scaling kernels as a CubeCL backend extension, with their autodiff steps.

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::{
    AutodiffBackend, Backend, TensorMetadata, backend_extension, tensor::FloatTensor,
};

use crate::support::autodiff::step;

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

/// The gradients of `y · w[index]` that the graph tracks: both in one launch, or either alone.
fn scaled_grads<B: ScaleBackend>(
    y: FloatTensor<B>,
    w: FloatTensor<B>,
    index: u32,
    grad: FloatTensor<B>,
    tracked: [bool; 2],
) -> [Option<FloatTensor<B>>; 2] {
    match tracked {
        [true, true] => {
            let (dy, dw) = B::scale_by_backward(y, w, grad, index);
            [Some(dy), Some(dw)]
        }
        [true, false] => [Some(B::scale_by(grad, w, index)), None],
        [false, true] => {
            let len = u32::try_from(w.shape().num_elements()).unwrap_or(u32::MAX);
            [None, Some(B::scale_by_weight_grad(y, grad, index, len))]
        }
        [false, false] => [None, None],
    }
}

impl<B: Backend + ScaleBackend, C: CheckpointStrategy> ScaleBackend for Autodiff<B, C> {
    fn scale_by(y: FloatTensor<Self>, w: FloatTensor<Self>, index: u32) -> FloatTensor<Self> {
        let keep = |[y, w]: &[FloatTensor<B>; 2]| (y.clone(), w.clone(), index);
        let forward = |[y, w]: [FloatTensor<B>; 2]| B::scale_by(y, w, index);
        step::<B, C, _, 2>([y, w], keep, forward, |(y, w, index), grad, tracked| {
            scaled_grads::<B>(y, w, index, grad, tracked)
        })
    }

    fn add_scaled(
        acc: FloatTensor<Self>,
        y: FloatTensor<Self>,
        w: FloatTensor<Self>,
        index: u32,
    ) -> FloatTensor<Self> {
        let keep = |[_, y, w]: &[FloatTensor<B>; 3]| (y.clone(), w.clone(), index);
        let forward = |[acc, y, w]: [FloatTensor<B>; 3]| B::add_scaled(acc, y, w, index);
        step::<B, C, _, 3>([acc, y, w], keep, forward, |(y, w, index), grad, [da, dy, dw]| {
            // `∂acc` is `∂out` itself; while it is held here the kernels see the buffer
            // shared and write `∂y` into one of its own.
            let [dy, dw] = scaled_grads::<B>(y, w, index, grad.clone(), [dy, dw]);
            [da.then_some(grad), dy, dw]
        })
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
