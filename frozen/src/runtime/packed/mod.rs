//! Packed integer kernels built on the i16 pair product (`vpmaddwd`: two i16×i16 products
//! summed into one i32 lane), written with AVX2 intrinsics where the CPU has them and as plain
//! loops on the same packed layouts elsewhere; both give the same integers.
//!
//! - [`gemm`]: a convolution's matrix product. Weights are packed `[co/MR][k/2][MR]` and the
//!   unfolded input in panels `[p/NR][k/2][NR]`, each lane holding the i16 pair of rows
//!   `2j, 2j+1`; a 4 × 16 block of outputs lives in eight registers over the whole `k`.
//! - [`taps`]: a depthwise convolution over whole rows of a padded plane (or of its stride
//!   phases): `acc[i] = bias + Σ_t w_t·x[o_t + i]`, two taps per pair product.
//!
//! Operands are i8 storage values and i8 weights widened to i16 (a flipped channel's −128 becomes
//! 128), so a pair sum is at most 2·128·128 and never overflows; the accumulators add in
//! wrapping i32 arithmetic, as the direct kernel's, and addition order does not change them.

/// Output channels per register block of [`gemm`].
pub(crate) const MR: usize = 4;
/// Output positions per register block of [`gemm`] (two 8-lane registers).
pub(crate) const NR: usize = 16;

/// Two i16 in one i32 lane as the pair product reads them: `lo` in the low half.
#[inline(always)]
fn pair(lo: i16, hi: i16) -> i32 {
    (u32::from(lo as u16) | (u32::from(hi as u16) << 16)) as i32
}

/// The two halves of a pair.
#[inline(always)]
fn unpair(v: i32) -> (i32, i32) {
    (i32::from(v as i16), v >> 16)
}

/// `a·b` of two pairs, summed: the scalar reading of `vpmaddwd`.
#[inline(always)]
fn madd(a: i32, b: i32) -> i32 {
    let ((a0, a1), (b0, b1)) = (unpair(a), unpair(b));
    (a0 * b0).wrapping_add(a1 * b1)
}

/// Weights `[co][k]` (i8 values widened, sign flips applied) packed for [`gemm`]:
/// `[co/MR][k/2][MR]` pairs, channels and `k` padded with zeros.
pub(crate) fn pack_weights(w: &[i32], co: usize, k: usize) -> Vec<i32> {
    let (cb, kp) = (co.div_ceil(MR), k.div_ceil(2));
    let at = |c: usize, j: usize| if c < co && j < k { w[c * k + j] as i16 } else { 0 };
    let mut out = vec![0; cb * kp * MR];
    for b in 0..cb {
        for j in 0..kp {
            for r in 0..MR {
                let c = b * MR + r;
                out[(b * kp + j) * MR + r] = pair(at(c, 2 * j), at(c, 2 * j + 1));
            }
        }
    }
    out
}

/// Pairs per packed column panel of `k` rows.
pub(crate) fn panel_len(k: usize) -> usize {
    k.div_ceil(2) * NR
}

/// A stored value the packing widens to i16: i8 activations, or i16 unfolded rows.
pub(crate) trait Widen: Copy {
    fn widen(self) -> i16;
    /// Sixteen values from the start of `s`, widened.
    #[cfg(target_arch = "x86_64")]
    fn load16(simd: pulp::x86::V3, s: &[Self]) -> std::arch::x86_64::__m256i;
}

