//! Depthwise convolution (`groups = c_in = c_out`, one filter per channel) with its own forward
//! and backward kernels on flex.
//!
//! The separable and dilated candidate ops run one or two depthwise convolutions each, so a
//! DARTS supernet holds hundreds of them. Burn's generic backward treats a grouped convolution
//! as `groups` separate convolutions: the weight gradient is a loop of one `conv2d` and one
//! `slice_assign` per channel, and the input gradient is a transposed convolution made of one
//! rank-1 GEMM and one scatter per (image, channel). Here each (image, channel) plane is one
//! task of the rayon pool, and every kernel is a few loops over contiguous rows:
//!
//! - forward: `y[o] = Σ_t w[t] · x[o·s + t·d − p]` over the taps `t` (per axis);
//! - input gradient: the transpose, `∂x[o·s + t·d − p] += w[t] · ∂y[o]`;
//! - weight gradient: `∂w[t] = Σ_{n, o} ∂y[n, o] · x[n, o·s + t·d − p]`, one partial per plane,
//!   summed over the batch in a fixed order, so the result does not depend on thread timing.
//!
//! When both gradients are wanted (training), one kernel computes both per plane, reading and
//! laying out each plane of `∂y` once. A strided convolution runs its forward and input
//! gradient on the padded plane split into its stride phases (`Phases`), computing only the
//! outputs the stride keeps instead of the stride-1 output; the results are bitwise those of
//! the stride-1 layout (`Phases`' docs say why, and a unit test holds the two together).
//!
//! Only the summation order differs from Burn's convolution (`tests/depthwise_conv.rs` holds the two
//! together). Other convolutions go to [`crate::pointwise_conv::conv2d`] (a 1×1 convolution is a
//! matrix product there on flex; on the CubeCL backends every convolution runs
//! [`crate::direct_conv`]'s kernels; anything else Burn's `conv2d`), as do other backends and
//! dtypes ([`conv2d`] decides).

use burn::backend::AutodiffBackend;
use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::{Backend, backend_extension, tensor::FloatTensor};
use burn::tensor::ops::ConvOptions;
use burn::tensor::{DType, Device, Tensor};

use crate::plane::Flat;
pub use crate::plane::PlaneGeom;
use crate::support::lanes::{correlate, dots};

/// The depthwise convolution primitive: `x` `[N, C, H, W]`, `weight` `[C, 1, kh, kw]`.
#[backend_extension(Flex: cfg(feature = "flex"), Autodiff)]
pub trait DepthwiseBackend: Backend {
    /// The convolution, `[N, C, H', W']`.
    fn depthwise_conv2d(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        geom: PlaneGeom,
    ) -> FloatTensor<Self>;

    /// The gradient of the input from the output's, `[N, C, H, W]`.
    fn depthwise_conv2d_x_backward(
        grad: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        geom: PlaneGeom,
    ) -> FloatTensor<Self>;

    /// The gradient of the weight from the input and the output's gradient, `[C, 1, kh, kw]`.
    fn depthwise_conv2d_weight_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        geom: PlaneGeom,
    ) -> FloatTensor<Self>;

    /// Both gradients at once, `(input's, weight's)`: bitwise the two functions above, with
    /// each plane of the output's gradient read (and laid out flat) once for both.
    fn depthwise_conv2d_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        geom: PlaneGeom,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);
}

/// Whether [`conv2d`] runs this module's kernels for tensors on `device` with this dtype.
pub fn depthwise_available(device: &Device, dtype: DType) -> bool {
    crate::support::on_flex_f32(device, dtype)
}

/// Burn's `conv2d` without bias, except that a depthwise convolution (`groups` = input channels
/// = output channels) runs this module's kernels where [`depthwise_available`], and a 1×1 one
/// is a matrix product ([`crate::pointwise_conv::conv2d`]).
pub fn conv2d(x: Tensor<4>, weight: Tensor<4>, options: ConvOptions<2>) -> Tensor<4> {
    let [_, c, h, w] = x.dims();
    let [co, ci_g, kh, kw] = weight.dims();
    let depthwise = options.groups == c && co == c && ci_g == 1 && c > 1;
    if !depthwise || !depthwise_available(&x.device(), x.dtype()) {
        return crate::pointwise_conv::conv2d(x, weight, options);
    }
    let geom = PlaneGeom {
        input: [h, w],
        kernel: [kh, kw],
        stride: options.stride,
        padding: options.padding_begin(),
        dilation: options.dilation,
    };
    let out = <burn::backend::Dispatch as DepthwiseBackend>::depthwise_conv2d(
        x.into_dispatch(),
        weight.into_dispatch(),
        geom,
    );
    Tensor::from_dispatch(out)
}

mod autodiff;
mod cpu;
#[cfg(feature = "flex")]
mod flex;
#[cfg(test)]
mod tests;
