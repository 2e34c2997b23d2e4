//! The convolution kernels for the CubeCL backends: forward, input gradient, weight gradient.

use cubecl::prelude::*;

use super::ConvGeom;
use crate::support::cube::{at_most_zero, cube_sum};

/// The panics' name for these kernels.
const OP: &str = "conv";

/// The sizes and steps the kernels index with, as u32 (every index of the kernels is 32-bit:
/// `f32_strided` checks the operands, [`Sizes::launch`] the output); one launch argument.
#[derive(CubeLaunch, CubeType)]
struct Sizes {
    n: u32,
    ci: u32,
    h: u32,
    w: u32,
    co: u32,
    oh: u32,
    ow: u32,
    /// Input and output channels per group.
    cig: u32,
    cog: u32,
    sh: u32,
    sw: u32,
    ph: u32,
    pw: u32,
    dh: u32,
    dw: u32,
    /// The groups' input groups ([`super::GroupInputs`]).
    sources: u32,
    per: u32,
    inner: u32,
    /// The leading output channels whose filters are zero within `by` taps of every edge
    /// ([`super::Inset`]), and that margin.
    narrow: u32,
    by: u32,
}

impl Sizes {
    /// The launch argument of a convolution of `n` images, `ci` input and `co` output
    /// channels with geometry `g`.
    fn launch(n: usize, ci: usize, co: usize, g: &ConvGeom) -> SizesLaunch {
        let p = &g.plane;
        let u = |v: usize| u32::try_from(v).expect("conv: a size exceeds the kernels' u32");
        let outputs = n * co * g.output[0] * g.output[1];
        let inputs = n * ci * p.input[0] * p.input[1];
        assert!(
            u32::try_from(outputs.max(inputs)).is_ok(),
            "{OP}: [{n}, {ci}, {:?}] → [{n}, {co}, {:?}] exceeds the kernels' u32 indices",
            p.input,
            g.output
        );
        let divides = g.groups > 0 && co.is_multiple_of(g.groups);
        assert!(divides && g.inputs.fits(g.groups, ci), "{OP}: groups {:?}", g.inputs);
        SizesLaunch::new(
            u(n),
            u(ci),
            u(p.input[0]),
            u(p.input[1]),
            u(co),
            u(g.output[0]),
            u(g.output[1]),
            u(ci / g.inputs.count()),
            u(co / g.groups),
            u(p.stride[0]),
            u(p.stride[1]),
            u(p.padding[0]),
            u(p.padding[1]),
            u(p.dilation[0]),
            u(p.dilation[1]),
            u(g.inputs.sources),
            u(g.inputs.per),
            u(g.inputs.inner),
            u(g.inset.channels),
            u(g.inset.by),
        )
    }
}

/// `v`, or with `relu` its ReLU as the ReLU kernel takes it (0 where `v` is at most zero).
#[cube]
fn relu_of(v: f32, #[comptime] relu: bool) -> f32 {
    let mut out = v;
    if relu {
        out = select(at_most_zero(v), 0.0, v);
    }
    out
}

/// The steps of `x` `[N, C, H, W]` in its buffer, `(image, channel, row, column)`: its strides
/// with `strided`, else a contiguous layout's. The kernels add them up as they go rather than
/// multiplying out every index.
#[cube]
fn steps(
    x: &Tensor<f32>,
    ci: u32,
    h: u32,
    w: u32,
    #[comptime] strided: bool,
) -> (u32, u32, u32, u32) {
    let mut image = ci * h * w;
    let mut channel = h * w;
    let mut row = w;
    let mut column = 1u32;
    if strided {
        image = x.stride(0) as u32;
        channel = x.stride(1) as u32;
        row = x.stride(2) as u32;
        column = x.stride(3) as u32;
    }
    (image, channel, row, column)
}

/// The weight's strides, `(output, input, row, column)`: a parameter uploaded to cuda is laid
/// out with padded rows.
#[cube]
fn weight_steps(wt: &Tensor<f32>) -> (u32, u32, u32, u32) {
    (wt.stride(0) as u32, wt.stride(1) as u32, wt.stride(2) as u32, wt.stride(3) as u32)
}

/// Whether tap `t` of `k` lies within `by` of the filter's edge (an inset filter's zeros).
#[cube]
fn on_edge(t: u32, #[comptime] k: u32, #[comptime] by: u32) -> bool {
    let mut edge = false;
    if comptime!(by > 0) {
        edge = t < by || t + by >= k;
    }
    edge
}

/// The input group that group `g` reads ([`super::GroupInputs::of`]).
#[cube]
fn input_group(g: u32, sources: u32, per: u32, inner: u32) -> u32 {
    ((g / (per * inner)) % sources) * inner + g % inner
}

