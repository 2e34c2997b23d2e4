//! The runtime's loops over slices, each compiled for the widest instruction set the CPU has
//! (AVX2 on x86-64) and picked at run time by [`pulp::Arch::dispatch`].
//!
//! Each loop is the body of a [`pulp::WithSimd`] implementation, and everything it calls is
//! `#[inline(always)]`: the body must be inlined into pulp's function that enables the target
//! features, or the compiler vectorizes it for the baseline instruction set only (a closure
//! holding the same loop is not inlined, and runs several times slower).

use pulp::{Simd, WithSimd};

use crate::fixed::Lanes;
use crate::model::ActGrid;

/// `q` requantized onto `out` (already on its integer grid) and stored as i8.
#[inline(always)]
fn store(q: i32, out: &ActGrid) -> i8 {
    (q.clamp(out.qmin, out.qmax) - out.offset()) as i8
}

/// `dst[i] = store(M·v_i + z_out)` over the values `v`, one branch-free loop per rounding;
/// `exact_f64` when every |v| is below the bound of the f64 path.
#[inline(always)]
fn requantize_each(
    vals: impl Iterator<Item = i32>,
    exact_f64: bool,
    l: Lanes,
    out: &ActGrid,
    dst: &mut [i8],
) {
    let z = out.zero_point;
    if l.is_ties_to_even() && exact_f64 {
        let (zf, lo, hi) = (f64::from(z), f64::from(out.qmin), f64::from(out.qmax));
        let off = out.offset();
        for (o, v) in dst.iter_mut().zip(vals) {
            *o = (((l.ties_to_even_f64(v) + zf).clamp(lo, hi) as i32) - off) as i8;
        }
    } else if l.is_ties_to_even() {
        for (o, v) in dst.iter_mut().zip(vals) {
            *o = store(l.ties_to_even(v).saturating_add(z), out);
        }
    } else {
        for (o, v) in dst.iter_mut().zip(vals) {
            *o = store(l.apply(v).saturating_add(z), out);
        }
    }
}

struct Requantize<'a> {
    acc: &'a [i32],
    lanes: Lanes,
    out: &'a ActGrid,
    dst: &'a mut [i8],
}

impl WithSimd for Requantize<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, _: S) {
        let small =
            self.acc.iter().fold(0u32, |m, a| m.max(a.unsigned_abs())) < Lanes::F64_EXACT as u32;
        requantize_each(self.acc.iter().copied(), small, self.lanes, self.out, self.dst);
    }
}

/// `dst = store(M·acc + z_out)`: accumulators requantized onto `out`.
pub(crate) fn requantize(acc: &[i32], lanes: Lanes, out: &ActGrid, dst: &mut [i8]) {
    pulp::Arch::new().dispatch(Requantize { acc, lanes, out, dst });
}

struct Rescale<'a> {
    x: &'a [i8],
    z: i32,
    lanes: Lanes,
    out: &'a ActGrid,
    dst: &'a mut [i8],
}

impl WithSimd for Rescale<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, _: S) {
        let z = self.z;
        // x − z is at most 9 bits past z: always in the f64 path's range for a small z.
        let exact = z.unsigned_abs() < 1 << 20;
        let vals = self.x.iter().map(|&q| i32::from(q) - z);
        requantize_each(vals, exact, self.lanes, self.out, self.dst);
    }
}

/// `dst = store(M·(x − z) + z_out)`: stored values moved onto the grid `out`.
pub(crate) fn rescale(x: &[i8], z: i32, lanes: Lanes, out: &ActGrid, dst: &mut [i8]) {
    pulp::Arch::new().dispatch(Rescale { x, z, lanes, out, dst });
}

struct StoreSum<'a> {
    acc: &'a [i32],
    out: &'a ActGrid,
    dst: &'a mut [i8],
}

impl WithSimd for StoreSum<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, _: S) {
        let z = self.out.zero_point;
        for (o, &a) in self.dst.iter_mut().zip(self.acc) {
            *o = store(a.saturating_add(z), self.out);
        }
    }
}

/// `dst = store(acc + z_out)`: a sum already on the grid `out`, stored.
pub(crate) fn store_sum(acc: &[i32], out: &ActGrid, dst: &mut [i8]) {
    pulp::Arch::new().dispatch(StoreSum { acc, out, dst });
}

struct AddScaled<'a> {
    acc: &'a mut [i32],
    x: &'a [i8],
    z: i32,
    lanes: Lanes,
}

impl WithSimd for AddScaled<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, _: S) {
        let l = self.lanes;
        if l.is_ties_to_even() && self.z.unsigned_abs() < 1 << 20 {
            let (lo, hi) = (f64::from(i32::MIN), f64::from(i32::MAX));
            for (a, &q) in self.acc.iter_mut().zip(self.x) {
                let v = l.ties_to_even_f64(i32::from(q) - self.z).clamp(lo, hi) as i32;
                *a = a.saturating_add(v);
            }
        } else if l.is_ties_to_even() {
            for (a, &q) in self.acc.iter_mut().zip(self.x) {
                *a = a.saturating_add(l.ties_to_even(i32::from(q) - self.z));
            }
        } else {
            for (a, &q) in self.acc.iter_mut().zip(self.x) {
                *a = a.saturating_add(l.apply(i32::from(q) - self.z));
            }
        }
    }
}

