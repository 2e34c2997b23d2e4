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
    crate::support::on_cube(device) && dtype == DType::F32
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
mod cube;
#[cfg(feature = "cube")]
mod extension;