impl Widen for i8 {
    #[inline(always)]
    fn widen(self) -> i16 {
        i16::from(self)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn load16(simd: pulp::x86::V3, s: &[i8]) -> std::arch::x86_64::__m256i {
        let mut v = [0i8; 16];
        v.copy_from_slice(&s[..16]);
        simd.avx2._mm256_cvtepi8_epi16(pulp::bytemuck::cast(v))
    }
}

impl Widen for i16 {
    #[inline(always)]
    fn widen(self) -> i16 {
        self
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn load16(_: pulp::x86::V3, s: &[i16]) -> std::arch::x86_64::__m256i {
        let mut v = [0i16; 16];
        v.copy_from_slice(&s[..16]);
        pulp::bytemuck::cast(v)
    }
}

/// Rows `[k][p]` (`stride` apart), each value widened and raised to at least `floor` (a ReLU
/// in storage units, or `i16::MIN` for none), packed into panels `[p/NR][k/2][NR]` of pairs
/// (`out` is `p.div_ceil(NR)·panel_len(k)` long; padding is zero).
pub(crate) fn pack_cols<T: Widen>(
    rows: &[T],
    k: usize,
    p: usize,
    stride: usize,
    floor: i16,
    out: &mut [i32],
) {
    #[cfg(target_arch = "x86_64")]
    if let Some(simd) = pulp::x86::V3::try_new() {
        simd.vectorize(v3::PackCols { simd, rows, k, p, stride, floor, out: &mut *out });
        return pack_edges(rows, k, p, stride, floor, out, p / NR, k / 2);
    }
    pack_edges(rows, k, p, stride, floor, out, 0, 0);
}

/// The pairs of [`pack_cols`] outside the first `full` panels' first `pairs` row pairs.
#[allow(clippy::too_many_arguments)]
fn pack_edges<T: Widen>(
    rows: &[T],
    k: usize,
    p: usize,
    stride: usize,
    floor: i16,
    out: &mut [i32],
    full: usize,
    pairs: usize,
) {
    let kp = k.div_ceil(2);
    let f = |v: T| v.widen().max(floor);
    for (pb, panel) in out.chunks_exact_mut(kp * NR).enumerate() {
        let from = if pb < full { pairs } else { 0 };
        for (j, dst) in panel.chunks_exact_mut(NR).enumerate().skip(from) {
            let r0 = &rows[2 * j * stride..];
            for (i, d) in dst.iter_mut().enumerate() {
                let at = pb * NR + i;
                let x0 = if at < p { f(r0[at]) } else { 0 };
                let x1 = if at < p && 2 * j + 1 < k { f(r0[stride + at]) } else { 0 };
                *d = pair(x0, x1);
            }
        }
    }
}

/// `acc[c][i] = bias[c] + Σ_j w[c][j]·cols[j][i]`: `wp` from [`pack_weights`] (`bias` padded to
/// whole blocks of [`MR`]), `cp` from [`pack_cols`], `acc` `[bias.len()][np]` with `np` the
/// padded positions (a multiple of [`NR`]).
pub(crate) fn gemm(wp: &[i32], cp: &[i32], bias: &[i32], np: usize, acc: &mut [i32]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(simd) = pulp::x86::V3::try_new() {
        return simd.vectorize(v3::Gemm { simd, wp, cp, bias, np, acc });
    }
    gemm_portable(wp, cp, bias, np, acc);
}

/// [`gemm`] without intrinsics.
pub(crate) fn gemm_portable(wp: &[i32], cp: &[i32], bias: &[i32], np: usize, acc: &mut [i32]) {
    let kp = wp.len() / bias.len().max(1);
    for (pb, panel) in cp.chunks_exact(kp * NR).enumerate().take(np / NR) {
        for (b, wb) in wp.chunks_exact(kp * MR).enumerate() {
            for r in 0..MR {
                let c = b * MR + r;
                let mut out = [bias[c]; NR];
                for (cols, w) in panel.chunks_exact(NR).zip(wb.chunks_exact(MR)) {
                    for (o, &x) in out.iter_mut().zip(cols) {
                        *o = o.wrapping_add(madd(x, w[r]));
                    }
                }
                acc[c * np + pb * NR..][..NR].copy_from_slice(&out);
            }
        }
    }
}

/// Tap offsets paired for [`taps`] (an odd last tap pairs with itself).
pub(crate) fn pair_offsets(at: &[usize]) -> Vec<[usize; 2]> {
    at.chunks(2).map(|t| [t[0], *t.last().unwrap_or(&t[0])]).collect()
}

/// Tap weights paired for [`taps`], as [`pair_offsets`] pairs them (an odd last tap's partner
/// weighs zero).
pub(crate) fn pair_weights(w: &[i32]) -> Vec<i32> {
    w.chunks(2).map(|t| pair(t[0] as i16, if t.len() == 2 { t[1] as i16 } else { 0 })).collect()
}

/// `acc[i] = bias + Σ_t w_t·x[o_t + i]` for `i < acc.len()` (a multiple of [`NR`]), the taps
/// paired by [`pair_offsets`] and [`pair_weights`]; `x` must hold every `o_t + acc.len()`.
pub(crate) fn taps(x: &[i16], at: &[[usize; 2]], w: &[i32], bias: i32, acc: &mut [i32]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(simd) = pulp::x86::V3::try_new() {
        return simd.vectorize(v3::Taps { simd, x, at, w, bias, acc });
    }
    taps_portable(x, at, w, bias, acc);
}

/// [`taps`] without intrinsics.
pub(crate) fn taps_portable(x: &[i16], at: &[[usize; 2]], w: &[i32], bias: i32, acc: &mut [i32]) {
    acc.fill(bias);
    for (o, &wp) in at.iter().zip(w) {
        let (w0, w1) = unpair(wp);
        let (a, b) = (&x[o[0]..o[0] + acc.len()], &x[o[1]..o[1] + acc.len()]);
        for ((o, &x0), &x1) in acc.iter_mut().zip(a).zip(b) {
            *o = o.wrapping_add((w0 * i32::from(x0)).wrapping_add(w1 * i32::from(x1)));
        }
    }
}

/// `dst[i] = clamp(round_half_even(acc[i]·m) + z, lo, hi) − off` in f64 with AVX2, for a
/// multiplier `m` (`M0·2^-shift`, exact in f64) and `|acc[i]| < 2^22`, where every product is
/// exact and the rounding is the fixed-point one (see `Lanes::ties_to_even_f64`). Returns
/// false, writing nothing, where the CPU lacks AVX2 or an accumulator is out of that range.
pub(crate) fn requantize_even(
    acc: &[i32],
    m: f64,
    [z, lo, hi, off]: [i32; 4],
    dst: &mut [i8],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if let Some(simd) = pulp::x86::V3::try_new() {
        return simd.vectorize(v3::Requantize { simd, acc, m, zlh: [z, lo, hi], off, dst });
    }
    let _ = (acc, m, z, lo, hi, off, dst);
    false
}

/// `out[i] = clamp(round(sums[i] / counts[i]) + z, -128, 127)`, ties to even or away from
/// zero, with AVX2 (`|sums[i]| ≤ 255·counts[i]`, `0 < counts[i] < 2^16`). Returns how many
/// leading outputs it wrote (a multiple of 8; none without AVX2).
pub(crate) fn divide_rounded(
    sums: &[i32],
    counts: &[i32],
    z: i32,
    ties_to_even: bool,
    out: &mut [i8],
) -> usize {
    #[cfg(target_arch = "x86_64")]
    if let Some(simd) = pulp::x86::V3::try_new() {
        return simd.vectorize(v3::Divide { simd, sums, counts, z, ties_to_even, out });
    }
    let _ = (sums, counts, z, ties_to_even, out);
    0
}

#[cfg(target_arch = "x86_64")]
mod v3;

#[cfg(test)]
mod tests {
    use super::*;

