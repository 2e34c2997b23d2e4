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
    let zlho = [out.zero_point, out.qmin, out.qmax, out.offset()];
    if lanes.is_ties_to_even() && super::packed::requantize_even(acc, lanes.f64_factor(), zlho, dst)
    {
        return;
    }
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

struct SumTables<'a> {
    operands: &'a [&'a [i8]],
    tables: &'a [[i32; 256]],
    out: &'a ActGrid,
    dst: &'a mut [i8],
}

impl WithSimd for SumTables<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, _: S) {
        let SumTables { operands, tables, out, dst } = self;
        let z = out.zero_point;
        let at = |t: &[i32; 256], q: i8| t[usize::from(q as u8)];
        for (i, d) in dst.iter_mut().enumerate() {
            let sum =
                operands.iter().zip(tables).fold(0i32, |s, (x, t)| s.saturating_add(at(t, x[i])));
            *d = store(sum.saturating_add(z), out);
        }
    }
}

/// `dst = store(Σ_j table_j[x_j] + z_out)`: a sum of operands, each through its table of
/// `M_j·(q − z_j)` per stored value, added in operand order with saturation (as the direct
/// path adds them).
pub(crate) fn sum_tables(operands: &[&[i8]], tables: &[[i32; 256]], out: &ActGrid, dst: &mut [i8]) {
    pulp::Arch::new().dispatch(SumTables { operands, tables, out, dst });
}

struct MaxTaps<'a> {
    x: &'a [i16],
    at: &'a [usize],
    best: &'a mut [i16],
}

impl WithSimd for MaxTaps<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, _: S) {
        let MaxTaps { x, at, best } = self;
        best.fill(i16::MIN);
        let n = best.len();
        for &o in at {
            for (b, &v) in best.iter_mut().zip(&x[o..o + n]) {
                *b = (*b).max(v);
            }
        }
    }
}

/// `best[i] = max_t x[o_t + i]` over the tap offsets `at`.
pub(crate) fn max_taps(x: &[i16], at: &[usize], best: &mut [i16]) {
    pulp::Arch::new().dispatch(MaxTaps { x, at, best });
}

struct DivideRounded<'a> {
    sums: &'a [i32],
    counts: &'a [i32],
    z: i32,
    ties_to_even: bool,
    out: &'a mut [i8],
}

impl WithSimd for DivideRounded<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, _: S) {
        let DivideRounded { sums, counts, z, ties_to_even, out } = self;
        for ((o, &sum), &n) in out.iter_mut().zip(sums).zip(counts) {
            let n = n.max(1);
            // |sum| ≤ 255·n with n < 2^16: the quotient is below 256 and at least 1/n from
            // any integer it is not, so the correctly rounded f32 quotient has the same floor.
            let q = (sum as f32 / n as f32).floor() as i32;
            let twice = 2 * (sum - q * n);
            let tie_up = (ties_to_even & (q & 1 == 1)) | (!ties_to_even & (q >= 0));
            let up = (twice > n) | ((twice == n) & tie_up);
            *o = (q + i32::from(up) + z).clamp(-128, 127) as i8;
        }
    }
}

/// `out = round(sum / count) + z`, clamped to i8, ties as the model rounds: an average of
/// `count` stored values' `q − z` (`count < 2^16`, `|sum| ≤ 255·count`).
pub(crate) fn divide_rounded(
    sums: &[i32],
    counts: &[i32],
    z: i32,
    ties_to_even: bool,
    out: &mut [i8],
) {
    let done = super::packed::divide_rounded(sums, counts, z, ties_to_even, out);
    let (sums, counts, out) = (&sums[done..], &counts[done..], &mut out[done..]);
    pulp::Arch::new().dispatch(DivideRounded { sums, counts, z, ties_to_even, out });
}
