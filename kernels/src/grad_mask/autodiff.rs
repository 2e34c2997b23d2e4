//! The masked gradient under autodiff: the value passes, the backward multiplies.

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::{Backend, tensor::FloatTensor};

use super::GradMaskBackend;
use crate::support::autodiff::step;

impl<B: Backend + GradMaskBackend, C: CheckpointStrategy> GradMaskBackend for Autodiff<B, C> {
    fn grad_masked(x: FloatTensor<Self>, mask: FloatTensor<Self>) -> FloatTensor<Self> {
        let keep = |[_, mask]: &[FloatTensor<B>; 2]| mask.clone();
        let forward = |[x, mask]: [FloatTensor<B>; 2]| B::grad_masked(x, mask);
        step::<B, C, _, 2>([x, mask], keep, forward, |mask, grad, [dx, _]| {
            [dx.then(|| B::float_mul(grad, mask)), None]
        })
    }
}
