//! The fast convolution, in three forms that give the direct convolution's integers bit for
//! bit:
//!
//! - a depthwise 1×1 convolution (a BatchNorm after a pool: one affine map per channel) maps
//!   each of the 256 stored input values through a table computed once, at load, with the
//!   runtime's own requantization;
//! - other depthwise convolutions sum whole rows of the padded plane, split into its stride
//!   phases so that every tap reads contiguous memory ([`packed::taps`]);
//! - everything else (dense and grouped) is a matrix product of the packed weights and the
//!   unfolded input ([`packed::gemm`]); a 1×1 convolution without stride, padding or crop packs
//!   its input straight from the stored values.
//!
//! The input is widened to i16 once (ReLU applied, padding filled with the input's zero point)
//! and the zero point is folded into the bias: `Σ w·(x − z) + b = Σ w·x + (b − z·Σw)`, exact in
//! wrapping i32 arithmetic.

use crate::fixed::Rounding;
use crate::model::{ConvNode, Shape};

use super::packed::{self, MR, NR};
use super::{every_stored, simd, store_requantized};

/// How a convolution runs.
#[derive(Debug)]
enum Form {
    /// Depthwise 1×1, no stride, padding or crop: `out = table[c][stored input]`.
    Table(Vec<[i8; 256]>),
    /// Depthwise: each channel's taps paired by [`packed::pair_weights`].
    Depthwise(Vec<Vec<i32>>),
    /// Dense or grouped: per group, weights from [`packed::pack_weights`].
    Gemm(Vec<Vec<i32>>),
}

/// A convolution's weights laid out for the kernels.
#[derive(Debug)]
pub(crate) struct ConvPlan {
    form: Form,
    /// `b − z_in·Σw` per output channel, padded to whole blocks of [`MR`] per group.
    bias: Vec<i32>,
    /// Stored value (i8 domain) of the input's zero point.
    z: i16,
    /// Products per output (`c_in/groups · kh · kw`).
    k: usize,
}

impl ConvPlan {
    /// `w`: the widened weights `[c_out, c_in/groups, kh, kw]` (sign flips applied), `bias`
    /// the int32 biases, `z` the input's zero point in storage (`zero_point − offset`), `r`
    /// the model's rounding.
    pub(crate) fn new(c: &ConvNode, w: &[i32], bias: &[i32], z: i32, r: Rounding) -> Self {
        let co_n = c.multipliers.len();
        let groups = c.groups.max(1);
        let k = w.len() / co_n.max(1);
        let cog = co_n / groups;
        let folded: Vec<i32> = (0..co_n)
            .map(|co| {
                let sum = w[co * k..(co + 1) * k].iter().fold(0i32, |a, &v| a.wrapping_add(v));
                bias[co].wrapping_sub(z.wrapping_mul(sum))
            })
            .collect();
        let depthwise = k == c.kernel[0] * c.kernel[1] && cog == 1;
        let plain = c.stride == [1, 1] && c.padding == [0, 0] && c.offset == 0;
        if depthwise && c.kernel == [1, 1] && plain {
            // The direct kernel's arithmetic on every stored value.
            let tables = (0..co_n)
                .map(|co| {
                    let acc: Vec<i32> = every_stored()
                        .iter()
                        .map(|&q| {
                            let v = i32::from(q) - z;
                            let v = if c.relu { v.max(0) } else { v };
                            bias[co].wrapping_add(w[co].wrapping_mul(v))
                        })
                        .collect();
                    let mut t = [0i8; 256];
                    store_requantized(&acc, c.multipliers[co], &c.out, r, &mut t);
                    t
                })
                .collect();
            return ConvPlan { form: Form::Table(tables), bias: folded, z: z as i16, k };
        }
        if depthwise {
            let pairs = w.chunks_exact(k.max(1)).map(packed::pair_weights).collect();
            return ConvPlan { form: Form::Depthwise(pairs), bias: folded, z: z as i16, k };
        }
        let blocks = cog.div_ceil(MR) * MR;
        let mut padded = Vec::with_capacity(groups * blocks);
        let packs = (0..groups)
            .map(|g| {
                padded.extend_from_slice(&folded[g * cog..(g + 1) * cog]);
                padded.resize((g + 1) * blocks, 0);
                packed::pack_weights(&w[g * cog * k..(g + 1) * cog * k], cog, k)
            })
            .collect();
        ConvPlan { form: Form::Gemm(packs), bias: padded, z: z as i16, k }
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
        let [co_n, oh, ow] = out_shape;
        let mut out = vec![0i8; co_n * oh * ow];
        match &self.form {
            Form::Table(tables) => {
                let p = s[1] * s[2];
                for ((src, dst), t) in x.chunks_exact(p).zip(out.chunks_exact_mut(p)).zip(tables) {
                    for (d, &q) in dst.iter_mut().zip(src) {
                        *d = t[usize::from(q as u8)];
                    }
                }
            }
            Form::Depthwise(w) => self.depthwise(c, w, x, s, [oh, ow], r, &mut out),
            Form::Gemm(packs) => self.gemm(c, packs, x, s, [oh, ow], r, &mut out),
        }
        out
    }

