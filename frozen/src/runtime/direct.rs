//! The direct convolution: a zero-padded, zero-point-subtracted i32 copy of the input and,
//! per output channel and tap, a multiply-add over contiguous output columns. The plain reading
//! of the arithmetic, kept as the reference the fast kernel is tested against. Pooling, the
//! same way: per output, over the window.

use crate::fixed::Rounding;
use crate::model::{ActGrid, ConvNode, PoolKind, Shape};
use crate::validate::conv_out;

use super::{div_round, store_requantized};

/// The convolution of one image `x` (`[c_in, h, w]` i8 storage on grid `g_in`), with the
/// widened weights `w` and the biases.
pub(super) fn conv(
    c: &ConvNode,
    x: &[i8],
    s: Shape,
    g_in: ActGrid,
    w: &[i32],
    bias: &[i32],
    r: Rounding,
) -> Vec<i8> {
    let z = g_in.zero_point - g_in.offset();
    let [ci_n, h, wd] = s;
    let (oh, ow) = conv_out(c, s).unwrap_or((0, 0));
    let (ph, pw) = (c.padding[0], c.padding[1]);
    let (hp, wp) = (h - c.offset + 2 * ph, wd - c.offset + 2 * pw);
    // Zero-padded copy of x − z (after the ReLU), cropped by `offset`.
    let mut xp = vec![0i32; ci_n * hp * wp];
    for ch in 0..ci_n {
        for y in c.offset..h {
            let src = &x[(ch * h + y) * wd + c.offset..(ch * h + y + 1) * wd];
            let dst = &mut xp[(ch * hp + y - c.offset + ph) * wp + pw..][..src.len()];
            for (d, &q) in dst.iter_mut().zip(src) {
                let v = i32::from(q) - z;
                *d = if c.relu { v.max(0) } else { v };
            }
        }
    }
    let co_n = c.multipliers.len();
    let cig = ci_n / c.groups;
    let cog = co_n / c.groups;
    let [kh, kw] = c.kernel;
    let [sh, sw] = c.stride;
    let d = c.dilation;
    let mut out = vec![0i8; co_n * oh * ow];
    let mut acc = vec![0i32; oh * ow];
    for co in 0..co_n {
        acc.fill(bias[co]);
        let g = co / cog;
        for cl in 0..cig {
            let plane = &xp[(g * cig + cl) * hp * wp..][..hp * wp];
            for ky in 0..kh {
                for kx in 0..kw {
                    let wv = w[((co * cig + cl) * kh + ky) * kw + kx];
                    if wv == 0 {
                        continue;
                    }
                    for oy in 0..oh {
                        let row = &plane[(oy * sh + ky * d) * wp + kx * d..];
                        let a = &mut acc[oy * ow..(oy + 1) * ow];
                        if sw == 1 {
                            for (a, &xv) in a.iter_mut().zip(&row[..ow]) {
                                *a += wv * xv;
                            }
                        } else {
                            for (ox, a) in a.iter_mut().enumerate() {
                                *a += wv * row[ox * sw];
                            }
                        }
                    }
                }
            }
        }
        let dst = &mut out[co * oh * ow..(co + 1) * oh * ow];
        store_requantized(&acc, c.multipliers[co], &c.out, r, dst);
    }
    out
}

/// Pooling on the input's grid: max of the window (padding ignored), or the average of the
/// window's in-image values rounded as the model rounds. The direct form, per output; the
/// fast kernels pool whole runs of the stride phases (`fast::pool`).
pub(super) fn pool(
    x: &[i8],
    s: Shape,
    o: Shape,
    kind: PoolKind,
    [k, st, p]: [usize; 3],
    g: ActGrid,
    r: Rounding,
) -> Vec<i8> {
    let [c, h, w] = s;
    let z = g.zero_point - g.offset();
    let mut out = Vec::with_capacity(o.iter().product());
    for ch in 0..c {
        let plane = &x[ch * h * w..(ch + 1) * h * w];
        for oy in 0..o[1] {
            for ox in 0..o[2] {
                let (y0, x0) = ((oy * st) as isize - p as isize, (ox * st) as isize - p as isize);
                let (mut best, mut sum, mut cnt) = (i32::MIN, 0i32, 0i32);
                for y in y0.max(0)..(y0 + k as isize).min(h as isize) {
                    for xx in x0.max(0)..(x0 + k as isize).min(w as isize) {
                        let q = i32::from(plane[y as usize * w + xx as usize]);
                        best = best.max(q);
                        sum += q - z;
                        cnt += 1;
                    }
                }
                let q = match kind {
                    PoolKind::Max => best,
                    PoolKind::Avg => div_round(sum, cnt.max(1), r) + z,
                };
                out.push(q.clamp(-128, 127) as i8);
            }
        }
    }
    out
}
