//! The CPU loops of the flex kernel: per-channel constants and the element loops, forward and
//! backward.

use super::*;

/// 1.5·2²³: adding and subtracting it rounds an f32 below 2²² to an integer, ties to even
/// (the sum lies where the f32 spacing is 1, and the constant is even).
const MAGIC: f32 = 12_582_912.0;

/// Per-channel constants of the element loop.
#[derive(Debug, Clone, Copy)]
pub(super) struct Chan {
    mult: f32,
    step: f32,
    zp: f32,
    /// `x · mult` is clamped to `[lo, hi]` before rounding: one unit beyond the range on each
    /// side, so out-of-range values stay out of range and the magic rounding stays exact.
    lo: f32,
    hi: f32,
}

impl Chan {
    pub(super) fn new(mult: f32, step: f32, zp: f32, layout: &FusedLayout) -> Self {
        Chan {
            mult,
            step,
            zp,
            lo: layout.qmin as f32 - zp - 1.0,
            hi: layout.qmax as f32 - zp + 1.0,
        }
    }

    /// `round(x · mult) + z`, unclamped (NaN stays NaN). Branch-free, so the element loops
    /// vectorize.
    #[inline(always)]
    pub(super) fn rounded<const AWAY: bool>(&self, x: f32) -> f32 {
        let v = x * self.mult;
        let v = if v < self.lo { self.lo } else { v };
        let v = if v > self.hi { self.hi } else { v };
        let r = if AWAY {
            // |v| < 2^22 here, so the integer conversion truncates exactly (NaN gives 0 and
            // is put back below).
            let t = (v as i32) as f32;
            let f = v - t;
            let up = if f >= 0.5 { 1.0 } else { 0.0 };
            let down = if f <= -0.5 { 1.0 } else { 0.0 };
            let r = t + up - down;
            if v.is_nan() { v } else { r }
        } else {
            (v + MAGIC) - MAGIC
        };
        r + self.zp
    }
}

/// Runs `f(chan, range)` over the contiguous element ranges that share a channel, in parallel
/// chunks.
pub(super) fn for_each_run(
    n: usize,
    chans: &[Chan],
    layout: &FusedLayout,
    out: &mut [f32],
    f: impl Fn(&Chan, usize, &mut [f32]) + Sync,
) {
    use rayon::prelude::*;
    const CHUNK: usize = 1 << 15;
    out.par_chunks_mut(CHUNK).enumerate().for_each(|(k, block)| {
        let start = k * CHUNK;
        let end = (start + block.len()).min(n);
        let mut i = start;
        crate::support::lanes::wide(
            #[inline(always)]
            || {
                while i < end {
                    let run = i / layout.inner;
                    let stop = ((run + 1) * layout.inner).min(end);
                    f(&chans[run % layout.channels], i, &mut block[i - start..stop - start]);
                    i = stop;
                }
            },
        );
    });
}

/// The forward element loop over one channel run.
#[inline(always)]
pub(super) fn forward<const AWAY: bool>(
    c: &Chan,
    src: &[f32],
    dst: &mut [f32],
    qmin: f32,
    qmax: f32,
) {
    for (o, &v) in dst.iter_mut().zip(src) {
        let r = c.rounded::<AWAY>(v);
        let q = if r < qmin { qmin } else { r };
        let q = if q > qmax { qmax } else { q };
        *o = (q - c.zp) * c.step;
    }
}

/// The backward element loop over one channel run: zeroes the gradient `g` where `x` quantizes
/// outside the range (in place, so an owned gradient buffer is reused).
#[inline(always)]
pub(super) fn backward<const AWAY: bool>(
    c: &Chan,
    xs: &[f32],
    g: &mut [f32],
    qmin: f32,
    qmax: f32,
) {
    for (o, &v) in g.iter_mut().zip(xs) {
        let r = c.rounded::<AWAY>(v);
        *o = if r < qmin || r > qmax { 0.0 } else { *o };
    }
}
