//! The fast convolution: the input widened once to i16 (ReLU applied, padding filled with the
//! input's zero point), unfolded (im2col) where the kernel needs it, and a register-blocked
//! i16×i16→i32 matrix product; depthwise stride-1 convolutions skip the unfolding and sum
//! shifted rows of the padded plane. The zero point is folded into the bias once:
//! `Σ w·(x − z) + b = Σ w·x + (b − z·Σw)`, exact in wrapping i32 arithmetic, so the result is
//! the direct convolution's bit for bit.
//!
//! The kernels are plain loops over fixed-size tiles that the compiler vectorizes ([`simd`]).

use crate::fixed::Rounding;
use crate::model::{ConvNode, Shape};

use super::simd;
use super::store_requantized;

/// A convolution's weights laid out for the kernels.
#[derive(Debug)]
pub(crate) struct ConvPlan {
    /// Weights `[c_out][k]`.
    w: Vec<i32>,
    /// `b − z_in·Σw` per output channel.
    bias: Vec<i32>,
    /// Stored value (i8 domain) of the input's zero point.
    z: i16,
    /// Products per output (`c_in/groups · kh · kw`).
    k: usize,
    depthwise: bool,
}

impl ConvPlan {
    /// `w`: the widened weights `[c_out, c_in/groups, kh, kw]` (sign flips applied), `bias`
    /// the int32 biases, `z` the input's zero point in storage (`zero_point − offset`).
    pub(crate) fn new(c: &ConvNode, w: &[i32], bias: &[i32], z: i32) -> Self {
        let co_n = c.multipliers.len();
        let k = w.len() / co_n.max(1);
        let cog = co_n / c.groups.max(1);
        let depthwise = k == c.kernel[0] * c.kernel[1] && cog == 1;
        let bias = (0..co_n)
            .map(|co| {
                let sum = w[co * k..(co + 1) * k].iter().fold(0i32, |a, &v| a.wrapping_add(v));
                bias[co].wrapping_sub(z.wrapping_mul(sum))
            })
            .collect();
        ConvPlan { w: w.to_vec(), bias, z: z as i16, k, depthwise }
    }

    /// The convolution of one image `x` (`[c_in, h, w]` i8 storage) on the plan.
    pub(crate) fn run(
        &self,
        c: &ConvNode,
        x: &[i8],
        s: Shape,
        out_shape: Shape,
        r: Rounding,
    ) -> Vec<i8> {
        let [ci_n, h, wd] = s;
        let [co_n, oh, ow] = out_shape;
        let (ph, pw) = (c.padding[0], c.padding[1]);
        let (hp, wp) = (h - c.offset + 2 * ph, wd - c.offset + 2 * pw);
        // The padded input in storage units: padding holds the zero point, ReLU is max(q, z).
        let mut xp = vec![self.z; ci_n * hp * wp];
        for ch in 0..ci_n {
            for y in c.offset..h {
                let src = &x[(ch * h + y) * wd + c.offset..(ch * h + y + 1) * wd];
                let dst = &mut xp[(ch * hp + y - c.offset + ph) * wp + pw..][..src.len()];
                for (d, &q) in dst.iter_mut().zip(src) {
                    let v = i16::from(q);
                    *d = if c.relu { v.max(self.z) } else { v };
                }
            }
        }
        let p = oh * ow;
        let mut out = vec![0i8; co_n * p];
        if self.depthwise && c.stride == [1, 1] {
            // Accumulate over whole padded rows (`oh × wp`), then keep the `ow` valid columns.
            let mut acc = vec![0i32; oh * wp];
            for co in 0..co_n {
                let plane = &xp[co * hp * wp..(co + 1) * hp * wp];
                let taps = &self.w[co * self.k..(co + 1) * self.k];
                simd::depthwise_rows(
                    plane,
                    taps,
                    c.kernel,
                    c.dilation,
                    wp,
                    self.bias[co],
                    &mut acc,
                );
                // Keep the valid columns, then requantize the channel at once.
                if wp != ow {
                    for oy in 1..oh {
                        acc.copy_within(oy * wp..oy * wp + ow, oy * ow);
                    }
                }
                let dst = &mut out[co * p..(co + 1) * p];
                store_requantized(&acc[..p], c.multipliers[co], &c.out, r, dst);
            }
            return out;
        }
        // Unfold: row `(cl, ky, kx)` of group `g` holds the input under that tap for every
        // output position.
        let cig = ci_n / c.groups;
        let cog = co_n / c.groups;
        let mut cols = vec![0i16; self.k * p];
        let mut acc = vec![0i32; cog * p];
        for g in 0..c.groups {
            unfold(
                c,
                &xp[g * cig * hp * wp..(g + 1) * cig * hp * wp],
                [hp, wp],
                [oh, ow],
                &mut cols,
            );
            if self.depthwise {
                // One channel: a weighted sum of the unfolded rows.
                let taps = &self.w[g * self.k..(g + 1) * self.k];
                simd::depthwise_cols(&cols, taps, self.bias[g], &mut acc[..p]);
                store_requantized(
                    &acc[..p],
                    c.multipliers[g],
                    &c.out,
                    r,
                    &mut out[g * p..(g + 1) * p],
                );
                continue;
            }
            let w = &self.w[g * cog * self.k..(g + 1) * cog * self.k];
            let bias = &self.bias[g * cog..(g + 1) * cog];
            simd::gemm(w, &cols, bias, &mut acc);
            for cl in 0..cog {
                let co = g * cog + cl;
                store_requantized(
                    &acc[cl * p..(cl + 1) * p],
                    c.multipliers[co],
                    &c.out,
                    r,
                    &mut out[co * p..(co + 1) * p],
                );
            }
        }
        out
    }
}

/// The unfolded input of one group (`xp`: its `c_in/groups` padded planes, `hp × wp`): row
/// `(cl, ky, kx)` of `cols` holds the input under that tap at every output position.
fn unfold(c: &ConvNode, xp: &[i16], [hp, wp]: [usize; 2], [oh, ow]: [usize; 2], cols: &mut [i16]) {
    let [kh, kw] = c.kernel;
    let [sh, sw] = c.stride;
    let d = c.dilation;
    for (cl, plane) in xp.chunks_exact(hp * wp).enumerate() {
        for ky in 0..kh {
            for kx in 0..kw {
                let row = &mut cols[((cl * kh + ky) * kw + kx) * oh * ow..][..oh * ow];
                for oy in 0..oh {
                    let src = &plane[(oy * sh + ky * d) * wp + kx * d..];
                    let dst = &mut row[oy * ow..(oy + 1) * ow];
                    if sw == 1 {
                        dst.copy_from_slice(&src[..ow]);
                    } else {
                        for (ox, v) in dst.iter_mut().enumerate() {
                            *v = src[ox * sw];
                        }
                    }
                }
            }
        }
    }
}