    fn xorshift(seed: u64) -> impl FnMut() -> u64 {
        let mut s = seed | 1;
        move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        }
    }

    /// The packed product (both forms) against the plain triple loop, on shapes that leave
    /// partial channel blocks, odd `k` and partial panels, with weights and inputs at the
    /// extremes of their ranges.
    #[test]
    fn gemm_equals_the_plain_product() {
        let mut next = xorshift(7);
        for &(co, k, p) in &[(1, 1, 1), (3, 5, 17), (8, 48, 49), (5, 7, 33), (16, 96, 196)] {
            let w: Vec<i32> = (0..co * k)
                .map(|i| if i % 11 == 0 { 128 } else { i32::from(next() as u8 as i8) })
                .collect();
            let x: Vec<i16> = (0..k * p)
                .map(|i| if i % 7 == 0 { -128 } else { i16::from(next() as u8 as i8) })
                .collect();
            let bias: Vec<i32> = (0..co).map(|_| next() as i32).collect();
            let want: Vec<i32> = (0..co)
                .flat_map(|c| {
                    let (w, x, b) = (&w, &x, bias[c]);
                    (0..p).map(move |i| {
                        (0..k)
                            .fold(b, |a, j| a.wrapping_add(w[c * k + j] * i32::from(x[j * p + i])))
                    })
                })
                .collect();
            let wp = pack_weights(&w, co, k);
            let np = p.div_ceil(NR) * NR;
            let mut cp = vec![0; np / NR * panel_len(k)];
            pack_cols(&x, k, p, p, i16::MIN, &mut cp);
            let mut plain = vec![0; cp.len()];
            pack_edges(&x, k, p, p, i16::MIN, &mut plain, 0, 0);
            assert_eq!(cp, plain, "packing, co {co} k {k} p {p}");
            let mut bp = bias.clone();
            bp.resize(co.div_ceil(MR) * MR, 0);
            for fast in [true, false] {
                let mut acc = vec![0; bp.len() * np];
                if fast {
                    gemm(&wp, &cp, &bp, np, &mut acc);
                } else {
                    gemm_portable(&wp, &cp, &bp, np, &mut acc);
                }
                let got: Vec<i32> =
                    (0..co).flat_map(|c| acc[c * np..c * np + p].to_vec()).collect();
                assert_eq!(got, want, "co {co} k {k} p {p} fast {fast}");
            }
        }
    }

    /// The tap sums (both forms) against the plain loop, for odd and even tap counts.
    #[test]
    fn taps_equal_the_plain_sum() {
        let mut next = xorshift(9);
        for &(n, t) in &[(16, 1), (32, 9), (48, 25), (64, 2)] {
            let x: Vec<i16> = (0..n + 200).map(|_| i16::from(next() as u8 as i8)).collect();
            let taps: Vec<(usize, i32)> = (0..t)
                .map(|i| {
                    (
                        (next() % 150) as usize,
                        if i == 0 { 128 } else { i32::from(next() as u8 as i8) },
                    )
                })
                .collect();
            let bias = next() as i32;
            let want: Vec<i32> = (0..n)
                .map(|i| {
                    taps.iter().fold(bias, |a, &(o, w)| a.wrapping_add(w * i32::from(x[o + i])))
                })
                .collect();
            let at = pair_offsets(&taps.iter().map(|t| t.0).collect::<Vec<_>>());
            let w = pair_weights(&taps.iter().map(|t| t.1).collect::<Vec<_>>());
            for fast in [true, false] {
                let mut acc = vec![0; n];
                if fast {
                    super::taps(&x, &at, &w, bias, &mut acc);
                } else {
                    taps_portable(&x, &at, &w, bias, &mut acc);
                }
                assert_eq!(acc, want, "n {n} taps {t} fast {fast}");
            }
        }
    }
}
