//! Element loops shared by the flex kernels (`depthwise_conv`, `batch_norm`, `pool2d`,
//! `fake_quant`), written so that LLVM vectorizes them (independent lanes, no reassociation
//! needed), and the per-plane parallel loop they run under.

/// `out[k] = Σ_t w_t · src[k + off_t]` over the `taps` `(off_t, w_t)` for every `k`, each entry
/// summed from 0 in the taps' order: bitwise what one `dst[k] += w_t · src[k + off_t]` pass per
/// tap over a zeroed `out` gives, with each block of `out` kept in registers across the taps
/// instead of being loaded and stored once per tap.
///
/// # Panics
/// If `src` is shorter than `out.len() + off_t` for a tap.
#[inline(always)]
pub(crate) fn correlate(out: &mut [f32], src: &[f32], taps: &[(usize, f32)]) {
    let n = out.len();
    if n >= 64 {
        blocks::<64>(out, src, taps);
    } else if n >= 16 {
        blocks::<16>(out, src, taps);
    } else {
        for (k, o) in out.iter_mut().enumerate() {
            *o = taps.iter().fold(0.0, |acc, &(off, w)| acc + w * src[k + off]);
        }
    }
}

/// [`correlate`] in blocks of `B ≤ out.len()` entries; the last block ends at `out.len()` and
/// may overlap the one before it (the overlap is computed twice, to the same values).
#[inline(always)]
fn blocks<const B: usize>(out: &mut [f32], src: &[f32], taps: &[(usize, f32)]) {
    let n = out.len();
    let mut start = 0;
    loop {
        let base = start.min(n - B);
        let mut acc = [0.0f32; B];
        for &(off, w) in taps {
            let s = &src[base + off..][..B];
            for k in 0..B {
                acc[k] += w * s[k];
            }
        }
        out[base..base + B].copy_from_slice(&acc);
        if base + B == n {
            break;
        }
        start += B;
    }
}

/// `Σ a[i] · b[i]` in eight interleaved partial sums (so the loop vectorizes), combined in a
/// fixed order.
#[inline(always)]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let [d] = dots_of::<1>(&a[..n], b, &[0]);
    d
}

/// [`dot`]`(a, &b[off..off + a.len()])` for every offset, into `out`, bitwise, with up to eight
/// offsets in one pass over `a` (each of `a`'s chunks loaded once for all of them).
///
/// # Panics
/// If `b` is shorter than `a.len() + off` for an offset, or `out` shorter than `offs`.
#[inline(always)]
pub(crate) fn dots(a: &[f32], b: &[f32], offs: &[usize], out: &mut [f32]) {
    let mut groups = offs.chunks_exact(8);
    let mut outs = out.chunks_exact_mut(8);
    for (g, o) in groups.by_ref().zip(outs.by_ref()) {
        o.copy_from_slice(&dots_of::<8>(a, b, g.try_into().expect("a chunk of eight")));
    }
    for (&off, o) in groups.remainder().iter().zip(outs.into_remainder()) {
        *o = dot(a, &b[off..off + a.len()]);
    }
}

/// [`dots`] for `G` offsets at once, each `Σ a[i] · b[off + i]` in eight interleaved partial
/// sums combined by [`fold8`].
#[inline(always)]
fn dots_of<const G: usize>(a: &[f32], b: &[f32], offs: &[usize; G]) -> [f32; G] {
    let n = a.len();
    let bs: [&[f32]; G] = offs.map(|off| &b[off..off + n]);
    let mut acc = [[0.0f32; 8]; G];
    let whole = n - n % 8;
    for i in (0..whole).step_by(8) {
        let x = &a[i..i + 8];
        for (accg, bg) in acc.iter_mut().zip(&bs) {
            let y = &bg[i..i + 8];
            for k in 0..8 {
                accg[k] += x[k] * y[k];
            }
        }
    }
    let mut res = [0.0f32; G];
    for ((r, accg), bg) in res.iter_mut().zip(acc).zip(&bs) {
        let mut tail = 0.0;
        for (x, y) in a[whole..].iter().zip(&bg[whole..]) {
            tail += x * y;
        }
        *r = fold8(accg, tail);
    }
    res
}

