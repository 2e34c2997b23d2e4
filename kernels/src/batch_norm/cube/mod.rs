//! The per-channel primitives on the CubeCL backends (`wgpu`, `cuda`).
//!
//! As tensor expressions a training BatchNorm is dozens of launches forward and backward
//! (transposes, centring, broadcasts and their gradients, each a kernel); on a GPU every launch
//! costs host time. Here each primitive is one launch: the elementwise parts one thread per
//! element, the per-channel sums one cube per channel (32 to 256 threads by the channel's size,
//! each summing a fixed stride of its `N·H·W` values, then a tree in shared memory), so a sum
//! does not depend on thread timing. The kernels read `x` and `∂y` through their strides: a
//! convolution's channels-last output or a channel slice of a concatenation's gradient is read
//! where it lies, not copied first.
//!
//! The per-channel kernels take the channel count as an argument rather than an operand's
//! `len()`: a buffer argument's length is that of its memory handle, which for a view (a
//! gradient sliced out of a larger one) runs past the tensor; on cuda a `[1, 3, 5, 7]`
//! BatchNorm's input gradient came out wrong while they read it from `len()`.

use burn_cubecl::CubeBackend;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::{ChannelBackend, FoldBackend};
use crate::bias::TINY_STEP;
use crate::bias::cube::int32_of;
use crate::support::cube::{
    cube_sum, elementwise, empty_like, empty_shaped, f32_contiguous, f32_strided, reduce_units,
};

/// Buffer offset of element `(n, c, q)` of `[N, C, H, W]` `x`, `q = h·W + w`. In 32 bits: a
/// 64-bit integer division is emulated on GPUs ([`strided`] checks that offsets fit).
#[cube]
fn offset(x: &Tensor<f32>, n: u32, c: u32, q: u32, width: u32) -> usize {
    let s0 = x.stride(0) as u32;
    let s1 = x.stride(1) as u32;
    let s2 = x.stride(2) as u32;
    let s3 = x.stride(3) as u32;
    (n * s0 + c * s1 + (q / width) * s2 + (q % width) * s3) as usize
}

/// Element `i` (in `[N, C, H, W]` order) of `x`, whatever its strides, with its channel.
#[cube]
fn element(x: &Tensor<f32>, i: usize, plane: u32, width: u32, channels: u32) -> f32 {
    let i = i as u32;
    let image_channel = i / plane;
    x[offset(x, image_channel / channels, image_channel % channels, i % plane, width)]
}

/// The channel of element `i` of `[N, C, H, W]` with `plane = H·W`.
#[cube]
fn channel_of(i: usize, plane: u32, channels: u32) -> usize {
    ((i as u32 / plane) % channels) as usize
}

/// The mean and biased variance of channel `ch` of `x`, summed by the cube: the mean first,
/// then the centred squares about it (a one-pass `E[x²] − E[x]²` would lose the variance of
/// offset data).
#[cube]
fn channel_moments(
    x: &Tensor<f32>,
    shared: &mut Shared<[f32]>,
    ch: u32,
    images: u32,
    plane: u32,
    width: u32,
) -> (f32, f32) {
    let count = images * plane;
    let mut sum = 0.0f32;
    let mut j = UNIT_POS_X;
    while j < count {
        sum += x[offset(x, j / plane, ch, j % plane, width)];
        j += CUBE_DIM_X;
    }
    let mean = cube_sum(shared, sum) / count as f32;
    let mut squares = 0.0f32;
    let mut j = UNIT_POS_X;
    while j < count {
        let d = x[offset(x, j / plane, ch, j % plane, width)] - mean;
        squares += d * d;
        j += CUBE_DIM_X;
    }
    (mean, cube_sum(shared, squares) / count as f32)
}

/// `out = [mean, biased variance]` `[2, C]`, one cube per channel.
#[cube(launch)]
fn moments_kernel(
    x: &Tensor<f32>,
    out: &mut [f32],
    images: u32,
    plane: u32,
    width: u32,
    #[comptime] units: usize,
) {
    let mut shared = Shared::<[f32]>::new_slice(units);
    let ch = CUBE_POS_X;
    let (mean, var) = channel_moments(x, &mut shared, ch, images, plane, width);
    if UNIT_POS_X == 0 {
        out[ch as usize] = mean;
        out[(CUBE_COUNT_X + ch) as usize] = var;
    }
}

