//! Paired comparisons (one pair per search seed: a method's genotype against the baseline's
//! from the same seed): the paired t-test (SciPy's `ttest_rel`), the exact Wilcoxon
//! signed-rank test (`wilcoxon(method="exact")`), the sign-flip permutation test of the mean
//! difference (`permutation_test(permutation_type="samples")`), the percentile bootstrap of the
//! mean difference, and the two one-sided tests of equivalence within a margin (statsmodels'
//! `ttost_paired`).

use super::resample::SplitMix;
use super::t_two_sided;

/// P(T ≥ t) for Student's t with `df` degrees of freedom.
pub fn t_upper(t: f64, df: f64) -> f64 {
    let two = t_two_sided(t, df);
    if t >= 0.0 { two / 2.0 } else { 1.0 - two / 2.0 }
}

/// The paired t-test of mean(d), d = x − y pair by pair.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PairedT {
    /// Mean difference.
    pub mean: f64,
    /// Its standard error, sd(d)/√n.
    pub se: f64,
    /// mean / se.
    pub t: f64,
    /// n − 1.
    pub df: f64,
    /// Two-sided p-value.
    pub p: f64,
}

impl PairedT {
    /// The test of differences `d`; `None` under two pairs or without spread.
    pub fn of(d: &[f64]) -> Option<PairedT> {
        let s = super::Stats::of(d)?;
        let se = s.std / (s.n as f64).sqrt();
        if s.n < 2 || se <= 0.0 || !se.is_finite() {
            return None;
        }
        let (t, df) = (s.mean / se, (s.n - 1) as f64);
        Some(PairedT { mean: s.mean, se, t, df, p: t_two_sided(t, df) })
    }

    /// Two one-sided tests of |mean| < `margin` (equivalence): the larger of P(T ≥ (mean +
    /// margin)/se) under mean = −margin and P(T ≤ (mean − margin)/se) under mean = +margin.
    /// Equivalence is shown at level α when this is below α.
    pub fn equivalence_p(&self, margin: f64) -> f64 {
        let low = t_upper((self.mean + margin) / self.se, self.df);
        let high = 1.0 - t_upper((self.mean - margin) / self.se, self.df);
        low.max(high)
    }
}

/// The two-sided exact Wilcoxon signed-rank test of differences.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Wilcoxon {
    /// The sum of the ranks of |d| over the positive differences (midranks for ties).
    pub w_plus: f64,
    /// min(W+, W−), the statistic SciPy reports.
    pub statistic: f64,
    /// Non-zero differences (zeros are dropped, Wilcoxon's rule).
    pub n: usize,
    /// 2 · min(P(W ≥ ⌊W+⌋), P(W ≤ ⌈W+⌉)) under the exact null without ties, capped at 1:
    /// conservative when ranks tie, as in SciPy.
    pub p: f64,
}

impl Wilcoxon {
    /// The test; `None` when no difference is non-zero.
    pub fn of(d: &[f64]) -> Option<Wilcoxon> {
        let nz: Vec<f64> = d.iter().copied().filter(|v| *v != 0.0 && v.is_finite()).collect();
        let n = nz.len();
        if n == 0 {
            return None;
        }
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| nz[a].abs().total_cmp(&nz[b].abs()));
        let mut ranks = vec![0.0; n];
        let mut i = 0;
        while i < n {
            let mut j = i;
            while j + 1 < n && nz[order[j + 1]].abs() == nz[order[i]].abs() {
                j += 1;
            }
            let mid = (i + j) as f64 / 2.0 + 1.0;
            for &k in &order[i..=j] {
                ranks[k] = mid;
            }
            i = j + 1;
        }
        let w_plus: f64 = (0..n).filter(|&k| nz[k] > 0.0).map(|k| ranks[k]).sum();
        let total = (n * (n + 1)) as f64 / 2.0;
        // counts[w]: subsets of {1..n} with sum w.
        let top = n * (n + 1) / 2;
        let mut counts = vec![0.0f64; top + 1];
        counts[0] = 1.0;
        for r in 1..=n {
            for w in (r..=top).rev() {
                counts[w] += counts[w - r];
            }
        }
        let all = 2f64.powi(n as i32);
        let sf = |k: usize| counts[k.min(top + 1)..].iter().sum::<f64>() / all;
        let cdf = |k: usize| counts[..=k.min(top)].iter().sum::<f64>() / all;
        let p = (2.0 * sf(w_plus.floor() as usize).min(cdf(w_plus.ceil() as usize))).min(1.0);
        Some(Wilcoxon { w_plus, statistic: w_plus.min(total - w_plus), n, p })
    }
}

/// The two-sided sign-flip permutation test of mean(d): exact over the 2^n flips up to
/// [`SignFlip::EXACT_UP_TO`], else from random flips with SciPy's +1 correction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SignFlip {
    /// 2 · min(P(D ≤ d), P(D ≥ d)), capped at 1.
    pub p: f64,
    /// Every flip enumerated.
    pub exact: bool,
    /// Flips counted.
    pub resamples: usize,
}

impl SignFlip {
    /// Flips up to this many are all enumerated.
    pub const EXACT_UP_TO: usize = 1 << 20;

    /// The test; `None` without differences.
    pub fn of(d: &[f64], resamples: usize, seed: u64) -> Option<SignFlip> {
        let n = d.len();
        if n == 0 || resamples == 0 {
            return None;
        }
        // Ranked by the sum of the flipped differences; ties within 1e-12 of their magnitude.
        let observed: f64 = d.iter().sum();
        let tol = 1e-12 * d.iter().map(|v| v.abs()).sum::<f64>();
        let (mut le, mut ge, mut count) = (0usize, 0usize, 0usize);
        let mut tally = |s: f64| {
            count += 1;
            le += usize::from(s <= observed + tol);
            ge += usize::from(s >= observed - tol);
        };
        let exact = n < usize::BITS as usize && (1usize << n) <= Self::EXACT_UP_TO;
        if exact {
            for mask in 0..1usize << n {
                tally((0..n).map(|i| if mask >> i & 1 == 1 { -d[i] } else { d[i] }).sum());
            }
        } else {
            let mut rng = SplitMix::new(seed);
            for _ in 0..resamples {
                tally(d.iter().map(|v| if rng.next_u64() >> 63 == 1 { -v } else { *v }).sum());
            }
        }
        let adjust = usize::from(!exact);
        let tail = |k: usize| (k + adjust) as f64 / (count + adjust) as f64;
        Some(SignFlip { p: (2.0 * tail(le).min(tail(ge))).min(1.0), exact, resamples: count })
    }
}
