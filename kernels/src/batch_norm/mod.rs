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

/// What a training BatchNorm without affine parameters computes from its batch before it
/// normalizes: see [`fold`].
#[derive(Debug, Clone)]
pub struct Folded {
    /// [`statistics`] of the batch, `[2, C]`.
    pub statistics: Tensor<2>,
    /// [`rstd`] of them, `[C]`.
    pub weight: Tensor<1>,
    /// [`shift`] of them and the weight, `[C]`.
    pub shift: Tensor<1>,
    /// The running mean after [`running`]'s update, `[C]`.
    pub mean: Tensor<1>,
    /// The running (unbiased) variance after the update, `[C]`.
    pub var: Tensor<1>,
}

/// [`statistics`] of `x` `[N, C, H, W]`, [`rstd`] and [`shift`] of them and [`running`]'s
/// update of the running `mean` and `var` `[C]`, none differentiated (`x` is read detached;
/// [`normalize`] differentiates `x` through the statistics): on the CubeCL backends one launch
/// where these are four, by the same arithmetic, so the same values bit for bit
/// (`tests/batch_norm.rs`); elsewhere those four functions.
pub fn fold(x: Tensor<4>, mean: Tensor<1>, var: Tensor<1>, epsilon: f64, momentum: f64) -> Folded {
    let [n, _, h, w] = x.dims();
    let count = n * h * w;
    let x = x.detach();
    #[cfg(feature = "cube")]
    if fold_available(&x.device(), x.dtype()) {
        let (f0, f1) = (mean.clone(), var.clone());
        return cube_fold(x, [mean, var], [f0, f1], 0, epsilon, momentum, false);
    }
    let m = statistics(x);
    let weight = rstd(m.clone(), epsilon);
    let shift = shift(m.clone(), weight.clone());
    let (mean, var) = running(mean, var, m.clone(), momentum, count);
    Folded { statistics: m, weight, shift, mean, var }
}

/// Whether [`fold_rounded`] runs for `x` and the bias unit's `factors`: where
/// [`fold_available`], with one or two f32 factors, each `[L]` for `L` dividing `C` (value `i`
/// for channels `i·C/L ..(i + 1)·C/L`: `[1]` for every channel, `[C]` one each), on `x`'s device.
pub fn fold_rounded_available(x: &Tensor<4>, factors: &[Tensor<1>]) -> bool {
    let c = x.dims()[1];
    fold_available(&x.device(), x.dtype())
        && (1..=2).contains(&factors.len())
        && factors.iter().all(|f| {
            f.dtype() == DType::F32
                && f.dims()[0] > 0
                && c.is_multiple_of(f.dims()[0])
                && f.device() == x.device()
        })
}

/// [`fold`] with its shift rounded as an int32 bias on an accumulator whose unit is the
/// product of `factors` and the folded weight, in the same launch: the shift is
/// `bias::int32_rounded(shift, factors ++ [weight], ties_away)` bit for bit, one launch
/// where that is two.
///
/// # Panics
/// Where [`fold_rounded_available`] is false.
pub fn fold_rounded(
    x: Tensor<4>,
    mean: Tensor<1>,
    var: Tensor<1>,
    epsilon: f64,
    momentum: f64,
    factors: &[Tensor<1>],
    ties_away: bool,
) -> Folded {
    assert!(
        fold_rounded_available(&x, factors),
        "fold_rounded: not available for {:?} with {} factors",
        x.device(),
        factors.len()
    );
    #[cfg(feature = "cube")]
    {
        let autodiff = x.is_autodiff();
        // The factors as the same kind of tensor as `x` (the extension dispatches on it).
        let f = |k: usize| {
            let f = factors.get(k).unwrap_or(&factors[0]).clone().detach().inner();
            if autodiff { f.autodiff() } else { f }
        };
        let count = factors.len() as u32;
        cube_fold(x.detach(), [mean, var], [f(0), f(1)], count, epsilon, momentum, ties_away)
    }
    #[cfg(not(feature = "cube"))]
    unreachable!(
        "fold_available is false without the CubeCL backends ({mean:?}, {var:?}, {epsilon}, \
         {momentum}, {ties_away})"
    )
}