/// `out[n, o, y, x] = Σ_c Σ_(i, j) w[o, c, i, j] · x[n, g·C_g + c, y·sh + i·dh − ph, x·sw + j·dw − pw]`
/// (taps outside the input skipped; with `relu`, of `relu(x)`), one thread per output.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn forward_kernel(
    x: &Tensor<f32>,
    wt: &Tensor<f32>,
    out: &mut [f32],
    total: u32,
    s: Sizes,
    #[comptime] kh: u32,
    #[comptime] kw: u32,
    #[comptime] by: u32,
    #[comptime] relu: bool,
    #[comptime] strided: bool,
) {
    let (ci, h, w, co, oh, ow) = (s.ci, s.h, s.w, s.co, s.oh, s.ow);
    let (cig, cog, sh, sw, ph, pw, dh, dw) = (s.cig, s.cog, s.sh, s.sw, s.ph, s.pw, s.dh, s.dw);
    let (sources, per, inner) = (s.sources, s.per, s.inner);
    let i = ABSOLUTE_POS as u32;
    if i < total {
        let ox = i % ow;
        let rest = i / ow;
        let oy = rest % oh;
        let rest = rest / oh;
        let o = rest % co;
        let b = rest / co;
        let first = input_group(o / cog, sources, per, inner) * cig;
        let inset = o < s.narrow;
        let (image, channel, row_step, column) = steps(x, ci, h, w, strided);
        let (w_out, w_in, w_row, w_column) = weight_steps(wt);
        let mut plane = b * image + first * channel;
        let mut taps = o * w_out;
        let mut acc = 0.0f32;
        let mut c = 0u32;
        while c < cig {
            #[unroll]
            for ki in 0..kh {
                let y = oy * sh + ki * dh;
                if y >= ph && y < h + ph && !(inset && on_edge(ki, kh, by)) {
                    let row = plane + (y - ph) * row_step;
                    let w_at = taps + ki * w_row;
                    #[unroll]
                    for kj in 0..kw {
                        let xx = ox * sw + kj * dw;
                        if xx >= pw && xx < w + pw && !(inset && on_edge(kj, kw, by)) {
                            let v = relu_of(x[(row + (xx - pw) * column) as usize], relu);
                            acc += wt[(w_at + kj * w_column) as usize] * v;
                        }
                    }
                }
            }
            plane += channel;
            taps += w_in;
            c += 1;
        }
        out[i as usize] = acc;
    }
}

/// `∂x[n, c, y, x] = Σ_o Σ_(i, j) w[o, c mod C_g, i, j] · ∂y[n, o, q_y, q_x]` over the output
/// channels of the groups that read `c`'s input group and the taps whose output `q` reads
/// `(y, x)`: `q·s + t·d − pad = (y, x)`; each reading group's sum apart, added in group order;
/// with `relu`, 0 where `x_in` is at most zero (ReLU's gradient). One thread per input. The
/// strides `sh`, `sw` are comptime: the taps' divisions by them are then shifts or nothing.
#[cube(launch)]
// `is_multiple_of` is not a CubeCL operation: the kernel tests divisibility with `%`.
#[allow(clippy::too_many_arguments, clippy::manual_is_multiple_of)]
fn x_backward_kernel(
    grad: &[f32],
    x_in: &Tensor<f32>,
    wt: &Tensor<f32>,
    out: &mut [f32],
    total: u32,
    s: Sizes,
    #[comptime] kh: u32,
    #[comptime] kw: u32,
    #[comptime] sh: u32,
    #[comptime] sw: u32,
    #[comptime] by: u32,
    #[comptime] relu: bool,
    #[comptime] strided: bool,
) {
    let (ci, h, w, co, oh, ow) = (s.ci, s.h, s.w, s.co, s.oh, s.ow);
    let (cig, cog, ph, pw, dh, dw) = (s.cig, s.cog, s.ph, s.pw, s.dh, s.dw);
    let (sources, per, inner) = (s.sources, s.per, s.inner);
    let i = ABSOLUTE_POS as u32;
    if i < total {
        let x = i % w;
        let rest = i / w;
        let y = rest % h;
        let rest = rest / h;
        let c = rest % ci;
        let b = rest / ci;
        let (group, cc) = (c / cig, c % cig);
        let (run, k) = (group / inner, group % inner);
        let (yp, xp) = (y + ph, x + pw);
        // The groups that read this input group, each's sum apart and then added in order.
        let readers = (co / cog) / (sources * inner);
        let (w_out, w_in, w_row, w_column) = weight_steps(wt);
        let mut total = 0.0f32;
        let mut r = 0u32;
        while r < readers {
            let reader = ((r / per * sources + run) * per + r % per) * inner + k;
            let mut acc = 0.0f32;
            let mut o = reader * cog;
            let end = o + cog;
            let mut plane = (b * co + o) * oh;
            let mut taps = o * w_out + cc * w_in;
            while o < end {
                let inset = o < s.narrow;
                #[unroll]
                for ki in 0..kh {
                    let reach = ki * dh;
                    if yp >= reach && !(inset && on_edge(ki, kh, by)) {
                        let ty = yp - reach;
                        if ty % sh == 0 && ty / sh < oh {
                            let row = (plane + ty / sh) * ow;
                            let w_at = taps + ki * w_row;
                            #[unroll]
                            for kj in 0..kw {
                                let across = kj * dw;
                                if xp >= across && !(inset && on_edge(kj, kw, by)) {
                                    let tx = xp - across;
                                    if tx % sw == 0 && tx / sw < ow {
                                        let g = grad[(row + tx / sw) as usize];
                                        acc += wt[(w_at + kj * w_column) as usize] * g;
                                    }
                                }
                            }
                        }
                    }
                }
                plane += oh;
                taps += w_out;
                o += 1;
            }
            total = select(r == 0, acc, total + acc);
            r += 1;
        }
        if relu {
            // ReLU's gradient: blocked where the input was at most zero.
            let (image, channel, row_step, column) = steps(x_in, ci, h, w, strided);
            let v = x_in[(b * image + c * channel + y * row_step + x * column) as usize];
            total = select(at_most_zero(v), 0.0, total);
        }
        out[i as usize] = total;
    }
}

