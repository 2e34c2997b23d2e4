//! The convolution as a CubeCL backend extension, with its autodiff step.

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, binary};
use burn::backend::{AutodiffBackend, Backend, backend_extension, tensor::FloatTensor};

use super::ConvGeom;

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

    /// The gradient of the input from the output's, `[N, C, H, W]`.
    fn direct_conv2d_x_backward(
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
}

impl<B: Backend + DirectConvBackend, C: CheckpointStrategy> DirectConvBackend for Autodiff<B, C> {
    fn direct_conv2d(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        geom: ConvGeom,
    ) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct ConvStep;

        impl<B: Backend + DirectConvBackend> Backward<B, 2> for ConvStep {
            type State = (FloatTensor<B>, FloatTensor<B>, ConvGeom);

            fn backward(
                self,
                ops: Ops<Self::State, 2>,
                grads: &mut Gradients,
                _checkpointer: &mut Checkpointer,
            ) {
                let (x, weight, geom) = ops.state;
                binary::<B, _, _>(
                    ops.parents,
                    ops.node,
                    grads,
                    |grad| B::direct_conv2d_x_backward(grad, weight, geom),
                    |grad| B::direct_conv2d_weight_backward(x, grad, geom),
                );
            }
        }

        match ConvStep.prepare::<C>([x.node(), weight.node()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let (xp, wp) = (x.primitive().clone(), weight.primitive().clone());
                let out = B::direct_conv2d(xp.clone(), wp.clone(), geom);
                prep.finish((xp, wp, geom), out)
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(B::direct_conv2d(x.into_primitive(), weight.into_primitive(), geom))
            }
        }
    }

    fn direct_conv2d_x_backward(
        grad: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        geom: ConvGeom,
    ) -> FloatTensor<Self> {
        Self::from_inner(B::direct_conv2d_x_backward(
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
}