/// `acc += M·(x − z)`, saturating: one operand of a sum.
pub(crate) fn add_scaled(acc: &mut [i32], x: &[i8], z: i32, lanes: Lanes) {
    pulp::Arch::new().dispatch(AddScaled { acc, x, z, lanes });
}

struct Gemm<'a> {
    w: &'a [i32],
    cols: &'a [i16],
    bias: &'a [i32],
    acc: &'a mut [i32],
}

impl WithSimd for Gemm<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, _: S) {
        let Gemm { w, cols, bias, acc } = self;
        let p = acc.len() / bias.len().max(1);
        let k = w.len() / bias.len().max(1);
        // Row by row: a multiply-add of one unfolded row into one channel's accumulators,
        // over contiguous positions (both rows stay in L1).
        for ((row, wc), &b) in acc.chunks_exact_mut(p).zip(w.chunks_exact(k)).zip(bias) {
            row.fill(b);
            for (x, &wv) in cols.chunks_exact(p).zip(wc) {
                if wv == 0 {
                    continue;
                }
                for (a, &xv) in row.iter_mut().zip(x) {
                    *a = a.wrapping_add(wv.wrapping_mul(i32::from(xv)));
                }
            }
        }
    }
}

/// `acc[co][p] = bias[co] + Σ_k w[co][k]·cols[k][p]` for the `bias.len()` channels of a
/// group: `w` is `[co][k]`, `cols` `[k][p]`, `acc` `[co][p]`. Wrapping i32 arithmetic, as
/// the direct kernel's.
pub(crate) fn gemm(w: &[i32], cols: &[i16], bias: &[i32], acc: &mut [i32]) {
    pulp::Arch::new().dispatch(Gemm { w, cols, bias, acc });
}

struct DepthwiseRows<'a> {
    plane: &'a [i16],
    taps: &'a [i32],
    kernel: [usize; 2],
    dilation: usize,
    wp: usize,
    bias: i32,
    acc: &'a mut [i32],
}

impl WithSimd for DepthwiseRows<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, _: S) {
        let DepthwiseRows { plane, taps, kernel: [kh, kw], dilation: d, wp, bias, acc } = self;
        acc.fill(bias);
        let n = acc.len();
        for ky in 0..kh {
            for kx in 0..kw {
                let wv = taps[ky * kw + kx];
                let start = ky * d * wp + kx * d;
                // The last row's tail may run past the plane: those columns are never kept.
                let len = n.min(plane.len() - start);
                for (a, &xv) in acc[..len].iter_mut().zip(&plane[start..start + len]) {
                    *a = a.wrapping_add(wv.wrapping_mul(i32::from(xv)));
                }
            }
        }
    }
}

/// A depthwise stride-1 convolution of one channel over whole padded rows (`wp` wide):
/// `acc[i] = bias + Σ_tap w·plane[i + ky·d·wp + kx·d]` for `i < acc.len()`.
pub(crate) fn depthwise_rows(
    plane: &[i16],
    taps: &[i32],
    kernel: [usize; 2],
    dilation: usize,
    wp: usize,
    bias: i32,
    acc: &mut [i32],
) {
    pulp::Arch::new().dispatch(DepthwiseRows { plane, taps, kernel, dilation, wp, bias, acc });
}

struct DepthwiseCols<'a> {
    cols: &'a [i16],
    taps: &'a [i32],
    bias: i32,
    acc: &'a mut [i32],
}

impl WithSimd for DepthwiseCols<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, _: S) {
        let DepthwiseCols { cols, taps, bias, acc } = self;
        acc.fill(bias);
        let p = acc.len();
        for (row, &wv) in cols.chunks_exact(p).zip(taps) {
            for (a, &xv) in acc.iter_mut().zip(row) {
                *a = a.wrapping_add(wv.wrapping_mul(i32::from(xv)));
            }
        }
    }
}

/// One channel of a depthwise convolution from its unfolded input (`cols` `[taps][p]`):
/// `acc[p] = bias + Σ_tap w·cols[tap][p]`.
pub(crate) fn depthwise_cols(cols: &[i16], taps: &[i32], bias: i32, acc: &mut [i32]) {
    pulp::Arch::new().dispatch(DepthwiseCols { cols, taps, bias, acc });
}

struct Pool<'a> {
    plane: &'a [i8],
    /// `[h, w]` in, `[oh, ow]` out.
    hw: [usize; 2],
    ohw: [usize; 2],
    /// `[kernel, stride, padding]`.
    window: [usize; 3],
    max: bool,
    z: i32,
    ties_to_even: bool,
    /// Scratch: `h × ow` row results and `oh × ow` results.
    rows: &'a mut [i32],
    acc: &'a mut [i32],
    out: &'a mut [i8],
}

