//! Per-channel batch statistics and the per-channel affine map: the two halves of a training
//! BatchNorm, each one pass forward and one backward on flex; and, on the CubeCL backends, the
//! folding of the statistics into the affine map's weight and shift.
//!
//! `qdarts_ops::candidates::QBatchNorm` fake-quantizes its folded weight between
//! them, so they stay separate primitives; without that quantizer (and without affine
//! parameters, as a DARTS search has them) the CubeCL backends differentiate the whole of it as
//! one step, [`normalize`]:
//!
//! - [`statistics`]: `[mean, biased variance]` of every channel of `[N, C, H, W]`, as `[2, C]`
//!   ([`moments`]: the two rows). Backward: `∂x = ∂μ/M + ∂σ²·2(x − μ)/M` with `M = N·H·W`.
//! - [`rstd`] `1/sqrt(σ² + ε)`, [`shift`] `−μ·w` and [`running`] (the running-statistics
//!   update), each from the `[2, C]` statistics; [`fold`]: the statistics and these three at
//!   once (one launch on the CubeCL backends), none differentiated, for [`normalize`].
//! - [`affine`]: `y = x·w_c + b_c`. Backward: `∂x = ∂y·w_c`, `∂w_c = Σ ∂y·x`, `∂b_c = Σ ∂y`.
//!
//! As tensor expressions these are a dozen passes over the activation forward and backward
//! (transposed copy, mean, centring, square, broadcasts, and their gradients). On flex, sums run
//! per (image, channel) plane in eight f32 lanes and are combined over the batch in f64 in a
//! fixed order, so the result does not depend on thread timing; flex folds with the tensor
//! expressions (each a pass over `C` values, cheap on a CPU). On the CubeCL backends (`cube`
//! submodule) every primitive is one launch, the folding included: dozens of launches fewer per
//! BatchNorm than the expressions, forward and backward (`docs/results/2026-11-27-launches.md`).
//! LibTorch and other
//! dtypes use the tensor expressions ([`channel_available`], [`fold_available`] decide);
//! `tests/batch_norm.rs` holds the two together on every backend of the build.

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::{AutodiffBackend, TensorMetadata};
use burn::backend::{Backend, backend_extension, tensor::FloatTensor};
use burn::tensor::{DType, Device, Tensor};

use crate::reduce::row_mean;

/// The per-channel primitives (see the module docs).
#[backend_extension(Flex: cfg(feature = "flex"), Cube: cfg(feature = "cube"), Autodiff)]
pub trait ChannelBackend: Backend {
    /// `[mean, biased variance]` per channel of `x` `[N, C, H, W]`: `[2, C]`.
    fn channel_moments(x: FloatTensor<Self>) -> FloatTensor<Self>;

