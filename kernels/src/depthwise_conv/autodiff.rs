//! The depthwise convolution under autodiff: forward on the inner backend, both gradients in one
//! backward step.

use super::*;
use crate::support::autodiff::{ConvKernels, conv_step};

impl<B: Backend + DepthwiseBackend, C: CheckpointStrategy> DepthwiseBackend for Autodiff<B, C> {
    fn depthwise_conv2d(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        geom: PlaneGeom,
    ) -> FloatTensor<Self> {
        let kernels = ConvKernels {
            forward: B::depthwise_conv2d,
            both: |x, grad, w, geom| {
                let (dx, dw) = B::depthwise_conv2d_backward(x, grad, w, geom);
                [dx, dw]
            },
            x: |_, grad, w, geom| B::depthwise_conv2d_x_backward(grad, w, geom),
            w: B::depthwise_conv2d_weight_backward,
        };
        conv_step::<B, C, _>(x, weight, geom, kernels)
    }

    fn depthwise_conv2d_x_backward(
        grad: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        geom: PlaneGeom,
    ) -> FloatTensor<Self> {
        Self::from_inner(B::depthwise_conv2d_x_backward(
            grad.into_primitive(),
            weight.into_primitive(),
            geom,
        ))
    }

    fn depthwise_conv2d_weight_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        geom: PlaneGeom,
    ) -> FloatTensor<Self> {
        Self::from_inner(B::depthwise_conv2d_weight_backward(
            x.into_primitive(),
            grad.into_primitive(),
            geom,
        ))
    }

    fn depthwise_conv2d_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        geom: PlaneGeom,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (dx, dw) = B::depthwise_conv2d_backward(
            x.into_primitive(),
            grad.into_primitive(),
            weight.into_primitive(),
            geom,
        );
        (Self::from_inner(dx), Self::from_inner(dw))
    }
}
