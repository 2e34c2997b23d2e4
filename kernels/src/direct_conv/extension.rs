//! The convolution as a CubeCL backend extension, with its autodiff step.

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::{AutodiffBackend, Backend, backend_extension, tensor::FloatTensor};

use super::ConvGeom;
use crate::support::autodiff::{ConvKernels, conv_step};

/// The convolution kernels (see the module docs): `x` `[N, C, H, W]`, `weight`
/// `[C_out, C / groups, kh, kw]`.
#[backend_extension(Cube, Autodiff)]
pub trait DirectConvBackend: Backend {
    /// The convolution, `[N, C_out, H', W']`.
    fn direct_conv2d(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        geom: ConvGeom,
    ) -> FloatTensor<Self>;

    /// The gradient of the input from the output's, `[N, C, H, W]` (`x` read for ReLU's mask
    /// where `geom.relu`).
    fn direct_conv2d_x_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        geom: ConvGeom,
    ) -> FloatTensor<Self>;

    /// The gradient of the weight from the input and the output's gradient.
    fn direct_conv2d_weight_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        geom: ConvGeom,
    ) -> FloatTensor<Self>;

    /// Both gradients, `(input's, weight's)`: the two functions above, with the output's
    /// gradient laid out contiguously once for both (each would copy a strided one).
    fn direct_conv2d_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        geom: ConvGeom,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);
}

impl<B: Backend + DirectConvBackend, C: CheckpointStrategy> DirectConvBackend for Autodiff<B, C> {
    fn direct_conv2d(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        geom: ConvGeom,
    ) -> FloatTensor<Self> {
        let kernels = ConvKernels {
            forward: B::direct_conv2d,
            both: |x, grad, w, geom| {
                let (dx, dw) = B::direct_conv2d_backward(x, grad, w, geom);
                [dx, dw]
            },
            x: B::direct_conv2d_x_backward,
            w: B::direct_conv2d_weight_backward,
        };
        conv_step::<B, C, _>(x, weight, geom, kernels)
    }

    fn direct_conv2d_x_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        geom: ConvGeom,
    ) -> FloatTensor<Self> {
        Self::from_inner(B::direct_conv2d_x_backward(
            x.into_primitive(),
            grad.into_primitive(),
            weight.into_primitive(),
            geom,
        ))
    }

    fn direct_conv2d_weight_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        geom: ConvGeom,
    ) -> FloatTensor<Self> {
        Self::from_inner(B::direct_conv2d_weight_backward(
            x.into_primitive(),
            grad.into_primitive(),
            geom,
        ))
    }

    fn direct_conv2d_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        geom: ConvGeom,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (dx, dw) = B::direct_conv2d_backward(
            x.into_primitive(),
            grad.into_primitive(),
            weight.into_primitive(),
            geom,
        );
        (Self::from_inner(dx), Self::from_inner(dw))
    }
}