/// [`moments_kernel`] with, per channel, what [`rstd_kernel`], [`shift_kernel`] and
/// [`running_kernel`] compute from the moments, by the same functions: `m = [μ, σ²]`,
/// `w = 1/sqrt(σ² + ε)`, `b = −μ·w` and the running statistics `mean'` and `var'` (each its
/// own buffer: rows of one `[2, C]` would take a slicing launch each to separate). With
/// `factors` > 0 the shift is rounded as an int32 bias whose unit is `f₀·f₁·w` (the first
/// `factors` of `f₀`, `f₁`, each `[L]` read at `ch / run` for its run of `C/L` channels, then
/// `w`), as `bias::int32_rounded` rounds it. With `normalize`, the cube then writes its
/// channel of `y = x·w + b` (contiguous), as [`scale_shift_kernel`] would.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn moments_fold_kernel(
    x: &Tensor<f32>,
    mean: &[f32],
    var: &[f32],
    f0: &[f32],
    f1: &[f32],
    m: &mut [f32],
    w: &mut [f32],
    b: &mut [f32],
    running_mean: &mut [f32],
    running_var: &mut [f32],
    y: &mut [f32],
    images: u32,
    plane: u32,
    width: u32,
    epsilon: f32,
    momentum: f32,
    unbias: f32,
    run0: u32,
    run1: u32,
    tiny: f32,
    #[comptime] units: usize,
    #[comptime] factors: u32,
    #[comptime] ties_away: bool,
    #[comptime] normalize: bool,
) {
    let mut shared = Shared::<[f32]>::new_slice(units);
    let ch = CUBE_POS_X;
    let (mu, sigma2) = channel_moments(x, &mut shared, ch, images, plane, width);
    // Every unit folds (the same operations on the same values), so none waits for another.
    let (c, channels) = (ch as usize, CUBE_COUNT_X as usize);
    let wc = rstd_of(sigma2, epsilon);
    let mut bc = shift_of(mu, wc);
    if factors > 0 {
        let mut unit = f0[(ch / run0) as usize];
        if factors > 1 {
            unit *= f1[(ch / run1) as usize];
        }
        unit *= wc;
        bc = bc + (int32_of(bc, unit, tiny, ties_away) - bc);
    }
    if UNIT_POS_X == 0 {
        m[c] = mu;
        m[channels + c] = sigma2;
        w[c] = wc;
        b[c] = bc;
        running_mean[c] = running_mean_of(mean[c], mu, momentum);
        running_var[c] = running_var_of(var[c], sigma2, momentum, unbias);
    }
    if normalize {
        // `x·w_c + b_c` over the channel, as `scale_shift_kernel` computes it.
        let mut j = UNIT_POS_X;
        while j < images * plane {
            let (n, q) = (j / plane, j % plane);
            let v = x[offset(x, n, ch, q, width)] * wc;
            y[((n * CUBE_COUNT_X + ch) * plane + q) as usize] = v + bc;
            j += CUBE_DIM_X;
        }
    }
}

/// `out = [Σ ∂y·x, Σ ∂y]` `[2, C]`, one cube per channel.
#[cube(launch)]
fn affine_wb_kernel(
    x: &Tensor<f32>,
    grad: &Tensor<f32>,
    out: &mut [f32],
    images: u32,
    plane: u32,
    width: u32,
    #[comptime] units: usize,
) {
    let mut shared = Shared::<[f32]>::new_slice(units);
    let ch = CUBE_POS_X;
    let count = images * plane;
    let mut dw = 0.0f32;
    let mut db = 0.0f32;
    let mut j = UNIT_POS_X;
    while j < count {
        let (n, q) = (j / plane, j % plane);
        let g = grad[offset(grad, n, ch, q, width)];
        dw += g * x[offset(x, n, ch, q, width)];
        db += g;
        j += CUBE_DIM_X;
    }
    let dw = cube_sum(&mut shared, dw);
    let db = cube_sum(&mut shared, db);
    if UNIT_POS_X == 0 {
        out[ch as usize] = dw;
        out[(CUBE_COUNT_X + ch) as usize] = db;
    }
}

/// `out = x·w_c (+ b_c)`, `out` contiguous.
#[cube(launch)]
fn scale_shift_kernel(
    x: &Tensor<f32>,
    w: &[f32],
    b: &[f32],
    out: &mut [f32],
    plane: u32,
    width: u32,
    channels: u32,
    #[comptime] shift: bool,
) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        let c = channel_of(i, plane, channels);
        let v = element(x, i, plane, width, channels) * w[c];
        if shift {
            out[i] = v + b[c];
        } else {
            out[i] = v;
        }
    }
}

/// `∂x = a_c + b_c·(x − μ_c)` with `a = ∂μ/M`, `b = 2∂σ²/M` (the flex kernel's order).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn moments_backward_kernel(
    x: &Tensor<f32>,
    moments: &[f32],
    grad: &[f32],
    out: &mut [f32],
    plane: u32,
    width: u32,
    channels: u32,
    count: f32,
) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        let c = channel_of(i, plane, channels);
        let a = grad[c] / count;
        let b = 2.0 * grad[channels as usize + c] / count;
        out[i] = a + b * (element(x, i, plane, width, channels) - moments[c]);
    }
}