    /// `∂x` from `x`, its moments and their gradient `[2, C]`.
    fn channel_moments_backward(
        x: FloatTensor<Self>,
        moments: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> FloatTensor<Self>;

    /// `x·w_c + b_c` with `w`, `b` `[C]`.
    fn channel_affine(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        b: FloatTensor<Self>,
    ) -> FloatTensor<Self>;

    /// `∂x = ∂y·w_c`.
    fn channel_affine_x_backward(
        grad: FloatTensor<Self>,
        w: FloatTensor<Self>,
    ) -> FloatTensor<Self>;

    /// `[Σ ∂y·x, Σ ∂y]` per channel: `[2, C]`.
    fn channel_affine_wb_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> FloatTensor<Self>;
}

/// Whether [`moments`] and [`affine`] run this module's kernels for tensors on `device` with
/// this dtype.
pub fn channel_available(device: &Device, dtype: DType) -> bool {
    crate::support::on_flex_f32(device, dtype)
        || (crate::support::on_cube(device) && dtype == DType::F32)
}

/// `(mean, biased variance)` per channel of `x` `[N, C, H, W]`, each `[C]`.
pub fn moments(x: Tensor<4>) -> (Tensor<1>, Tensor<1>) {
    split(statistics(x))
}

/// `[mean, biased variance]` per channel of `x` `[N, C, H, W]`: `[2, C]`, the form [`rstd`],
/// [`shift`] and [`running`] take.
pub fn statistics(x: Tensor<4>) -> Tensor<2> {
    if channel_available(&x.device(), x.dtype()) {
        Tensor::<2>::from_dispatch(<burn::backend::Dispatch as ChannelBackend>::channel_moments(
            x.into_dispatch(),
        ))
    } else {
        let [n, c, h, w] = x.dims();
        let rows = x.swap_dims(0, 1).reshape([c, n * h * w]);
        let mean = row_mean(rows.clone()).reshape([c, 1]);
        let var = row_mean(rows.sub(mean.clone()).square());
        Tensor::cat(vec![mean.reshape([1, c]), var.reshape([1, c])], 0)
    }
}

/// The rows of `[2, C]` as two `[C]`.
fn split(m: Tensor<2>) -> (Tensor<1>, Tensor<1>) {
    let c = m.dims()[1];
    (m.clone().slice([0..1, 0..c]).reshape([c]), m.slice([1..2, 0..c]).reshape([c]))
}

/// Whether [`rstd`], [`shift`] and [`running`] run this module's kernels for tensors on
/// `device` with this dtype: on the CubeCL backends, where each of their tensor expressions
/// (and each gradient of one) is a launch. Elsewhere they are those expressions.
pub fn fold_available(device: &Device, dtype: DType) -> bool {
    crate::support::on_cube(device) && dtype == DType::F32
}

/// `1/sqrt(σ² + ε)` per channel from the statistics `m` `[2, C]`: `[C]`.
pub fn rstd(m: Tensor<2>, epsilon: f64) -> Tensor<1> {
    #[cfg(feature = "cube")]
    if fold_available(&m.device(), m.dtype()) {
        return Tensor::from_dispatch(<burn::backend::Dispatch as FoldBackend>::channel_rstd(
            m.into_dispatch(),
            epsilon as f32,
        ));
    }
    split(m).1.add_scalar(epsilon).sqrt().recip()
}

/// `−μ·w` per channel from the statistics `m` `[2, C]` and `w` `[C]`: `[C]`.
pub fn shift(m: Tensor<2>, w: Tensor<1>) -> Tensor<1> {
    #[cfg(feature = "cube")]
    if fold_available(&m.device(), m.dtype()) {
        return Tensor::from_dispatch(<burn::backend::Dispatch as FoldBackend>::channel_shift(
            m.into_dispatch(),
            w.into_dispatch(),
        ));
    }
    split(m).0.mul(w).neg()
}

/// PyTorch's running-statistics update from the batch statistics `m` `[2, C]` of `count`
/// values per channel: `(1 − momentum)·mean + momentum·μ` and the same for `var` with the
/// unbiased batch variance `σ²·count/(count − 1)`. Not differentiated (`m` is detached).
pub fn running(
    mean: Tensor<1>,
    var: Tensor<1>,
    m: Tensor<2>,
    momentum: f64,
    count: usize,
) -> (Tensor<1>, Tensor<1>) {
    let unbias = unbias(count);
    let m = m.detach();
    #[cfg(feature = "cube")]
    if fold_available(&m.device(), m.dtype()) {
        return split(Tensor::from_dispatch(
            <burn::backend::Dispatch as FoldBackend>::channel_running(
                mean.detach().into_dispatch(),
                var.detach().into_dispatch(),
                m.into_dispatch(),
                momentum as f32,
                unbias as f32,
            ),
        ));
    }
    let (mu, sigma2) = split(m);
    let keep = 1.0 - momentum;
    (
        mean.detach().mul_scalar(keep).add(mu.mul_scalar(momentum)),
        var.detach().mul_scalar(keep).add(sigma2.mul_scalar(unbias).mul_scalar(momentum)),
    )
}

/// Bessel's correction `count/(count − 1)` of a variance over `count` values (1 for one value).
fn unbias(count: usize) -> f64 {
    let count = count as f64;
    count / (count - 1.0).max(1.0)
}

/// `x·w_c + b_c` for `x` `[N, C, H, W]` and `w`, `b` `[C]`.
pub fn affine(x: Tensor<4>, w: Tensor<1>, b: Tensor<1>) -> Tensor<4> {
    if channel_available(&x.device(), x.dtype()) {
        Tensor::from_dispatch(<burn::backend::Dispatch as ChannelBackend>::channel_affine(
            x.into_dispatch(),
            w.into_dispatch(),
            b.into_dispatch(),
        ))
    } else {
        let c = x.dims()[1];
        x.mul(w.reshape([1, c, 1, 1])).add(b.reshape([1, c, 1, 1]))
    }
}

mod fold;

#[cfg(feature = "cube")]
pub use fold::FoldBackend;
pub use fold::{Folded, fold, fold_normalize, fold_rounded, fold_rounded_available, normalize};

#[cfg(feature = "cube")]
mod cube;

mod autodiff;
#[cfg(feature = "flex")]
mod flex;
