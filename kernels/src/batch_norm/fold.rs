//! The folding of a training BatchNorm's batch statistics into its affine map, and the
//! normalization differentiated as one step (see the module above).

use super::*;

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
