//! The depthwise convolution under autodiff: forward on the inner backend, both gradients in one
//! backward step.

use super::*;
use crate::support::autodiff::step;

impl<B: Backend + DepthwiseBackend, C: CheckpointStrategy> DepthwiseBackend for Autodiff<B, C> {
    fn depthwise_conv2d(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        geom: PlaneGeom,
    ) -> FloatTensor<Self> {
        let keep = |[x, w]: &[FloatTensor<B>; 2]| (x.clone(), w.clone(), geom);
        let forward = |[x, w]: [FloatTensor<B>; 2]| B::depthwise_conv2d(x, w, geom);
        step::<B, C, _, 2>(
            [x, weight],
            keep,
            forward,
            |(x, w, geom), grad, tracked| match tracked {
                [true, true] => {
                    let (dx, dw) = B::depthwise_conv2d_backward(x, grad, w, geom);
                    [Some(dx), Some(dw)]
                }
                [dx, dw] => [
                    dx.then(|| B::depthwise_conv2d_x_backward(grad.clone(), w, geom)),
                    dw.then(|| B::depthwise_conv2d_weight_backward(x, grad, geom)),
                ],
            },
        )
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