/// `∂w[o, c, i, j] = Σ_(n, q) ∂y[n, o, q] · x[n, g·C_g + c, q·s + t·d − pad]` (with `relu`, of
/// `relu(x)`), one cube per
/// weight (the cube grid is `(x, y)`, weight `y·X + x`): each thread sums a fixed stride of
/// the `N·H'·W'` products, then a tree.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn weight_kernel(
    x: &Tensor<f32>,
    grad: &[f32],
    out: &mut [f32],
    weights: u32,
    s: Sizes,
    kh: u32,
    kw: u32,
    #[comptime] units: usize,
    #[comptime] relu: bool,
    #[comptime] strided: bool,
) {
    let n = s.n;
    let (ci, h, w, co, oh, ow) = (s.ci, s.h, s.w, s.co, s.oh, s.ow);
    let (cig, cog, sh, sw, ph, pw, dh, dw) = (s.cig, s.cog, s.sh, s.sw, s.ph, s.pw, s.dh, s.dw);
    let (sources, per, inner) = (s.sources, s.per, s.inner);
    let mut shared = Shared::<[f32]>::new_slice(units);
    let at = CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X;
    // Uniform over the cube: a cube past the last weight leaves before any sync.
    if at < weights {
        let kj = at % kw;
        let rest = at / kw;
        let ki = rest % kh;
        let rest = rest / kh;
        let cc = rest % cig;
        let o = rest / cig;
        let c = input_group(o / cog, sources, per, inner) * cig + cc;
        let (reach, across) = (ki * dh, kj * dw);
        // An inset filter's zero tap: no products, a gradient of 0 (uniform over the cube).
        let by = s.by;
        let edge = ki < by || ki + by >= kh || kj < by || kj + by >= kw;
        let count = select(o < s.narrow && edge, 0u32, n * oh * ow);
        let (image, channel, row_step, column) = steps(x, ci, h, w, strided);
        let (x_plane, g_plane, g_image) = (c * channel, o * oh * ow, co * oh * ow);
        // Product `j` is output `(b, qy, qx)`; a unit's next one is `CUBE_DIM_X` further on,
        // stepped digit by digit with carries instead of divided out again.
        let mut j = UNIT_POS_X;
        let mut qx = j % ow;
        let mut qy = (j / ow) % oh;
        let mut b = j / (ow * oh);
        let (dx, dy, db) = (CUBE_DIM_X % ow, (CUBE_DIM_X / ow) % oh, CUBE_DIM_X / (ow * oh));
        let mut sum = 0.0f32;
        while j < count {
            let (y, xx) = (qy * sh + reach, qx * sw + across);
            if y >= ph && y < h + ph && xx >= pw && xx < w + pw {
                let g = grad[(b * g_image + g_plane + qy * ow + qx) as usize];
                let at = b * image + x_plane + (y - ph) * row_step + (xx - pw) * column;
                sum += g * relu_of(x[at as usize], relu);
            }
            j += CUBE_DIM_X;
            qx += dx;
            if qx >= ow {
                qx -= ow;
                qy += 1;
            }
            qy += dy;
            if qy >= oh {
                qy -= oh;
                b += 1;
            }
            b += db;
        }
        let total = cube_sum(&mut shared, sum);
        if UNIT_POS_X == 0 {
            out[at as usize] = total;
        }
    }
}

mod launch;
