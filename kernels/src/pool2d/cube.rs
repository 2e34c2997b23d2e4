//! The pooling kernels for the CubeCL backends (`wgpu`, `cuda`), over `[N, C, H, W]` as it is:
//! forward one thread per output, backward one thread per input element; inputs read through
//! their strides (a channel slice, a channels-last gradient), outputs contiguous.
//!
//! Each window is visited in row-major order over its taps inside the input (the padding is
//! skipped), sums start from 0 and are divided by the count once: Burn's CubeCL pools' order,
//! so averages are theirs bit for bit. A backward thread visits the outputs whose windows hold
//! its element in row-major order, as Burn's backward kernels do. The max pool's backward
//! recomputes the first maximum of each of those windows (at most `kh·kw` reads each, from
//! cache) rather than keeping an index per output.

use burn_cubecl::CubeBackend;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::{PoolBackend, Rounding};

mod held;

use crate::plane::PlaneGeom;
use crate::support::cube::{
    elementwise, empty_shaped, f32_contiguous, f32_strided, lt, round_ties,
};
pub(crate) use held::max_at;

/// The bits of −∞ (WGSL has no infinity literal).
const NEGATIVE_INFINITY: u32 = 0xff80_0000;

/// Sizes and geometry of a pooling.
#[derive(CubeLaunch, CubeType)]
struct Dims {
    channels: u32,
    in_h: u32,
    in_w: u32,
    out_h: u32,
    out_w: u32,
    stride_h: u32,
    stride_w: u32,
    pad_h: u32,
    pad_w: u32,
}

/// Element `i` of a contiguous `[N, C, A, B]` tensor as `(n, c, a, b)`.
#[cube]
fn coordinates(i: u32, channels: u32, rows: u32, cols: u32) -> (u32, u32, u32, u32) {
    let col = i % cols;
    let t = i / cols;
    let row = t % rows;
    let t = t / rows;
    (t / channels, t % channels, row, col)
}

/// The buffer offset of `t`'s plane `(n, c)`.
#[cube]
fn plane_at(t: &Tensor<f32>, n: u32, c: u32) -> u32 {
    n * t.stride(0) as u32 + c * t.stride(1) as u32
}

/// The buffer offset of `(row, col)` of the plane at `base` of `t`.
#[cube]
fn at(t: &Tensor<f32>, base: u32, row: u32, col: u32) -> usize {
    (base + row * t.stride(2) as u32 + col * t.stride(3) as u32) as usize
}

/// The divisor of output `(oh, ow)`: the taps inside the input, or with `include_pad` inside
/// the padded input.
#[cube]
fn count(
    oh: u32,
    ow: u32,
    d: &Dims,
    #[comptime] kh: u32,
    #[comptime] kw: u32,
    #[comptime] include_pad: bool,
) -> f32 {
    let (r0, c0) = (oh * d.stride_h, ow * d.stride_w);
    let (rows, cols) = if include_pad {
        (
            clamp_max(r0 + kh, d.in_h + 2 * d.pad_h) - r0,
            clamp_max(c0 + kw, d.in_w + 2 * d.pad_w) - c0,
        )
    } else {
        (
            clamp_max(r0 + kh, d.in_h + d.pad_h) - clamp_min(r0, d.pad_h),
            clamp_max(c0 + kw, d.in_w + d.pad_w) - clamp_min(c0, d.pad_w),
        )
    };
    f32::cast_from(rows * cols)
}

/// The outputs whose windows hold padded coordinate `p` along one axis: `[lo, hi)`.
#[cube]
fn covering(p: u32, k: u32, stride: u32, out: u32) -> (u32, u32) {
    let mut lo = 0u32;
    if p + 1 > k {
        lo = (p + stride - k) / stride; // ⌈(p + 1 − k) / stride⌉
    }
    (lo, clamp_max(p / stride + 1, out))
}

