//! The AVX2 forms of the packed kernels (x86-64 with AVX2 and FMA, pulp's `V3`), picked at
//! run time by the dispatch in the parent module; each gives the portable form's integers.

use pulp::bytemuck::cast;
use pulp::x86::V3;
use pulp::{NullaryFnOnce, as_arrays, as_arrays_mut};
use std::arch::x86_64::__m256i;

use super::{MR, NR, Widen};
use crate::fixed::Lanes;

pub(super) struct Gemm<'a> {
    pub(super) simd: V3,
    pub(super) wp: &'a [i32],
    pub(super) cp: &'a [i32],
    pub(super) bias: &'a [i32],
    pub(super) np: usize,
    pub(super) acc: &'a mut [i32],
}

impl NullaryFnOnce for Gemm<'_> {
    type Output = ();
    #[inline(always)]
    fn call(self) {
        let Gemm { simd, wp, cp, bias, np, acc } = self;
        let (avx, avx2) = (simd.avx, simd.avx2);
        let kp = wp.len() / bias.len().max(1);
        for (pb, panel) in cp.chunks_exact(kp * NR).enumerate().take(np / NR) {
            let cols = as_arrays::<NR, i32>(panel).0;
            for (b, wb) in wp.chunks_exact(kp * MR).enumerate() {
                let w = as_arrays::<MR, i32>(wb).0;
                let mut a = [[avx._mm256_setzero_si256(); 2]; MR];
                for (r, ar) in a.iter_mut().enumerate() {
                    let v = avx._mm256_set1_epi32(bias[b * MR + r]);
                    *ar = [v, v];
                }
                for (c, w) in cols.iter().zip(w) {
                    let [lo, hi]: [__m256i; 2] = cast(*c);
                    for (ar, &wr) in a.iter_mut().zip(w) {
                        let wv = avx._mm256_set1_epi32(wr);
                        ar[0] = avx2._mm256_add_epi32(ar[0], avx2._mm256_madd_epi16(lo, wv));
                        ar[1] = avx2._mm256_add_epi32(ar[1], avx2._mm256_madd_epi16(hi, wv));
                    }
                }
                for (r, ar) in a.iter().enumerate() {
                    let dst = &mut acc[(b * MR + r) * np + pb * NR..][..NR];
                    dst.copy_from_slice(&cast::<[__m256i; 2], [i32; NR]>(*ar));
                }
            }
        }
    }
}

pub(super) struct PackCols<'a, T> {
    pub(super) simd: V3,
    pub(super) rows: &'a [T],
    pub(super) k: usize,
    pub(super) p: usize,
    pub(super) stride: usize,
    pub(super) floor: i16,
    pub(super) out: &'a mut [i32],
}

impl<T: Widen> NullaryFnOnce for PackCols<'_, T> {
    type Output = ();
    /// The whole panels' whole row pairs; [`super::pack_edges`] does the rest.
    #[inline(always)]
    fn call(self) {
        let PackCols { simd, rows, k, p, stride, floor, out } = self;
        let (avx, avx2) = (simd.avx, simd.avx2);
        let fl = avx._mm256_set1_epi16(floor);
        let kp = k.div_ceil(2);
        for (pb, panel) in out.chunks_exact_mut(kp * NR).enumerate().take(p / NR) {
            for (j, dst) in as_arrays_mut::<NR, i32>(panel).0.iter_mut().enumerate().take(k / 2) {
                let at = 2 * j * stride + pb * NR;
                let a = avx2._mm256_max_epi16(T::load16(simd, &rows[at..]), fl);
                let b = avx2._mm256_max_epi16(T::load16(simd, &rows[at + stride..]), fl);
                let lo = avx2._mm256_unpacklo_epi16(a, b);
                let hi = avx2._mm256_unpackhi_epi16(a, b);
                let first = avx2._mm256_permute2x128_si256::<0x20>(lo, hi);
                let second = avx2._mm256_permute2x128_si256::<0x31>(lo, hi);
                *dst = cast([first, second]);
            }
        }
    }
}

pub(super) struct Divide<'a> {
    pub(super) simd: V3,
    pub(super) sums: &'a [i32],
    pub(super) counts: &'a [i32],
    pub(super) z: i32,
    pub(super) ties_to_even: bool,
    pub(super) out: &'a mut [i8],
}

impl NullaryFnOnce for Divide<'_> {
    type Output = usize;
    #[inline(always)]
    fn call(self) -> usize {
        let Divide { simd, sums, counts, z, ties_to_even, out } = self;
        let (avx, avx2, sse2) = (simd.avx, simd.avx2, simd.sse2);
        let (one, zero) = (avx._mm256_set1_epi32(1), avx._mm256_setzero_si256());
        let (zv, lo, hi) =
            (avx._mm256_set1_epi32(z), avx._mm256_set1_epi32(-128), avx._mm256_set1_epi32(127));
        let (s8, _) = as_arrays::<8, i32>(sums);
        let (n8, _) = as_arrays::<8, i32>(counts);
        let (o8, _) = as_arrays_mut::<8, i8>(out);
        let mut done = 0;
        for ((s, n), o) in s8.iter().zip(n8).zip(o8.iter_mut()) {
            let s: __m256i = cast(*s);
            let n: __m256i = cast(*n);
            // The quotient's floor: the correctly rounded f32 quotient (below 256 in
            // magnitude, and 1/n or more from any integer it is not) has the same floor.
            let f = avx._mm256_div_ps(avx._mm256_cvtepi32_ps(s), avx._mm256_cvtepi32_ps(n));
            let q = avx._mm256_cvttps_epi32(avx._mm256_round_ps::<0x09>(f));
            let twice = avx2
                ._mm256_slli_epi32::<1>(avx2._mm256_sub_epi32(s, avx2._mm256_mullo_epi32(q, n)));
            let tie_up = if ties_to_even {
                avx2._mm256_cmpeq_epi32(avx2._mm256_and_si256(q, one), one)
            } else {
                avx2._mm256_cmpgt_epi32(q, avx2._mm256_sub_epi32(zero, one))
            };
            let up = avx2._mm256_or_si256(
                avx2._mm256_cmpgt_epi32(twice, n),
                avx2._mm256_and_si256(avx2._mm256_cmpeq_epi32(twice, n), tie_up),
            );
            // `up` is −1 where the quotient rounds up.
            let v = avx2._mm256_add_epi32(avx2._mm256_sub_epi32(q, up), zv);
            let v = avx2._mm256_min_epi32(avx2._mm256_max_epi32(v, lo), hi);
            let w = sse2._mm_packs_epi32(
                avx._mm256_castsi256_si128(v),
                avx2._mm256_extracti128_si256::<1>(v),
            );
            let bytes: [i8; 16] = cast(sse2._mm_packs_epi16(w, w));
            o.copy_from_slice(&bytes[..8]);
            done += 8;
        }
        done
    }
}