/// Eight partial sums and a tail combined in the fixed order of [`dot`] and [`sum`].
#[inline(always)]
fn fold8(acc: [f32; 8], tail: f32) -> f32 {
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// `Σ a[i]` in eight interleaved partial sums, combined in a fixed order.
#[inline(always)]
pub(crate) fn sum(a: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let chunks = a.chunks_exact(8);
    let rest = chunks.remainder();
    for x in chunks {
        for k in 0..8 {
            acc[k] += x[k];
        }
    }
    let tail: f32 = rest.iter().sum();
    fold8(acc, tail)
}

/// `[dot(a, b), sum(a)]` in one pass over `a`: bitwise [`dot`] and [`sum`], each with its
/// own eight partial sums (two independent chains, where each alone waits on one).
#[inline(always)]
pub(crate) fn dot_and_sum(a: &[f32], b: &[f32]) -> [f32; 2] {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let (mut d, mut s) = ([0.0f32; 8], [0.0f32; 8]);
    let whole = n - n % 8;
    for i in (0..whole).step_by(8) {
        let (x, y) = (&a[i..i + 8], &b[i..i + 8]);
        for k in 0..8 {
            d[k] += x[k] * y[k];
            s[k] += x[k];
        }
    }
    let mut tail = 0.0;
    for (x, y) in a[whole..].iter().zip(&b[whole..]) {
        tail += x * y;
    }
    let rest: f32 = a[whole..].iter().sum();
    [fold8(d, tail), fold8(s, rest)]
}

/// `Σ (a[i] − m)²` in eight interleaved partial sums, combined in a fixed order.
#[inline(always)]
pub(crate) fn centered_squares(a: &[f32], m: f32) -> f32 {
    let mut acc = [0.0f32; 8];
    let chunks = a.chunks_exact(8);
    let rest = chunks.remainder();
    for x in chunks {
        for k in 0..8 {
            let d = x[k] - m;
            acc[k] += d * d;
        }
    }
    let tail: f32 = rest.iter().map(|&v| (v - m) * (v - m)).sum();
    fold8(acc, tail)
}

/// Runs `plane(p, dst, scratch)` for every plane `p < count`, in parallel, each writing its
/// `dst` chunk (`chunk` values, zeroed) of the new buffer returned. `scratch` holds one buffer
/// per entry of `sizes`, per rayon task, reused across its planes (each plane must overwrite
/// what it reads).
///
/// A zeroed buffer costs a pass of `memset` over the whole buffer (memory the allocator
/// reuses, so it must clear it) before the kernels overwrite it
/// (`docs/results/2026-11-27-avx2-kernels.md`).
/// Here each plane's chunk is zeroed just before its kernel runs, while the chunk is in cache,
/// so the buffer goes through memory once.
pub(crate) fn planes<const K: usize>(
    count: usize,
    chunk: usize,
    sizes: [usize; K],
    plane: impl Fn(usize, &mut [f32], &mut [Vec<f32>; K]) + Sync,
) -> Vec<f32> {
    let [out] = planes_to(
        count,
        [chunk],
        sizes,
        #[inline(always)]
        |p, [dst], scratch| plane(p, dst, scratch),
    );
    out
}

/// [`planes`] with `M` outputs: plane `p` writes its chunk of each (`chunks[m]` values,
/// zeroed) at once, e.g. a gradient and its plane's share of another.
pub(crate) fn planes_to<const K: usize, const M: usize>(
    count: usize,
    chunks: [usize; M],
    sizes: [usize; K],
    plane: impl Fn(usize, [&mut [f32]; M], &mut [Vec<f32>; K]) + Sync,
) -> [Vec<f32>; M] {
    use rayon::prelude::*;
    use std::mem::MaybeUninit;
    let mut outs: [Vec<f32>; M] = chunks.map(|chunk| Vec::with_capacity(count * chunk));
    // Each plane's chunk of each output, plane by plane.
    let mut parts: Vec<[&mut [MaybeUninit<f32>]; M]> = Vec::with_capacity(count);
    {
        let mut rest: [&mut [MaybeUninit<f32>]; M] =
            outs.each_mut().map(|o| o.spare_capacity_mut());
        for _ in 0..count {
            parts.push(std::array::from_fn(|m| {
                let (head, tail) = std::mem::take(&mut rest[m]).split_at_mut(chunks[m]);
                rest[m] = tail;
                head
            }));
        }
    }
    parts.into_par_iter().enumerate().for_each_init(
        || (sizes.map(|n| vec![0.0f32; n]), chunks.map(|n| vec![0.0f32; n])),
        |(scratch, zeros), (p, dsts)| {
            let mut dsts =
                dsts.into_iter().zip(zeros.iter()).map(|(d, z)| d.write_copy_of_slice(z));
            let dsts: [&mut [f32]; M] = std::array::from_fn(|_| dsts.next().expect("M chunks"));
            wide(
                #[inline(always)]
                || plane(p, dsts, scratch),
            );
        },
    );
    for (out, &chunk) in outs.iter_mut().zip(&chunks) {
        // SAFETY: the chunks above cover the first `count · chunk` entries of the spare
        // capacity, and each was initialized in full by `write_copy_of_slice` (of zeros).
        #[allow(unsafe_code)]
        unsafe {
            out.set_len(count * chunk);
        }
    }
    outs
}

/// Runs `f` compiled for AVX2 where the CPU has it (x86-64; elsewhere, and on older x86-64
/// CPUs, as built).
///
/// The kernels' loops are written for LLVM's vectorizer, and a build for the baseline x86-64
/// target vectorizes them four lanes wide (SSE2); Burn's own element-wise ops and the GEMM
/// pick their instruction set at run time the same way. Only the lane count changes: each lane
/// does the same multiplications and additions in the same order (Rust never fuses `a * b + c`
/// into an FMA on its own), so the results are bitwise those of the baseline build.
#[inline(always)]
pub(crate) fn wide<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        #[target_feature(enable = "avx2")]
        fn avx2<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        // SAFETY: the CPU has AVX2, checked just above.
        #[allow(unsafe_code)]
        return unsafe { avx2(f) };
    }
    f()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::{correlate, dot, dot_and_sum, dots, sum, wide};

    /// Deterministic values in [-1, 1) (xorshift), some of them exactly zero.
    pub(crate) fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                if i % 11 == 5 { 0.0 } else { (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0 }
            })
            .collect()
    }

    pub(crate) fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// Lengths around every block size and the plane sizes of the supernets.
    const LENS: [usize; 12] = [0, 1, 7, 15, 16, 17, 63, 64, 65, 129, 300, 1156];

    #[test]
    fn correlate_is_one_axpy_pass_per_tap_bitwise() {
        for (i, &n) in LENS.iter().enumerate() {
            for ntaps in [1, 3, 9, 25] {
                let seed = (i * 31 + ntaps) as u64;
                let w = values(ntaps, seed);
                let taps: Vec<(usize, f32)> =
                    w.iter().enumerate().map(|(t, &wv)| ((t * 7 + t * t) % 41, wv)).collect();
                let src = values(n + 41, seed + 1);
                let mut want = vec![0.0f32; n];
                for &(off, wv) in &taps {
                    for (k, o) in want.iter_mut().enumerate() {
                        *o += wv * src[k + off];
                    }
                }
                let mut got = vec![f32::NAN; n];
                correlate(&mut got, &src, &taps);
                assert_eq!(bits(&got), bits(&want), "n {n}, {ntaps} taps");
                let mut wide_got = vec![f32::NAN; n];
                wide(|| correlate(&mut wide_got, &src, &taps));
                assert_eq!(bits(&wide_got), bits(&want), "n {n}, {ntaps} taps, wide");
            }
        }
    }

    #[test]
    fn dots_are_dot_per_offset_bitwise() {
        for (i, &n) in LENS.iter().enumerate() {
            for noffs in [1, 8, 9, 25] {
                let seed = (i * 17 + noffs) as u64;
                let a = values(n, seed);
                let b = values(n + 60, seed + 2);
                let offs: Vec<usize> = (0..noffs).map(|t| (t * 13) % 61).collect();
                let want: Vec<f32> = offs.iter().map(|&o| dot(&a, &b[o..o + n])).collect();
                let mut got = vec![f32::NAN; noffs];
                dots(&a, &b, &offs, &mut got);
                assert_eq!(bits(&got), bits(&want), "n {n}, {noffs} offsets");
                let mut wide_got = vec![f32::NAN; noffs];
                wide(|| dots(&a, &b, &offs, &mut wide_got));
                assert_eq!(bits(&wide_got), bits(&want), "n {n}, {noffs} offsets, wide");
            }
        }
    }

    #[test]
    fn dot_and_sum_are_dot_and_sum_bitwise() {
        for (i, &n) in LENS.iter().enumerate() {
            let (a, b) = (values(n, i as u64 + 40), values(n + 3, i as u64 + 41));
            let want = [dot(&a, &b), sum(&a)];
            assert_eq!(bits(&dot_and_sum(&a, &b)), bits(&want), "n {n}");
            assert_eq!(bits(&wide(|| dot_and_sum(&a, &b))), bits(&want), "n {n}, wide");
        }
    }

    /// `dot`'s eight partial sums against a sum in f64: the blocking changes the order of
    /// nothing, so this pins the order itself to a plain sum up to rounding.
    #[test]
    fn dot_is_the_inner_product() {
        let (a, b) = (values(1000, 3), values(1000, 4));
        let exact: f64 = a.iter().zip(&b).map(|(&x, &y)| f64::from(x) * f64::from(y)).sum();
        assert!((f64::from(dot(&a, &b)) - exact).abs() < 1e-4, "{} vs {exact}", dot(&a, &b));
    }
}