    /// The least value the kernels read: a ReLU is `max(q, z)`.
    fn floor(&self, relu: bool) -> i16 {
        if relu { self.z } else { i16::MIN }
    }

    #[allow(clippy::too_many_arguments)]
    fn depthwise(
        &self,
        c: &ConvNode,
        w: &[Vec<i32>],
        x: &[i8],
        s: Shape,
        [oh, ow]: [usize; 2],
        r: Rounding,
        out: &mut [i8],
    ) {
        let [_, h, wd] = s;
        let ph = Phases::new([h, wd], c.offset, c.padding, c.stride);
        let [hq, wq] = ph.hwq;
        // Accumulate over whole phase rows (`oh × wq`), then keep the `ow` valid columns.
        let n = (oh * wq).div_ceil(NR) * NR;
        let at = packed::pair_offsets(&ph.taps(c.kernel, c.dilation));
        // Every channel's phases, one after the other; a channel's last runs read into the
        // next one's (or the tail), in columns that are never kept.
        let region = ph.len();
        let mut buf = vec![self.z; w.len() * region + n];
        let floor = self.floor(c.relu);
        for (plane, dst) in x.chunks_exact(h * wd).zip(buf.chunks_exact_mut(region)) {
            fill_phases(plane, [h, wd], c.offset, c.padding, c.stride, [hq, wq], floor, dst);
        }
        let mut acc = vec![0i32; n];
        let p = oh * ow;
        for (co, (wc, dst)) in w.iter().zip(out.chunks_exact_mut(p)).enumerate() {
            packed::taps(&buf[co * region..], &at, wc, self.bias[co], &mut acc);
            if wq != ow {
                for oy in 1..oh {
                    acc.copy_within(oy * wq..oy * wq + ow, oy * ow);
                }
            }
            store_requantized(&acc[..p], c.multipliers[co], &c.out, r, dst);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn gemm(
        &self,
        c: &ConvNode,
        packs: &[Vec<i32>],
        x: &[i8],
        s: Shape,
        [oh, ow]: [usize; 2],
        r: Rounding,
        out: &mut [i8],
    ) {
        let [ci_n, h, wd] = s;
        let groups = packs.len();
        let (cig, cog) = (ci_n / groups, c.multipliers.len() / groups);
        let blocks = cog.div_ceil(MR) * MR;
        let p = oh * ow;
        let np = p.div_ceil(NR) * NR;
        let mut cp = vec![0i32; np / NR * packed::panel_len(self.k)];
        let mut acc = vec![0i32; blocks * np];
        let pointwise =
            c.kernel == [1, 1] && c.stride == [1, 1] && c.padding == [0, 0] && c.offset == 0;
        let mut cols = if pointwise { Vec::new() } else { vec![0i16; self.k * p] };
        let ph = Phases::new([h, wd], c.offset, c.padding, c.stride);
        let plane_len = ph.len();
        let mut xp = if pointwise { Vec::new() } else { vec![self.z; cig * plane_len] };
        let floor = self.floor(c.relu);
        for (g, wpk) in packs.iter().enumerate() {
            let xg = &x[g * cig * h * wd..(g + 1) * cig * h * wd];
            if pointwise {
                packed::pack_cols(xg, self.k, p, p, floor, &mut cp);
            } else {
                // The padded planes' stride phases, then the unfolded rows.
                xp.fill(self.z);
                for (plane, dst) in xg.chunks_exact(h * wd).zip(xp.chunks_exact_mut(plane_len)) {
                    fill_phases(plane, [h, wd], c.offset, c.padding, c.stride, ph.hwq, floor, dst);
                }
                unfold(c, &xp, ph, [oh, ow], &mut cols);
                packed::pack_cols(&cols, self.k, p, p, i16::MIN, &mut cp);
            }
            packed::gemm(wpk, &cp, &self.bias[g * blocks..(g + 1) * blocks], np, &mut acc);
            for (cl, row) in acc.chunks_exact(np).take(cog).enumerate() {
                let co = g * cog + cl;
                let dst = &mut out[co * p..(co + 1) * p];
                store_requantized(&row[..p], c.multipliers[co], &c.out, r, dst);
            }
        }
    }
}

/// One `h × w` plane of stored values, its first `crop` rows and columns dropped and padded by
/// `pad`, widened and raised to at least `floor` (a ReLU in storage units, or `i16::MIN`), written
/// into `dst` as `[sh·sw][hq][wq]` stride phases: phase `(a, b)`
/// holds the padded rows `a, a + sh, …` and columns `b, b + sw, …`, so that a tap of a strided
/// window reads one contiguous run of a phase. `dst` already holds the padding value.
#[allow(clippy::too_many_arguments)]
pub(crate) fn fill_phases(
    plane: &[i8],
    hw: [usize; 2],
    crop: usize,
    pad: [usize; 2],
    stride: [usize; 2],
    hwq: [usize; 2],
    floor: i16,
    dst: &mut [i16],
) {
    pulp::Arch::new().dispatch(FillPhases { plane, hw, crop, pad, stride, hwq, floor, dst });
}

struct FillPhases<'a> {
    plane: &'a [i8],
    hw: [usize; 2],
    crop: usize,
    pad: [usize; 2],
    stride: [usize; 2],
    hwq: [usize; 2],
    floor: i16,
    dst: &'a mut [i16],
}

impl pulp::WithSimd for FillPhases<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        let FillPhases {
            plane,
            hw: [h, w],
            crop,
            pad: [ph, pw],
            stride: [sh, sw],
            hwq,
            floor,
            dst,
        } = self;
        let [hq, wq] = hwq;
        let phase = hq * wq;
        // Per column phase `b`: the first input column `i0` with `(i0 + pw) % sw == b`, and
        // where it lands in the phase row, `(i0 + pw) / sw` (no division inside the loops).
        let starts: Vec<(usize, usize)> = (0..sw)
            .map(|b| ((b + sw - pw % sw) % sw, ((b + sw - pw % sw) % sw + pw) / sw))
            .collect();
        let (mut a, mut row_in_phase) = (ph % sh, ph / sh);
        for y in crop..h {
            let row = &plane[y * w + crop..(y + 1) * w];
            let base = a * sw * phase + row_in_phase * wq;
            a += 1;
            if a == sh {
                a = 0;
                row_in_phase += 1;
            }
            if sw == 1 {
                for (d, &q) in dst[base + pw..][..row.len()].iter_mut().zip(row) {
                    *d = i16::from(q).max(floor);
                }
                continue;
            }
            for (b, &(i0, j0)) in starts.iter().enumerate() {
                if i0 >= row.len() {
                    continue;
                }
                let d = &mut dst[base + b * phase + j0..];
                for (d, &q) in d.iter_mut().zip(row[i0..].iter().step_by(sw)) {
                    *d = i16::from(q).max(floor);
                }
            }
        }
    }
}

