//! 1×1 convolutions (`groups = 1`, no padding) as batched matrix products on flex.
//!
//! A separable candidate holds two 1×1 convolutions per stage and FactorizedReduce two strided
//! ones. Burn's flex convolution runs them through its general path, and their input gradient
//! through a transposed convolution. As matrix products the three passes are plain GEMMs:
//!
//! - forward: `y[n] = W · x[n]`, with `W` `[C_out, C_in]` and `x[n]` `[C_in, H·W]`;
//! - input gradient: `∂x[n] = Wᵀ · ∂y[n]`;
//! - weight gradient: `∂W = Σ_n ∂y[n] · x[n]ᵀ`, summed over the batch in a fixed order by
//!   Burn's autodiff of the broadcast product.
//!
//! A stride `s` takes every `s`-th row and column first (a 1×1 window sees nothing else). Only
//! the summation order differs from Burn's convolution (`tests/pointwise_conv.rs` holds the two
//! together). Other convolutions, backends and dtypes go to [`crate::direct_conv::conv2d`] (the
//! CubeCL backends' kernels, else Burn's `conv2d`; [`conv2d`] decides).

use burn::tensor::ops::ConvOptions;
use burn::tensor::{Tensor, s};

/// Whether `options` and `weight` `[C_out, C_in / groups, kh, kw]` make a convolution this
/// module computes as a matrix product.
pub fn is_pointwise(weight: &Tensor<4>, options: &ConvOptions<2>) -> bool {
    let [_, _, kh, kw] = weight.dims();
    kh == 1
        && kw == 1
        && options.groups == 1
        && options.padding_begin() == [0, 0]
        && options.padding_end() == [0, 0]
}

/// Burn's `conv2d` without bias, except that a 1×1 convolution ([`is_pointwise`]) on flex f32
/// is a batched matrix product, and any convolution on a CubeCL backend runs
/// [`crate::direct_conv`]'s kernels.
pub fn conv2d(x: Tensor<4>, weight: Tensor<4>, options: ConvOptions<2>) -> Tensor<4> {
    if !is_pointwise(&weight, &options) || !crate::support::on_flex_f32(&x.device(), x.dtype()) {
        return crate::direct_conv::conv2d(x, weight, options);
    }
    let [sh, sw] = options.stride;
    let x =
        if sh == 1 && sw == 1 { x } else { x.slice(s![.., .., 0..;sh as isize, 0..;sw as isize]) };
    let [n, ci, h, w] = x.dims();
    let co = weight.dims()[0];
    let y = weight.reshape([1, co, ci]).matmul(x.reshape([n, ci, h * w]));
    y.reshape([n, co, h, w])
}
