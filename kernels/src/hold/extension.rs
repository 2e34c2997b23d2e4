//! The held fake quantization and ReLU gate as a CubeCL backend extension, with their autodiff
//! steps.

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::{AutodiffBackend, Backend, backend_extension, tensor::FloatTensor};

use crate::fake_quant::FusedLayout;
use crate::plane::PlaneGeom;
use crate::pool2d::PoolBackend;
use crate::support::autodiff::unary_step;

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

    /// Max pooling of `x` at `key`'s maxima (see [`max_pool2d_at`](super::max_pool2d_at)); its
    /// backward the max pool's at `key`.
    fn max_pool_at(
        x: FloatTensor<Self>,
        key: FloatTensor<Self>,
        geom: PlaneGeom,
    ) -> FloatTensor<Self>;
}

impl<B: Backend + HoldBackend + PoolBackend, C: CheckpointStrategy> HoldBackend for Autodiff<B, C> {
    fn held_fake_quant(
        x: FloatTensor<Self>,
        x_w: FloatTensor<Self>,
        at_w: FloatTensor<Self>,
        mult: FloatTensor<Self>,
        zero_point: FloatTensor<Self>,
        layout: FusedLayout,
    ) -> FloatTensor<Self> {
        let (x_w, at_w) = (x_w.into_primitive(), at_w.into_primitive());
        let (mult, zp) = (mult.into_primitive(), zero_point.into_primitive());
        let forward = |x| {
            let out = B::held_fake_quant(x, x_w.clone(), at_w, mult.clone(), zp.clone(), layout);
            (out, (x_w, mult, zp, layout))
        };
        unary_step::<B, C, _>(x, forward, |(x_w, mult, zp, layout), grad| {
            B::held_fake_quant_backward(x_w, grad, mult, zp, layout)
        })
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
        let key = key.into_primitive();
        let forward = |x| (B::gate(x, key.clone()), key);
        unary_step::<B, C, _>(x, forward, |key, grad| B::gate(grad, key))
    }

    fn max_pool_at(
        x: FloatTensor<Self>,
        key: FloatTensor<Self>,
        geom: PlaneGeom,
    ) -> FloatTensor<Self> {
        let key = key.into_primitive();
        let forward = |x| (B::max_pool_at(x, key.clone(), geom), (key, geom));
        unary_step::<B, C, _>(x, forward, |(key, geom), grad| {
            B::pool_max2d_backward(key, grad, geom)
        })
    }
}