/// The output positions `o` (of `n_out`) whose window tap `t` reads an input inside `0..n`.
#[inline(always)]
fn tap_range(n: usize, n_out: usize, [_, s, p]: [usize; 3], t: usize) -> std::ops::Range<usize> {
    // o·s + t − p ∈ [0, n)  ⇔  o ∈ [ceil((p − t)/s), floor((n − 1 + p − t)/s)].
    let lo = p.saturating_sub(t).div_ceil(s);
    let hi = if n + p > t { ((n - 1 + p - t) / s + 1).min(n_out) } else { 0 };
    lo.min(hi)..hi
}

impl WithSimd for Pool<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, _: S) {
        let Pool { plane, hw: [h, w], ohw: [oh, ow], window, max, z, ties_to_even, rows, acc, out } =
            self;
        let [k, s, p] = window;
        let init = if max { i32::MIN } else { 0 };
        // Along rows: each row's window results at every output column.
        rows[..h * ow].fill(init);
        for dx in 0..k {
            let cols = tap_range(w, ow, window, dx);
            if cols.is_empty() {
                continue;
            }
            for y in 0..h {
                let src = &plane[y * w..(y + 1) * w];
                let dst = &mut rows[y * ow..(y + 1) * ow];
                if s == 1 {
                    let x0 = cols.start + dx - p;
                    let src = &src[x0..x0 + cols.len()];
                    let dst = &mut dst[cols.clone()];
                    if max {
                        for (d, &q) in dst.iter_mut().zip(src) {
                            *d = (*d).max(i32::from(q));
                        }
                    } else {
                        for (d, &q) in dst.iter_mut().zip(src) {
                            *d += i32::from(q);
                        }
                    }
                } else {
                    for ox in cols.clone() {
                        let q = i32::from(src[ox * s + dx - p]);
                        dst[ox] = if max { dst[ox].max(q) } else { dst[ox] + q };
                    }
                }
            }
        }
        // Down columns: whole output rows at a time.
        acc[..oh * ow].fill(init);
        for dy in 0..k {
            for oy in tap_range(h, oh, window, dy) {
                let y = oy * s + dy - p;
                let src = &rows[y * ow..(y + 1) * ow];
                let dst = &mut acc[oy * ow..(oy + 1) * ow];
                if max {
                    for (d, &v) in dst.iter_mut().zip(src) {
                        *d = (*d).max(v);
                    }
                } else {
                    for (d, &v) in dst.iter_mut().zip(src) {
                        *d += v;
                    }
                }
            }
        }
        if max {
            for (o, &v) in out.iter_mut().zip(&acc[..oh * ow]) {
                *o = v.clamp(-128, 127) as i8;
            }
            return;
        }
        // Average over the in-image elements: round((Σq − n·z)/n) + z, with n the window's
        // rows in the image times its columns in the image.
        // Columns in the image per output column (scratch: the first row of `rows`).
        let cw = &mut rows[..ow];
        for (ox, c) in cw.iter_mut().enumerate() {
            *c = tap_count(w, window, ox) as i32;
        }
        for oy in 0..oh {
            let rn = tap_count(h, window, oy) as i32;
            for ox in 0..ow {
                let n = rn * cw[ox];
                let sum = acc[oy * ow + ox] - n * z;
                let n = n.max(1);
                // floor of the correctly rounded quotient is exact: |sum| < 2^20, n ≤ 256.
                let q = (f64::from(sum) / f64::from(n)).floor() as i32;
                let twice = 2 * (sum - q * n);
                let tie_up = if ties_to_even { q & 1 == 1 } else { q >= 0 };
                let up = twice > n || (twice == n && tie_up);
                out[oy * ow + ox] = (q + i32::from(up) + z).clamp(-128, 127) as i8;
            }
        }
    }
}

/// Window taps of output `o` that fall inside `0..n`.
#[inline(always)]
fn tap_count(n: usize, [k, s, p]: [usize; 3], o: usize) -> usize {
    let start = (o * s) as isize - p as isize;
    let lo = start.max(0);
    let hi = (start + k as isize).min(n as isize);
    (hi - lo).max(0) as usize
}

/// Max or average (padding excluded) pooling of one channel `plane` (`h × w`, i8 storage,
/// zero point `z` in storage) into `out` (`oh × ow`); `rows` and `acc` are scratch of at least
/// `h·ow` and `oh·ow`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn pool_plane(
    plane: &[i8],
    hw: [usize; 2],
    ohw: [usize; 2],
    window: [usize; 3],
    max: bool,
    z: i32,
    ties_to_even: bool,
    rows: &mut [i32],
    acc: &mut [i32],
    out: &mut [i8],
) {
    pulp::Arch::new().dispatch(Pool {
        plane,
        hw,
        ohw,
        window,
        max,
        z,
        ties_to_even,
        rows,
        acc,
        out,
    });
}