#[cube(launch)]
fn max_forward_kernel(
    x: &Tensor<f32>,
    out: &mut [f32],
    d: &Dims,
    #[comptime] kh: u32,
    #[comptime] kw: u32,
) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        let (n, c, oh, ow) = coordinates(i as u32, d.channels, d.out_h, d.out_w);
        let base = plane_at(x, n, c);
        // NaN wins; on a tie the earlier tap stays.
        let mut m = f32::reinterpret(NEGATIVE_INFINITY);
        for a in 0..kh {
            let r = oh * d.stride_h + a;
            if r >= d.pad_h && r < d.in_h + d.pad_h {
                for b in 0..kw {
                    let col = ow * d.stride_w + b;
                    if col >= d.pad_w && col < d.in_w + d.pad_w {
                        let v = x[at(x, base, r - d.pad_h, col - d.pad_w)];
                        m = select(lt(m, v) || f32::is_nan(v), v, m);
                    }
                }
            }
        }
        out[i] = m;
    }
}

/// The tap (row-major index in the window) of the first maximum of output `(oh, ow)`'s window,
/// or `kh·kw` when the window holds a NaN (it passes no gradient).
#[cube]
fn first_max(
    x: &Tensor<f32>,
    base: u32,
    oh: u32,
    ow: u32,
    d: &Dims,
    #[comptime] kh: u32,
    #[comptime] kw: u32,
) -> u32 {
    let mut m = f32::reinterpret(NEGATIVE_INFINITY);
    let mut tap = 0u32;
    let mut found = false;
    let mut nan = false;
    for a in 0..kh {
        let r = oh * d.stride_h + a;
        if r >= d.pad_h && r < d.in_h + d.pad_h {
            for b in 0..kw {
                let col = ow * d.stride_w + b;
                if col >= d.pad_w && col < d.in_w + d.pad_w {
                    let v = x[at(x, base, r - d.pad_h, col - d.pad_w)];
                    nan = nan || f32::is_nan(v);
                    // The first tap inside the input, then every strictly larger one.
                    if !nan && (!found || lt(m, v)) {
                        m = v;
                        tap = a * kw + b;
                        found = true;
                    }
                }
            }
        }
    }
    if nan {
        tap = kh * kw;
    }
    tap
}

/// `dx` of max pooling: each element sums the gradients of the outputs whose first maximum it
/// is.
#[cube(launch)]
fn max_backward_kernel(
    x: &Tensor<f32>,
    grad: &Tensor<f32>,
    dx: &mut [f32],
    d: &Dims,
    #[comptime] kh: u32,
    #[comptime] kw: u32,
) {
    let i = ABSOLUTE_POS;
    if i < dx.len() {
        let (n, c, ih, iw) = coordinates(i as u32, d.channels, d.in_h, d.in_w);
        let (xb, gb) = (plane_at(x, n, c), plane_at(grad, n, c));
        let (ph, pw) = (ih + d.pad_h, iw + d.pad_w);
        let (oh_lo, oh_hi) = covering(ph, kh, d.stride_h, d.out_h);
        let (ow_lo, ow_hi) = covering(pw, kw, d.stride_w, d.out_w);
        let mut acc = 0.0f32;
        for oh in oh_lo..oh_hi {
            for ow in ow_lo..ow_hi {
                let mine = (ph - oh * d.stride_h) * kw + (pw - ow * d.stride_w);
                if first_max(x, xb, oh, ow, d, kh, kw) == mine {
                    acc += grad[at(grad, gb, oh, ow)];
                }
            }
        }
        dx[i] = acc;
    }
}

