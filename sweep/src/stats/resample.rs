//! Resampling: the two-sample permutation test of a difference of means (exact when the
//! splits are few enough to enumerate, as SciPy's `permutation_test` does), and the percentile
//! bootstrap interval of a difference of means (SciPy's `bootstrap(method="percentile")`).
//! Every draw comes from a seeded generator, so a report is the same on every run.

/// SplitMix64 (Steele, Lea and Flood 2014): small, seedable, and good enough for resampling.
#[derive(Debug, Clone)]
pub struct SplitMix(u64);

impl SplitMix {
    /// A generator from a seed.
    pub fn new(seed: u64) -> SplitMix {
        SplitMix(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A uniform integer in 0..n (Lemire's multiply-shift with rejection), n > 0.
    pub fn below(&mut self, n: usize) -> usize {
        let n = n as u64;
        let threshold = n.wrapping_neg() % n;
        loop {
            let m = u128::from(self.next_u64()) * u128::from(n);
            if (m as u64) >= threshold {
                return (m >> 64) as usize;
            }
        }
    }
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

/// C(n, k) as a float (exact while it fits 2^53).
fn binomial(n: usize, k: usize) -> f64 {
    let k = k.min(n - k);
    (0..k).fold(1.0, |acc, i| acc * (n - i) as f64 / (i + 1) as f64)
}

/// The two-sided permutation test of mean(x) − mean(y).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Permutation {
    /// mean(x) − mean(y).
    pub diff: f64,
    /// 2 · min(P(D ≤ d), P(D ≥ d)) over the splits of the pooled values, capped at 1.
    pub p: f64,
    /// Every split enumerated (else `resamples` random ones, with SciPy's +1 correction).
    pub exact: bool,
    /// Splits counted.
    pub resamples: usize,
}

impl Permutation {
    /// Splits up to this many are all enumerated.
    pub const EXACT_UP_TO: usize = 200_000;

    /// The test: exact when C(n_x + n_y, n_x) ≤ [`Permutation::EXACT_UP_TO`], else from
    /// `resamples` random splits drawn from `seed`. `None` when a side is empty.
    pub fn of(x: &[f64], y: &[f64], resamples: usize, seed: u64) -> Option<Permutation> {
        let (n1, n) = (x.len(), x.len() + y.len());
        if x.is_empty() || y.is_empty() || resamples == 0 {
            return None;
        }
        let pooled: Vec<f64> = x.iter().chain(y).copied().collect();
        // The difference of means is increasing in the first side's sum, so splits are ranked
        // by that sum. Sums equal in exact arithmetic but not in the last bits (values such as
        // top-1 on a fixed test set tie often) count as equal: within 1e-12 of the values'
        // total magnitude, far below any difference a score can show.
        let observed_sum: f64 = x.iter().sum();
        let tol = 1e-12 * pooled.iter().map(|v| v.abs()).sum::<f64>();
        let observed = mean(x) - mean(y);
        let (mut le, mut ge, mut count) = (0usize, 0usize, 0usize);
        let mut tally = |sum_x: f64| {
            count += 1;
            le += usize::from(sum_x <= observed_sum + tol);
            ge += usize::from(sum_x >= observed_sum - tol);
        };
        let exact = binomial(n, n1) <= Self::EXACT_UP_TO as f64;
        if exact {
            // Every n1-subset of the pooled indices, in lexicographic order.
            let mut idx: Vec<usize> = (0..n1).collect();
            loop {
                tally(idx.iter().map(|&i| pooled[i]).sum());
                let Some(i) = (0..n1).rev().find(|&i| idx[i] < n - n1 + i) else { break };
                idx[i] += 1;
                for j in i + 1..n1 {
                    idx[j] = idx[j - 1] + 1;
                }
            }
        } else {
            let mut rng = SplitMix::new(seed);
            let mut perm: Vec<usize> = (0..n).collect();
            for _ in 0..resamples {
                // A partial Fisher–Yates shuffle draws the first n1 of a random order.
                for i in 0..n1 {
                    let j = i + rng.below(n - i);
                    perm.swap(i, j);
                }
                tally(perm[..n1].iter().map(|&i| pooled[i]).sum());
            }
        }
        let adjust = usize::from(!exact);
        let tail = |k: usize| (k + adjust) as f64 / (count + adjust) as f64;
        let p = (2.0 * tail(le).min(tail(ge))).min(1.0);
        Some(Permutation { diff: observed, p, exact, resamples: count })
    }
}

/// The percentile bootstrap interval of mean(x) − mean(y), each side resampled on its own, or of
/// a mean of paired differences.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bootstrap {
    /// mean(x) − mean(y), or mean(d).
    pub diff: f64,
    /// Lower end.
    pub low: f64,
    /// Upper end.
    pub high: f64,
    /// Confidence level, e.g. 0.95.
    pub level: f64,
    /// Resamples drawn.
    pub resamples: usize,
}

impl Bootstrap {
    /// The interval of mean(x) − mean(y) from `resamples` draws from `seed`; `None` when a side
    /// is empty.
    pub fn of(x: &[f64], y: &[f64], level: f64, resamples: usize, seed: u64) -> Option<Bootstrap> {
        if y.is_empty() {
            return None;
        }
        Self::draw(x, Some(y), level, resamples, seed)
    }

    /// The interval of mean(d) (paired differences, resampled as pairs).
    pub fn of_mean(d: &[f64], level: f64, resamples: usize, seed: u64) -> Option<Bootstrap> {
        Self::draw(d, None, level, resamples, seed)
    }

    fn draw(
        x: &[f64],
        y: Option<&[f64]>,
        level: f64,
        resamples: usize,
        seed: u64,
    ) -> Option<Bootstrap> {
        if x.is_empty() || resamples == 0 || !(0.0..1.0).contains(&level) {
            return None;
        }
        let mut rng = SplitMix::new(seed);
        let mut draw = |v: &[f64]| -> f64 {
            (0..v.len()).map(|_| v[rng.below(v.len())]).sum::<f64>() / v.len() as f64
        };
        let mut stats: Vec<f64> = (0..resamples)
            .map(|_| {
                let a = draw(x);
                a - y.map_or(0.0, &mut draw)
            })
            .collect();
        stats.sort_by(f64::total_cmp);
        let alpha = (1.0 - level) / 2.0;
        Some(Bootstrap {
            diff: mean(x) - y.map_or(0.0, mean),
            low: percentile(&stats, alpha),
            high: percentile(&stats, 1.0 - alpha),
            level,
            resamples,
        })
    }
}

/// The q-quantile of sorted values, linear between order statistics (NumPy's default).
fn percentile(sorted: &[f64], q: f64) -> f64 {
    let h = q * (sorted.len() - 1) as f64;
    let (lo, frac) = (h.floor() as usize, h - h.floor());
    match sorted.get(lo + 1) {
        Some(next) => sorted[lo] + frac * (next - sorted[lo]),
        None => sorted[lo],
    }
}
