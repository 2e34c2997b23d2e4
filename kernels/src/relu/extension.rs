//! ReLU as a CubeCL backend extension, with its autodiff step.

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::{AutodiffBackend, Backend, backend_extension, tensor::FloatTensor};

use crate::support::autodiff::unary_step;

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
        let forward = |x| {
            let y = B::single_relu(x);
            (y.clone(), y)
        };
        unary_step::<B, C, _>(x, forward, |y, grad| B::single_relu_backward(y, grad))
    }

    fn single_relu_backward(y: FloatTensor<Self>, grad: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::from_inner(B::single_relu_backward(y.into_primitive(), grad.into_primitive()))
    }
}