/// Average pooling; with `rounded`, of `x`'s integers on the grid `(mult, step)` (see
/// [`PoolBackend::pool_avg2d_rounded`]).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn avg_forward_kernel(
    x: &Tensor<f32>,
    mult: &[f32],
    step: &[f32],
    out: &mut [f32],
    d: &Dims,
    one: f32,
    #[comptime] kh: u32,
    #[comptime] kw: u32,
    #[comptime] include_pad: bool,
    #[comptime] rounded: bool,
    #[comptime] per_tensor: bool,
    #[comptime] ties_away: bool,
) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        let (n, c, oh, ow) = coordinates(i as u32, d.channels, d.out_h, d.out_w);
        let base = plane_at(x, n, c);
        let mut ch = 0usize;
        if !per_tensor {
            ch = c as usize;
        }
        let mut sum = 0.0f32;
        let mut ints = 0.0f32;
        for a in 0..kh {
            let r = oh * d.stride_h + a;
            if r >= d.pad_h && r < d.in_h + d.pad_h {
                for b in 0..kw {
                    let col = ow * d.stride_w + b;
                    if col >= d.pad_w && col < d.in_w + d.pad_w {
                        let v = x[at(x, base, r - d.pad_h, col - d.pad_w)];
                        sum += v;
                        if rounded {
                            ints += round_ties(v * mult[ch], ties_away);
                        }
                    }
                }
            }
        }
        let k = count(oh, ow, d, kh, kw, include_pad);
        let avg = sum / k;
        if rounded {
            let qa = round_ties(ints / k, ties_away);
            // The expressions' value: avg + (qa·step − avg). `one` is 1 from the host: with
            // the difference known, Mesa's compiler folds the sum into `qa·step`, which is −0
            // where `qa` is −0 and the sum +0 (and not always the sum's last bit).
            out[i] = avg + (qa * step[ch] - avg) * one;
        } else {
            out[i] = avg;
        }
    }
}

/// `dx` of average pooling: each element sums `grad / count` over the outputs whose windows
/// hold it.
#[cube(launch)]
fn avg_backward_kernel(
    grad: &Tensor<f32>,
    dx: &mut [f32],
    d: &Dims,
    #[comptime] kh: u32,
    #[comptime] kw: u32,
    #[comptime] include_pad: bool,
) {
    let i = ABSOLUTE_POS;
    if i < dx.len() {
        let (n, c, ih, iw) = coordinates(i as u32, d.channels, d.in_h, d.in_w);
        let gb = plane_at(grad, n, c);
        let (ph, pw) = (ih + d.pad_h, iw + d.pad_w);
        let (oh_lo, oh_hi) = covering(ph, kh, d.stride_h, d.out_h);
        let (ow_lo, ow_hi) = covering(pw, kw, d.stride_w, d.out_w);
        let mut acc = 0.0f32;
        for oh in oh_lo..oh_hi {
            for ow in ow_lo..ow_hi {
                acc += grad[at(grad, gb, oh, ow)] / count(oh, ow, d, kh, kw, include_pad);
            }
        }
        dx[i] = acc;
    }
}

/// The panics' name for these kernels.
const OP: &str = "pooling";

/// `[N, C, H', W']` of pooling `x` `[N, C, H, W]`, the launch arguments, and the window.
fn shapes(x: &CubeTensor, g: &PlaneGeom) -> ([usize; 4], [usize; 4], DimsLaunch, (u32, u32)) {
    let [n, c, h, w]: [usize; 4] =
        x.meta.shape().to_vec().try_into().unwrap_or_else(|_| panic!("{OP}: expected 4 dims"));
    // No output where the padded plane is smaller than the window (as on flex).
    let out = |a: usize| {
        (g.input[a] + 2 * g.padding[a]).checked_sub(g.kernel[a]).map_or(0, |v| v / g.stride[a] + 1)
    };
    let (oh, ow) = (out(0), out(1));
    let u = |v: usize| {
        u32::try_from(v).unwrap_or_else(|_| panic!("{OP}: {v} exceeds the kernels' u32 indices"))
    };
    let dims = DimsLaunch::new(
        u(c),
        u(h),
        u(w),
        u(oh),
        u(ow),
        u(g.stride[0]),
        u(g.stride[1]),
        u(g.padding[0]),
        u(g.padding[1]),
    );
    ([n, c, h, w], [n, c, oh, ow], dims, (u(g.kernel[0]), u(g.kernel[1])))
}