pub(super) struct Requantize<'a> {
    pub(super) simd: V3,
    pub(super) acc: &'a [i32],
    pub(super) m: f64,
    pub(super) zlh: [i32; 3],
    pub(super) off: i32,
    pub(super) dst: &'a mut [i8],
}

impl NullaryFnOnce for Requantize<'_> {
    type Output = bool;
    #[inline(always)]
    fn call(self) -> bool {
        let Requantize { simd, acc, m, zlh: [z, lo, hi], off, dst } = self;
        if acc.iter().fold(0u32, |m, a| m.max(a.unsigned_abs())) >= Lanes::F64_EXACT as u32 {
            return false;
        }
        let (avx, avx2, sse2) = (simd.avx, simd.avx2, simd.sse2);
        let (mv, zv) = (avx._mm256_set1_pd(m), avx._mm256_set1_pd(f64::from(z)));
        let (lv, hv) = (avx._mm256_set1_pd(f64::from(lo)), avx._mm256_set1_pd(f64::from(hi)));
        let offv = sse2._mm_set1_epi16(off as i16);
        let four = |x| {
            let v = avx._mm256_mul_pd(avx._mm256_cvtepi32_pd(x), mv);
            // Round to nearest, ties to even, no exceptions.
            let v = avx._mm256_add_pd(avx._mm256_round_pd::<0x08>(v), zv);
            avx._mm256_cvtpd_epi32(avx._mm256_min_pd(avx._mm256_max_pd(v, lv), hv))
        };
        let (a8, a_tail) = as_arrays::<8, i32>(acc);
        let (d8, d_tail) = as_arrays_mut::<8, i8>(dst);
        for (a, d) in a8.iter().zip(d8.iter_mut()) {
            let v: __m256i = cast(*a);
            let lo4 = four(avx._mm256_castsi256_si128(v));
            let hi4 = four(avx2._mm256_extracti128_si256::<1>(v));
            // On the grid, minus the offset: within i8, so the saturating packs are exact.
            let w = sse2._mm_sub_epi16(sse2._mm_packs_epi32(lo4, hi4), offv);
            let bytes: [i8; 16] = cast(sse2._mm_packs_epi16(w, w));
            d.copy_from_slice(&bytes[..8]);
        }
        let (zf, lf, hf) = (f64::from(z), f64::from(lo), f64::from(hi));
        for (d, &a) in d_tail.iter_mut().zip(a_tail) {
            let v = (f64::from(a) * m).round_ties_even() + zf;
            *d = ((v.clamp(lf, hf) as i32) - off) as i8;
        }
        true
    }
}

pub(super) struct Taps<'a> {
    pub(super) simd: V3,
    pub(super) x: &'a [i16],
    pub(super) at: &'a [[usize; 2]],
    pub(super) w: &'a [i32],
    pub(super) bias: i32,
    pub(super) acc: &'a mut [i32],
}

impl NullaryFnOnce for Taps<'_> {
    type Output = ();
    #[inline(always)]
    fn call(self) {
        let Taps { simd, x, at, w, bias, acc } = self;
        let (avx, avx2) = (simd.avx, simd.avx2);
        let b = avx._mm256_set1_epi32(bias);
        for (blk, out) in as_arrays_mut::<NR, i32>(acc).0.iter_mut().enumerate() {
            let i = blk * NR;
            // Lanes 0–3 and 8–11 of the block in `lo`, 4–7 and 12–15 in `hi` (the unpacks
            // work within each 128-bit half).
            let (mut lo, mut hi) = (b, b);
            for (o, &wp) in at.iter().zip(w) {
                let x0: __m256i = cast(load16(x, o[0] + i));
                let x1: __m256i = cast(load16(x, o[1] + i));
                let w = avx._mm256_set1_epi32(wp);
                let l = avx2._mm256_unpacklo_epi16(x0, x1);
                let h = avx2._mm256_unpackhi_epi16(x0, x1);
                lo = avx2._mm256_add_epi32(lo, avx2._mm256_madd_epi16(l, w));
                hi = avx2._mm256_add_epi32(hi, avx2._mm256_madd_epi16(h, w));
            }
            let first = avx2._mm256_permute2x128_si256::<0x20>(lo, hi);
            let second = avx2._mm256_permute2x128_si256::<0x31>(lo, hi);
            *out = cast([first, second]);
        }
    }
}

/// Sixteen i16 from `x[at..]`.
#[inline(always)]
fn load16(x: &[i16], at: usize) -> [i16; 16] {
    let mut v = [0i16; 16];
    v.copy_from_slice(&x[at..at + 16]);
    v
}
