//! ReLU in one launch per direction on the CubeCL backends.
//!
//! Burn's CubeCL ReLU is a comparison and a masked fill, two launches, and its backward two
//! more; every convolutional candidate op of a DARTS cell starts with one. Here the forward
//! `y = 0 if x ≤ 0 else x` and the backward `∂x = 0 if y ≤ 0 else ∂y` are one kernel each,
//! reading their inputs through their strides: the same selections as Burn's, so the same bits
//! (a NaN passes forward, −0 becomes +0; the gradient is masked where the output is not
//! positive). Other backends and dtypes keep Burn's ReLU.

use burn::tensor::{DType, Device, Tensor};

/// Whether [`relu`] runs this module's kernels for tensors on `device` with this dtype.
pub fn relu_available(device: &Device, dtype: DType) -> bool {
    crate::lanes::on_cube(device) && dtype == DType::F32
}

/// `max(x, 0)` as Burn's `activation::relu` computes it, with its gradient; one kernel each
/// way where [`relu_available`].
pub fn relu<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    if !relu_available(&x.device(), x.dtype()) {
        return burn::tensor::activation::relu(x);
    }
    #[cfg(feature = "cube")]
    {
        let out = <burn::backend::Dispatch as ReluBackend>::single_relu(x.into_dispatch());
        Tensor::from_dispatch(out)
    }
    #[cfg(not(feature = "cube"))]
    unreachable!("relu_available is false without the CubeCL backends")
}

#[cfg(feature = "cube")]
pub use extension::ReluBackend;

#[cfg(feature = "cube")]
mod extension {
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
        fn single_relu_backward(y: FloatTensor<Self>, grad: FloatTensor<Self>)
        -> FloatTensor<Self>;
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

        fn single_relu_backward(
            y: FloatTensor<Self>,
            grad: FloatTensor<Self>,
        ) -> FloatTensor<Self> {
            Self::from_inner(B::single_relu_backward(y.into_primitive(), grad.into_primitive()))
        }
    }
}

#[cfg(feature = "cube")]
mod cube {
    use burn_cubecl::CubeBackend;
    use burn_cubecl::tensor::CubeTensor;
    use cubecl::prelude::*;

    use super::ReluBackend;
    use crate::lanes::cube::{at_most_zero, elementwise, empty_like, f32_strided, read};

    /// `out = 0 if x ≤ 0 else x`.
    #[cube(launch)]
    fn relu_kernel(x: &Tensor<f32>, out: &mut [f32], #[comptime] strided: bool) {
        let i = ABSOLUTE_POS;
        if i < out.len() {
            let v = read(x, i, strided);
            out[i] = select(at_most_zero(v), 0.0, v);
        }
    }

    /// `out = 0 if y ≤ 0 else grad`.
    #[cube(launch)]
    fn relu_backward_kernel(
        y: &Tensor<f32>,
        grad: &Tensor<f32>,
        out: &mut [f32],
        #[comptime] y_strided: bool,
        #[comptime] grad_strided: bool,
    ) {
        let i = ABSOLUTE_POS;
        if i < out.len() {
            out[i] = select(at_most_zero(read(y, i, y_strided)), 0.0, read(grad, i, grad_strided));
        }
    }

    /// The panics' name for these kernels.
    const OP: &str = "relu";

    impl ReluBackend for CubeBackend {
        fn single_relu(x: CubeTensor) -> CubeTensor {
            let x = f32_strided(x, OP);
            let out = empty_like(&x);
            let client = x.client.clone();
            let (cubes, dim) = elementwise(&client, x.meta.num_elements());
            let strided = !x.is_contiguous();
            relu_kernel::launch(
                &client,
                cubes,
                dim,
                x.into_tensor_arg(),
                out.clone().into_buffer_arg(),
                strided,
            );
            out
        }

        fn single_relu_backward(y: CubeTensor, grad: CubeTensor) -> CubeTensor {
            let (y, grad) = (f32_strided(y, OP), f32_strided(grad, OP));
            assert_eq!(y.meta.shape(), grad.meta.shape(), "{OP}: output and gradient shapes");
            let out = empty_like(&grad);
            let client = grad.client.clone();
            let (cubes, dim) = elementwise(&client, grad.meta.num_elements());
            let (y_strided, grad_strided) = (!y.is_contiguous(), !grad.is_contiguous());
            relu_backward_kernel::launch(
                &client,
                cubes,
                dim,
                y.into_tensor_arg(),
                grad.into_tensor_arg(),
                out.clone().into_buffer_arg(),
                y_strided,
                grad_strided,
            );
            out
        }
    }
}