/// The forward pass of an average pool, rounded or not.
fn avg_forward(
    x: CubeTensor,
    grid: Option<(CubeTensor, CubeTensor)>,
    g: PlaneGeom,
    r: Rounding,
) -> CubeTensor {
    let x = f32_strided(x, OP);
    let (_, out_dims, dims, (kh, kw)) = shapes(&x, &g);
    let out = empty_shaped(&x, out_dims.to_vec());
    let client = x.client.clone();
    let (cube_count, cube_dim) = elementwise(&client, out.meta.num_elements());
    let rounded = grid.is_some();
    let (mult, step) = match grid {
        Some((m, s)) => (f32_contiguous(m, OP), f32_contiguous(s, OP)),
        // Not read: any buffer does.
        None => (out.clone(), out.clone()),
    };
    let per_tensor = mult.meta.num_elements() == 1;
    avg_forward_kernel::launch(
        &client,
        cube_count,
        cube_dim,
        x.into_tensor_arg(),
        mult.into_buffer_arg(),
        step.into_buffer_arg(),
        out.clone().into_buffer_arg(),
        dims,
        1.0,
        kh,
        kw,
        r.include_pad,
        rounded,
        per_tensor,
        r.ties_away,
    );
    out
}

impl PoolBackend for CubeBackend {
    fn pool_max2d(x: CubeTensor, g: PlaneGeom) -> CubeTensor {
        let x = f32_strided(x, OP);
        let (_, out_dims, dims, (kh, kw)) = shapes(&x, &g);
        let out = empty_shaped(&x, out_dims.to_vec());
        let client = x.client.clone();
        let (cube_count, cube_dim) = elementwise(&client, out.meta.num_elements());
        max_forward_kernel::launch(
            &client,
            cube_count,
            cube_dim,
            x.into_tensor_arg(),
            out.clone().into_buffer_arg(),
            dims,
            kh,
            kw,
        );
        out
    }

    fn pool_max2d_backward(x: CubeTensor, grad: CubeTensor, g: PlaneGeom) -> CubeTensor {
        let (x, grad) = (f32_strided(x, OP), f32_strided(grad, OP));
        let (in_dims, _, dims, (kh, kw)) = shapes(&x, &g);
        let dx = empty_shaped(&x, in_dims.to_vec());
        let client = x.client.clone();
        let (cube_count, cube_dim) = elementwise(&client, dx.meta.num_elements());
        max_backward_kernel::launch(
            &client,
            cube_count,
            cube_dim,
            x.into_tensor_arg(),
            grad.into_tensor_arg(),
            dx.clone().into_buffer_arg(),
            dims,
            kh,
            kw,
        );
        dx
    }

    fn pool_avg2d(x: CubeTensor, g: PlaneGeom, include_pad: bool) -> CubeTensor {
        avg_forward(x, None, g, Rounding { include_pad, ties_away: false })
    }

    fn pool_avg2d_backward(grad: CubeTensor, g: PlaneGeom, include_pad: bool) -> CubeTensor {
        let grad = f32_strided(grad, OP);
        let gd: [usize; 4] = grad
            .meta
            .shape()
            .to_vec()
            .try_into()
            .unwrap_or_else(|_| panic!("{OP}: expected 4 dims"));
        let [h, w] = g.input;
        // The input's shape is the gradient's planes at the geometry's input size.
        let dx = empty_shaped(&grad, vec![gd[0], gd[1], h, w]);
        let (_, _, dims, (kh, kw)) = shapes(&dx, &g);
        let client = grad.client.clone();
        let (cube_count, cube_dim) = elementwise(&client, dx.meta.num_elements());
        avg_backward_kernel::launch(
            &client,
            cube_count,
            cube_dim,
            grad.into_tensor_arg(),
            dx.clone().into_buffer_arg(),
            dims,
            kh,
            kw,
            include_pad,
        );
        dx
    }

    fn pool_avg2d_rounded(
        x: CubeTensor,
        mult: CubeTensor,
        step: CubeTensor,
        g: PlaneGeom,
        r: Rounding,
    ) -> CubeTensor {
        avg_forward(x, Some((mult, step)), g, r)
    }
}
