//! The ReLU kernels for the CubeCL backends, forward and gradient.

use burn_cubecl::CubeBackend;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::ReluBackend;
use crate::support::cube::{at_most_zero, elementwise, empty_like, f32_strided, read};

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
