//! A tensor used by several operations, whose gradients are added in one launch.
//!
//! Under Burn's autodiff, a tensor that `k` operations read receives `k` gradients, added one
//! at a time as they arrive: `k − 1` launches on a GPU. [`fan_out`] gives the `k` uses as
//! outputs of one step: each keeps its gradient, and the tensor's gradient is their sum in one
//! launch (in the uses' order; a use the loss does not reach adds nothing). A wave of the
//! batched cell reads its sources four times (the convolutions, the identity and the two
//! pools).
//!
//! It runs on the CubeCL backends ([`fan_out_available`]); elsewhere the uses are the tensor
//! itself, and Burn adds their gradients.

use burn::tensor::{DType, Device, Tensor};

/// Whether [`fan_out`] sums the uses' gradients in one launch for tensors on `device` with
/// this dtype (f32 on a CubeCL backend).
pub fn fan_out_available(device: &Device, dtype: DType) -> bool {
    crate::support::on_cube(device) && dtype == DType::F32
}

/// `uses` uses of `x` (the same values), whose gradients reach `x` as their sum, added in one
/// launch where [`fan_out_available`] and `x` is tracked (see the module docs).
pub fn fan_out<const D: usize>(x: Tensor<D>, uses: usize) -> Vec<Tensor<D>> {
    if uses < 2 || !x.is_autodiff() || !fan_out_available(&x.device(), x.dtype()) {
        return vec![x; uses];
    }
    #[cfg(feature = "cube")]
    {
        let parts = <burn::backend::Dispatch as FanOutBackend>::fan_out(x.into_dispatch(), uses);
        parts.into_iter().map(Tensor::from_dispatch).collect()
    }
    #[cfg(not(feature = "cube"))]
    unreachable!("fan_out_available is false without the CubeCL backends")
}

/// The fan-out and the sum of its gradients (see the module docs); CubeCL only.
#[cfg(feature = "cube")]
#[burn::backend::backend_extension(Cube, Autodiff)]
pub trait FanOutBackend: burn::backend::Backend {
    /// `uses` uses of `x`, under autodiff one step each whose gradients reach `x` summed.
    fn fan_out(
        x: burn::backend::tensor::FloatTensor<Self>,
        uses: usize,
    ) -> Vec<burn::backend::tensor::FloatTensor<Self>>;

    /// `((g₀ + g₁) + g₂) + …` over the first `count` (2 to [`ARITY`](crate::cat::ARITY))
    /// tensors, of one shape (contiguous out). The slots past `count` are not read.
    #[allow(clippy::too_many_arguments, reason = "a backend extension's tensors are arguments")]
    fn sum_parts(
        g0: burn::backend::tensor::FloatTensor<Self>,
        g1: burn::backend::tensor::FloatTensor<Self>,
        g2: burn::backend::tensor::FloatTensor<Self>,
        g3: burn::backend::tensor::FloatTensor<Self>,
        g4: burn::backend::tensor::FloatTensor<Self>,
        g5: burn::backend::tensor::FloatTensor<Self>,
        g6: burn::backend::tensor::FloatTensor<Self>,
        g7: burn::backend::tensor::FloatTensor<Self>,
        count: usize,
    ) -> burn::backend::tensor::FloatTensor<Self>;
}

#[cfg(feature = "cube")]
mod autodiff;
#[cfg(feature = "cube")]
mod cube;