/// A training BatchNorm's `∂x`, the composition of the affine map's, the shift's, the
/// reciprocal deviation's and the moments' gradients operation for operation:
/// `∂x = ∂y·w + (a + b·(x − μ))` with `a = −(w·S₁)/M`, `b = 2·(−½·(S₂ − μ·S₁)·w³)/M`, where
/// `[S₂, S₁] = [Σ ∂y·x, Σ ∂y]` and `w` is the reciprocal deviation the forward used. One cube
/// per channel: the sums as [`affine_wb_kernel`] sums them (the same strides, the same tree),
/// then the channel's `∂x` (contiguous), in one launch.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn normalize_backward_kernel(
    x: &Tensor<f32>,
    grad: &Tensor<f32>,
    m: &[f32],
    w: &[f32],
    out: &mut [f32],
    images: u32,
    plane: u32,
    width: u32,
    count: f32,
    #[comptime] units: usize,
) {
    let mut shared = Shared::<[f32]>::new_slice(units);
    let ch = CUBE_POS_X;
    let elements = images * plane;
    let mut dw = 0.0f32;
    let mut db = 0.0f32;
    let mut j = UNIT_POS_X;
    while j < elements {
        let (n, q) = (j / plane, j % plane);
        let g = grad[offset(grad, n, ch, q, width)];
        dw += g * x[offset(x, n, ch, q, width)];
        db += g;
        j += CUBE_DIM_X;
    }
    let s2 = cube_sum(&mut shared, dw);
    let s1 = cube_sum(&mut shared, db);
    let c = ch as usize;
    let (wc, mean) = (w[c], m[c]);
    let d_mean = -(wc * s1);
    let dw = s2 + -(mean * s1);
    let d_var = -0.5f32 * dw * wc * wc * wc;
    let a = d_mean / count;
    let b = 2.0f32 * d_var / count;
    let channels = CUBE_COUNT_X;
    let mut j = UNIT_POS_X;
    while j < elements {
        let (n, q) = (j / plane, j % plane);
        let through_moments = a + b * (x[offset(x, n, ch, q, width)] - mean);
        let at = ((n * channels + ch) * plane + q) as usize;
        out[at] = grad[offset(grad, n, ch, q, width)] * wc + through_moments;
        j += CUBE_DIM_X;
    }
}

/// `1/sqrt(σ² + ε)`.
#[cube]
fn rstd_of(sigma2: f32, epsilon: f32) -> f32 {
    1.0f32 / f32::sqrt(sigma2 + epsilon)
}

/// `−μ·w`.
#[cube]
fn shift_of(mu: f32, w: f32) -> f32 {
    -(mu * w)
}

/// `(1 − k)·mean + k·μ` with `k` the momentum.
#[cube]
fn running_mean_of(mean: f32, mu: f32, momentum: f32) -> f32 {
    let keep = 1.0f32 - momentum;
    mean * keep + mu * momentum
}

/// `(1 − k)·var + k·σ²·unbias` with `k` the momentum.
#[cube]
fn running_var_of(var: f32, sigma2: f32, momentum: f32, unbias: f32) -> f32 {
    let keep = 1.0f32 - momentum;
    var * keep + sigma2 * unbias * momentum
}

/// `out_c = 1/sqrt(σ²_c + ε)` from `m = [μ, σ²]`.
#[cube(launch)]
fn rstd_kernel(m: &[f32], out: &mut [f32], epsilon: f32, channels: u32) {
    let c = ABSOLUTE_POS;
    if c < channels as usize {
        out[c] = rstd_of(m[channels as usize + c], epsilon);
    }
}

/// `out = [0, −½·w³·∂w]` with `w = 1/sqrt(σ² + ε)`.
#[cube(launch)]
fn rstd_backward_kernel(m: &[f32], grad: &[f32], out: &mut [f32], epsilon: f32, channels: u32) {
    let c = ABSOLUTE_POS;
    let channels = channels as usize;
    if c < channels {
        let w = rstd_of(m[channels + c], epsilon);
        out[c] = 0.0f32;
        out[channels + c] = -0.5f32 * grad[c] * w * w * w;
    }
}

/// `out_c = −μ_c·w_c`.
#[cube(launch)]
fn shift_kernel(m: &[f32], w: &[f32], out: &mut [f32], channels: u32) {
    let c = ABSOLUTE_POS;
    if c < channels as usize {
        out[c] = shift_of(m[c], w[c]);
    }
}

/// `dm = [−w·∂b, 0]`, `dw = −μ·∂b`.
#[cube(launch)]
fn shift_backward_kernel(
    m: &[f32],
    w: &[f32],
    grad: &[f32],
    dm: &mut [f32],
    dw: &mut [f32],
    channels: u32,
) {
    let c = ABSOLUTE_POS;
    let channels = channels as usize;
    if c < channels {
        let g = grad[c];
        dm[c] = -(w[c] * g);
        dm[channels + c] = 0.0f32;
        dw[c] = -(m[c] * g);
    }
}

/// `out = [(1 − k)·mean + k·μ, (1 − k)·var + k·σ²·unbias]` with `k` the momentum.
#[cube(launch)]
fn running_kernel(
    mean: &[f32],
    var: &[f32],
    m: &[f32],
    out: &mut [f32],
    momentum: f32,
    unbias: f32,
    channels: u32,
) {
    let c = ABSOLUTE_POS;
    let channels = channels as usize;
    if c < channels {
        out[c] = running_mean_of(mean[c], m[c], momentum);
        out[channels + c] = running_var_of(var[c], m[channels + c], momentum, unbias);
    }
}

mod launch;