/// [`fold`] of `x` (with `rounded`, [`fold_rounded`] with those factors and rounding) and
/// [`normalize`] of `x` on what it returns, in one launch forward on the CubeCL backends
/// instead of two: the same values, running statistics and gradient.
///
/// # Panics
/// Where [`fold_available`] is false for `x`, or with `rounded` where
/// [`fold_rounded_available`] is.
pub fn fold_normalize(
    x: Tensor<4>,
    [mean, var]: [Tensor<1>; 2],
    epsilon: f64,
    momentum: f64,
    rounded: Option<(&[Tensor<1>], bool)>,
) -> (Folded, Tensor<4>) {
    assert!(fold_available(&x.device(), x.dtype()), "fold_normalize: not on {:?}", x.device());
    if let Some((factors, _)) = rounded {
        assert!(fold_rounded_available(&x, factors), "fold_normalize: {} factors", factors.len());
    }
    #[cfg(feature = "cube")]
    {
        let [n, _, h, wd] = x.dims();
        let autodiff = x.is_autodiff();
        let (factors, ties_away) = rounded.unwrap_or((&[], false));
        // The factors as the same kind of tensor as `x` (the extension dispatches on it); the
        // running statistics stand in for them (not read) without a rounding.
        let f = |k: usize| match factors.get(k).or(factors.first()) {
            Some(f) => {
                let f = f.clone().detach().inner();
                if autodiff { f.autodiff() } else { f }
            }
            None => [&mean, &var][k].clone().detach(),
        };
        let (f0, f1) = (f(0), f(1));
        let (m, w, b, mean, var, y) =
            <burn::backend::Dispatch as FoldBackend>::channel_fold_normalize(
                x.into_dispatch(),
                mean.detach().into_dispatch(),
                var.detach().into_dispatch(),
                f0.into_dispatch(),
                f1.into_dispatch(),
                factors.len() as u32,
                epsilon as f32,
                momentum as f32,
                unbias(n * h * wd) as f32,
                ties_away,
            );
        let [weight, shift, mean, var] = [w, b, mean, var].map(Tensor::from_dispatch);
        let statistics = Tensor::from_dispatch(m);
        (Folded { statistics, weight, shift, mean, var }, Tensor::from_dispatch(y))
    }
    #[cfg(not(feature = "cube"))]
    unreachable!(
        "fold_available is false without the CubeCL backends: {mean:?} {var:?} {epsilon} {momentum}"
    )
}

/// The one launch of [`fold`] and [`fold_rounded`] (`factors` 0: the shift unrounded).
#[cfg(feature = "cube")]
fn cube_fold(
    x: Tensor<4>,
    [mean, var]: [Tensor<1>; 2],
    [f0, f1]: [Tensor<1>; 2],
    factors: u32,
    epsilon: f64,
    momentum: f64,
    ties_away: bool,
) -> Folded {
    let [n, _, h, w] = x.dims();
    let (m, w, b, mean, var) = <burn::backend::Dispatch as FoldBackend>::channel_fold(
        x.into_dispatch(),
        mean.detach().into_dispatch(),
        var.detach().into_dispatch(),
        f0.into_dispatch(),
        f1.into_dispatch(),
        factors,
        epsilon as f32,
        momentum as f32,
        unbias(n * h * w) as f32,
        ties_away,
    );
    let [weight, shift, mean, var] = [w, b, mean, var].map(Tensor::from_dispatch);
    Folded { statistics: Tensor::from_dispatch(m), weight, shift, mean, var }
}

/// The per-channel folding of a BatchNorm's statistics (see [`fold_available`]); CubeCL only.
#[cfg(feature = "cube")]
#[backend_extension(Cube, Autodiff)]
pub trait FoldBackend: Backend {
    /// The statistics `m` `[2, C]` of `x` `[N, C, H, W]`, `w` and `b` `[C]` folded from them
    /// and the running mean and variance `[C]` after one update, in one launch (see [`fold`]);
    /// not differentiated; with `factors` 1 or 2, `b` rounded as an int32 bias whose unit is
    /// the product of the first `factors` of `f0`, `f1` and `w` (see [`fold_rounded`]). (Five
    /// tensors spelled out: the extension macro reads the tuple.)
    #[allow(clippy::type_complexity, clippy::too_many_arguments)]
    fn channel_fold(
        x: FloatTensor<Self>,
        mean: FloatTensor<Self>,
        var: FloatTensor<Self>,
        f0: FloatTensor<Self>,
        f1: FloatTensor<Self>,
        factors: u32,
        epsilon: f32,
        momentum: f32,
        unbias: f32,
        ties_away: bool,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
    );