/// The unfolded input of one group (`xp`: its `c_in/groups` planes as [`fill_phases`] writes
/// them, phases `hq × wq`): row `(cl, ky, kx)` of `cols` holds the input under that tap at
/// every output position, copied from one contiguous run of a phase per output row.
fn unfold(c: &ConvNode, xp: &[i16], ph: Phases, [oh, ow]: [usize; 2], cols: &mut [i16]) {
    let taps = ph.taps(c.kernel, c.dilation);
    let wq = ph.hwq[1];
    for (plane, rows) in xp.chunks_exact(ph.len()).zip(cols.chunks_exact_mut(taps.len() * oh * ow))
    {
        for (&at, row) in taps.iter().zip(rows.chunks_exact_mut(oh * ow)) {
            for (oy, dst) in row.chunks_exact_mut(ow).enumerate() {
                dst.copy_from_slice(&plane[at + oy * wq..][..ow]);
            }
        }
    }
}

/// The stride phases of a padded, cropped plane, as [`fill_phases`] writes them.
#[derive(Debug, Clone, Copy)]
struct Phases {
    stride: [usize; 2],
    /// Rows and columns of one phase.
    hwq: [usize; 2],
}

impl Phases {
    /// Phases of an `h × w` plane, its first `crop` rows and columns dropped, padded by `pad`.
    fn new([h, w]: [usize; 2], crop: usize, [ph, pw]: [usize; 2], stride: [usize; 2]) -> Self {
        let hwq =
            [(h - crop + 2 * ph).div_ceil(stride[0]), (w - crop + 2 * pw).div_ceil(stride[1])];
        Phases { stride, hwq }
    }

