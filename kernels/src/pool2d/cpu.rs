//! The per-plane loops of the flex pools: the 3×3 window taken separably over the padded plane.

use super::*;

/// `d[k] = op(d[k], s[k])`.
#[inline(always)]
fn combine(d: &mut [f32], s: &[f32], op: impl Fn(f32, f32) -> f32) {
    for (d, &s) in d.iter_mut().zip(s) {
        *d = op(*d, s);
    }
}

/// The larger of the two, NaN winning; on a tie the first (`a`, the earlier tap) stays.
#[inline(always)]
fn max_nan(a: f32, b: f32) -> f32 {
    // `|`, not `||`: no branch, so the loops over this vectorize.
    if (b > a) | b.is_nan() { b } else { a }
}

impl Flat {
    /// The stride-1 window result `acc` (`len`) of the padded plane `xp`, separably: `tmp`
    /// (`hp·wp`) takes the row pass.
    #[inline(always)]
    pub(super) fn window(
        &self,
        xp: &[f32],
        tmp: &mut [f32],
        acc: &mut [f32],
        op: impl Fn(f32, f32) -> f32,
    ) {
        let ([kh, kw], len) = (self.g.kernel, self.len);
        if len == 0 {
            return;
        }
        // Row pass over every start of the flat plane that the column pass reads.
        let m = self.padded() + 1 - kw;
        let tmp = &mut tmp[..m];
        tmp.copy_from_slice(&xp[..m]);
        for j in 1..kw {
            combine(tmp, &xp[j..j + m], &op);
        }
        let acc = &mut acc[..len];
        acc.copy_from_slice(&tmp[..len]);
        for i in 1..kh {
            combine(acc, &tmp[i * self.wp..][..len], &op);
        }
    }

    /// The number of input elements (or, with `include_pad`, window elements) under each
    /// strided output row (`[0]`) and column (`[1]`).
    pub(super) fn counts(&self, include_pad: bool) -> [Vec<f32>; 2] {
        let out = self.output();
        [0, 1].map(|a| {
            let (k, s, p, n) =
                (self.g.kernel[a], self.g.stride[a], self.g.padding[a], self.g.input[a]);
            (0..out[a])
                .map(|o| {
                    let start = o * s;
                    let inside = (start + k).min(p + n) - start.max(p);
                    (if include_pad { k } else { inside }) as f32
                })
                .collect()
        })
    }

    /// One max-pooled plane `y` `[H', W']`.
    #[inline(always)]
    pub(super) fn max_forward(&self, x: &[f32], y: &mut [f32], [xp, tmp, acc]: &mut [Vec<f32>; 3]) {
        self.pad_with(x, xp, f32::NEG_INFINITY);
        self.window(xp, tmp, acc, max_nan);
        self.gather(acc, y);
    }

    /// One input-gradient plane `dx` `[H, W]` of max pooling.
    #[inline(always)]
    pub(super) fn max_backward(
        &self,
        x: &[f32],
        dy: &[f32],
        dx: &mut [f32],
        s: &mut [Vec<f32>; 5],
    ) {
        let [xp, tmp, m1, dy1, dxp] = s;
        let len = self.len;
        if len == 0 {
            dx.fill(0.0);
            return;
        }
        self.pad_with(x, xp, f32::NEG_INFINITY);
        self.window(xp, tmp, m1, max_nan);
        self.spread(dy, dy1);
        dxp.fill(0.0);
        let (m1, dy1, first) = (&m1[..len], &dy1[..len], &mut tmp[..len]);
        // The first tap, in row-major order, equal to each output's maximum: the last match
        // of a scan in reverse. Then each tap passes the gradients of the outputs it won.
        // (Branch-free selects, so both loops vectorize.)
        first.fill(f32::NAN);
        for (t, &off) in self.offsets.iter().enumerate().rev() {
            let tap = t as f32;
            for ((f, &x), &m) in first.iter_mut().zip(&xp[off..off + len]).zip(m1) {
                *f = if x == m { tap } else { *f };
            }
        }
        for (t, &off) in self.offsets.iter().enumerate() {
            let tap = t as f32;
            for ((d, &f), &g) in dxp[off..off + len].iter_mut().zip(&*first).zip(dy1) {
                *d += if f == tap { g } else { 0.0 };
            }
        }
        self.unpad(dxp, dx);
    }

    /// One average-pooled plane `y` `[H', W']`.
    #[inline(always)]
    pub(super) fn avg_forward(
        &self,
        x: &[f32],
        y: &mut [f32],
        [rows, cols]: &[Vec<f32>; 2],
        [xp, tmp, acc]: [&mut [f32]; 3],
    ) {
        self.pad(x, xp);
        self.window(xp, tmp, acc, |a, b| a + b);
        self.gather_with(acc, y, |r, c, v| v / (rows[r] * cols[c]));
    }

    /// One input-gradient plane `dx` `[H, W]` of average pooling: the transposed row and column
    /// passes of the output gradient over its divisors.
    #[inline(always)]
    pub(super) fn avg_backward(
        &self,
        dy: &[f32],
        dx: &mut [f32],
        [rows, cols]: &[Vec<f32>; 2],
        [g1, hg, dxp]: &mut [Vec<f32>; 3],
    ) {
        let ([kh, kw], len) = (self.g.kernel, self.len);
        dxp.fill(0.0);
        if len > 0 {
            let m = self.padded() + 1 - kw;
            self.spread_with(dy, g1, |r, c, v| v / (rows[r] * cols[c]));
            let hg = &mut hg[..m];
            hg.fill(0.0);
            for i in 0..kh {
                combine(&mut hg[i * self.wp..][..len], &g1[..len], |a, b| a + b);
            }
            for j in 0..kw {
                combine(&mut dxp[j..j + m], hg, |a, b| a + b);
            }
        }
        self.unpad(dxp, dx);
    }
}