    /// [`channel_fold`](FoldBackend::channel_fold)'s five outputs and `y = x·w + b`, in the
    /// same launch: [`channel_normalize`](FoldBackend::channel_normalize) of `x` on what the
    /// fold returns, differentiated as it is (see [`fold_normalize`]).
    #[allow(clippy::type_complexity, clippy::too_many_arguments)]
    fn channel_fold_normalize(
        x: FloatTensor<Self>,
        mean: FloatTensor<Self>,
        var: FloatTensor<Self>,
        f0: FloatTensor<Self>,
        f1: FloatTensor<Self>,
        factors: u32,
        epsilon: f32,
        momentum: f32,
        unbias: f32,
        ties_away: bool,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
    );

    /// `1/sqrt(σ² + ε)` from `m` `[2, C]`: `[C]`.
    fn channel_rstd(m: FloatTensor<Self>, epsilon: f32) -> FloatTensor<Self>;

    /// `∂m` `[2, C]` (`[0, −½·w³·∂w]`) from `m` and `∂w` `[C]`.
    fn channel_rstd_backward(
        m: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        epsilon: f32,
    ) -> FloatTensor<Self>;

    /// `−μ·w` from `m` `[2, C]` and `w` `[C]`: `[C]`.
    fn channel_shift(m: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self>;

    /// `(∂m, ∂w)`: `[−w·∂b, 0]` `[2, C]` and `−μ·∂b` `[C]`.
    fn channel_shift_backward(
        m: FloatTensor<Self>,
        w: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// `x·w_c + b_c` where `m` are the batch statistics of `x` itself, `w = 1/sqrt(σ² + ε)` and
    /// `b = −μ·w` plus a constant, all folded from `m` (see [`normalize`]): differentiated to
    /// `x` alone, through `m` as well.
    fn channel_normalize(
        x: FloatTensor<Self>,
        m: FloatTensor<Self>,
        w: FloatTensor<Self>,
        b: FloatTensor<Self>,
    ) -> FloatTensor<Self>;

    /// `∂x` of [`channel_normalize`](FoldBackend::channel_normalize) from `x`, `m`, `w` and `∂y`.
    fn channel_normalize_backward(
        x: FloatTensor<Self>,
        m: FloatTensor<Self>,
        w: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> FloatTensor<Self>;

    /// The running statistics `[2, C]` after one update (see [`running`]); `unbias` is
    /// `count/(count − 1)`.
    fn channel_running(
        mean: FloatTensor<Self>,
        var: FloatTensor<Self>,
        m: FloatTensor<Self>,
        momentum: f32,
        unbias: f32,
    ) -> FloatTensor<Self>;
}

/// A training BatchNorm without affine parameters or a quantized multiplier, as one step
/// backward: `x·w_c + b_c` for `x` `[N, C, H, W]`, where `m` `[2, C]` is [`statistics`] of `x`
/// itself, `w = rstd(m, ε)` and `b = shift(m, w)` plus a constant (an int32 bias's rounding),
/// each computed by this module's functions from `m` not differentiated. The gradient reaches
/// `x` through `m` as well: the same value, operation for operation, as `affine(x, rstd(m),
/// shift(m, rstd(m)))` with `m = statistics(x)` differentiated, in one launch backward
/// (a cube per channel sums `[Σ ∂y·x, Σ ∂y]`, then writes the channel's `∂x`) where that
/// composition takes eight to ten (its five
/// primitives' gradients, three sums of the gradients meeting at `x`, `m` and `w`, and at some
/// channel counts copies of two rows of the sums).
///
/// # Panics
/// Where [`fold_available`] is false for `x`.
pub fn normalize(x: Tensor<4>, m: Tensor<2>, w: Tensor<1>, b: Tensor<1>) -> Tensor<4> {
    assert!(
        fold_available(&x.device(), x.dtype()),
        "normalize: the CubeCL backends only (fold_available), not {:?}",
        x.device()
    );
    #[cfg(feature = "cube")]
    {
        let autodiff = x.is_autodiff();
        let (m, w, b) = (m.detach().inner(), w.detach().inner(), b.detach().inner());
        let (m, w, b) =
            if autodiff { (m.autodiff(), w.autodiff(), b.autodiff()) } else { (m, w, b) };
        Tensor::from_dispatch(<burn::backend::Dispatch as FoldBackend>::channel_normalize(
            x.into_dispatch(),
            m.into_dispatch(),
            w.into_dispatch(),
            b.into_dispatch(),
        ))
    }
    #[cfg(not(feature = "cube"))]
    unreachable!("fold_available is false without the CubeCL backends ({m:?}, {w:?}, {b:?})")
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

#[cfg(feature = "cube")]
mod cube;

mod autodiff;
#[cfg(feature = "flex")]
mod flex;
