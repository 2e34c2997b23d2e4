//! The statistics `compare` reports. The unit of a comparison is the genotype (its training
//! seeds averaged, or adjusted for the seeds where they are shared); per method against the
//! random baseline: the difference of means with a bootstrap confidence interval, Welch's
//! t-test, the exact Mann–Whitney test with P(method > baseline), a permutation test, and
//! Holm's correction across methods; over genotypes, a one-way ANOVA (or a two-way one with
//! the training seed as a crossed block). SciPy and statsmodels are the oracles
//! (`sweep/tests/stats.rs`, `scripts/stats_reference.py`).

mod dist;
mod paired;
mod rank;
mod resample;
mod twoway;

pub use dist::{beta_inc, f_upper, t_two_sided};
pub use paired::{PairedT, SignFlip, Wilcoxon, t_upper};
pub use rank::MannWhitney;
pub use resample::{Bootstrap, Permutation, SplitMix};
pub use twoway::TwoWay;

/// Mean, sample standard deviation and count.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stats {
    /// Mean.
    pub mean: f64,
    /// Sample standard deviation (n − 1); 0 for one value.
    pub std: f64,
    /// Values.
    pub n: usize,
}

impl Stats {
    /// Of some values; `None` when there are none.
    pub fn of(values: &[f64]) -> Option<Stats> {
        let n = values.len();
        if n == 0 {
            return None;
        }
        let mean = values.iter().sum::<f64>() / n as f64;
        let var = if n > 1 {
            values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64
        } else {
            0.0
        };
        Some(Stats { mean, std: var.sqrt(), n })
    }

    /// `mean ± std % (n)` of a fraction.
    pub fn percent(&self) -> String {
        if self.n > 1 {
            format!("{:.2} ± {:.2} % (n={})", 100.0 * self.mean, 100.0 * self.std, self.n)
        } else {
            format!("{:.2} % (n=1)", 100.0 * self.mean)
        }
    }
}

fn mean(v: &[f64]) -> f64 {
    Stats::of(v).map_or(f64::NAN, |s| s.mean)
}

/// Welch's unequal-variance t-test of mean(a) − mean(b).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Welch {
    /// mean(a) − mean(b).
    pub diff: f64,
    /// Its standard error, √(s_a²/n_a + s_b²/n_b).
    pub se: f64,
    /// diff / se.
    pub t: f64,
    /// Welch–Satterthwaite degrees of freedom.
    pub df: f64,
    /// Two-sided p-value.
    pub p: f64,
}

impl Welch {
    /// The test; `None` unless both sides have two values or more and some spread.
    pub fn of(a: &[f64], b: &[f64]) -> Option<Welch> {
        if a.len() < 2 || b.len() < 2 {
            return None;
        }
        let (sa, sb) = (Stats::of(a)?, Stats::of(b)?);
        let (va, vb) = (sa.std * sa.std / sa.n as f64, sb.std * sb.std / sb.n as f64);
        let se = (va + vb).sqrt();
        if se <= 0.0 || !se.is_finite() {
            return None;
        }
        let diff = sa.mean - sb.mean;
        let df = (va + vb).powi(2)
            / (va * va / (a.len() as f64 - 1.0) + vb * vb / (b.len() as f64 - 1.0));
        let t = diff / se;
        Some(Welch { diff, se, t, df, p: t_two_sided(t, df) })
    }
}

/// One-way analysis of variance over groups (here: genotypes, each a group of seeds).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Anova {
    /// Between-group mean square over within-group mean square.
    pub f: f64,
    /// Groups − 1.
    pub df_between: usize,
    /// Values − groups.
    pub df_within: usize,
    /// Upper-tail p-value of `f`.
    pub p: f64,
    /// The pooled within-group standard deviation, √(within mean square): the seed noise.
    pub within_std: f64,
}

impl Anova {
    /// The analysis; `None` unless there are two groups and a within-group degree of freedom.
    /// Empty groups are left out.
    pub fn of(groups: &[Vec<f64>]) -> Option<Anova> {
        let groups: Vec<&Vec<f64>> = groups.iter().filter(|g| !g.is_empty()).collect();
        let n: usize = groups.iter().map(|g| g.len()).sum();
        let k = groups.len();
        if k < 2 || n <= k {
            return None;
        }
        let all: Vec<f64> = groups.iter().flat_map(|g| g.iter().copied()).collect();
        let grand = mean(&all);
        let ss_between: f64 =
            groups.iter().map(|g| g.len() as f64 * (mean(g) - grand).powi(2)).sum();
        let ss_within: f64 =
            groups.iter().map(|g| g.iter().map(|x| (x - mean(g)).powi(2)).sum::<f64>()).sum();
        let (df_between, df_within) = (k - 1, n - k);
        let ms_within = ss_within / df_within as f64;
        let f = (ss_between / df_between as f64) / ms_within;
        let p = if ms_within > 0.0 { f_upper(f, df_between as f64, df_within as f64) } else { 0.0 };
        Some(Anova { f, df_between, df_within, p, within_std: ms_within.sqrt() })
    }
}

/// Holm's step-down adjustment of p-values for several tests (statsmodels'
/// `multipletests(method="holm")`): the i-th smallest of m is multiplied by m − i + 1, the
/// products made non-decreasing in that order and capped at 1. Returned in the input's order.
pub fn holm(p: &[f64]) -> Vec<f64> {
    let m = p.len();
    let mut order: Vec<usize> = (0..m).collect();
    order.sort_by(|&a, &b| p[a].total_cmp(&p[b]));
    let mut out = vec![0.0; m];
    let mut running = 0.0f64;
    for (rank, &i) in order.iter().enumerate() {
        running = running.max(((m - rank) as f64 * p[i]).min(1.0));
        out[i] = running;
    }
    out
}