    /// Values of one plane's phases.
    fn len(&self) -> usize {
        self.stride[0] * self.stride[1] * self.hwq[0] * self.hwq[1]
    }

    /// Where each tap `(ky, kx)` of a `kh × kw` window (dilation `d`) reads for the first
    /// output; output `(oy, ox)` reads `oy·wq + ox` further on.
    fn taps(&self, [kh, kw]: [usize; 2], d: usize) -> Vec<usize> {
        let ([sh, sw], [hq, wq]) = (self.stride, self.hwq);
        (0..kh * kw)
            .map(|t| {
                let (yy, xx) = ((t / kw) * d, (t % kw) * d);
                ((yy % sh) * sw + xx % sw) * hq * wq + (yy / sh) * wq + xx / sw
            })
            .collect()
    }
}

/// Max or average (padding excluded) pooling of one image `x` (`s`, i8 storage, zero point
/// `z` in storage) into `[c, oh, ow]`. Each plane is written into its stride phases padded with
/// the smallest stored value (max) or the zero point (average, so that padding adds nothing to
/// `Σ (q − z)`), then every window is a sum or max of contiguous runs, one per tap; an
/// average divides by the window's in-image count and rounds as the model rounds.
pub(crate) fn pool(
    x: &[i8],
    s: Shape,
    [oh, ow]: [usize; 2],
    [k, st, p]: [usize; 3],
    max: bool,
    z: i32,
    r: Rounding,
) -> Vec<i8> {
    let [_, h, w] = s;
    let ph = Phases::new([h, w], 0, [p, p], [st, st]);
    let [hq, wq] = ph.hwq;
    let n = (oh * wq).div_ceil(NR) * NR;
    let at = ph.taps([k, k], 1);
    let pad = if max { i16::from(i8::MIN) } else { z as i16 };
    let planes = x.len() / (h * w);
    // Every plane's phases, one after the other (a plane's last runs read on, into columns
    // that are never kept).
    let region = ph.len();
    let mut buf = vec![pad; planes * region + n];
    for (plane, dst) in x.chunks_exact(h * w).zip(buf.chunks_exact_mut(region)) {
        fill_phases(plane, [h, w], 0, [p, p], [st, st], [hq, wq], i16::MIN, dst);
    }
    let q = oh * ow;
    let mut out = vec![0i8; planes * q];
    // In-image taps per output (average only; at least one, as the direct kernel divides).
    let count = |n_in: usize, o: usize| {
        let start = (o * st) as isize - p as isize;
        (start + k as isize).min(n_in as isize) - start.max(0)
    };
    let counts: Vec<i32> =
        (0..q).map(|i| (count(h, i / ow) * count(w, i % ow)).max(1) as i32).collect();
    let ones = packed::pair_weights(&vec![1; at.len()]);
    let pairs = packed::pair_offsets(&at);
    let mut acc = vec![0i32; n];
    let mut best = vec![0i16; n];
    for (ch, dst) in out.chunks_exact_mut(q).enumerate() {
        let buf = &buf[ch * region..];
        if max {
            simd::max_taps(buf, &at, &mut best);
            for oy in 0..oh {
                for (d, &v) in dst[oy * ow..(oy + 1) * ow].iter_mut().zip(&best[oy * wq..]) {
                    *d = v as i8;
                }
            }
            continue;
        }
        packed::taps(buf, &pairs, &ones, -((k * k) as i32) * z, &mut acc);
        if wq != ow {
            for oy in 1..oh {
                acc.copy_within(oy * wq..oy * wq + ow, oy * ow);
            }
        }
        simd::divide_rounded(&acc[..q], &counts, z, r == Rounding::TiesToEven, dst);
    }
    out
}
