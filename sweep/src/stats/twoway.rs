//! The additive two-way analysis of variance of genotype and training seed (seed a crossed
//! block): least squares on y = μ + genotype + seed + ε, with Type II sums of squares as
//! statsmodels' `anova_lm(ols("y ~ C(genotype) + C(seed)"), typ=2)` reports them, and each
//! genotype's mean adjusted for the seeds (its least-squares mean: the fit averaged over the
//! seed levels), which is what a comparison of genotypes trained with different seeds can use.

/// The fit and its tests.
#[derive(Debug, Clone, PartialEq)]
pub struct TwoWay {
    /// Genotype effect, adjusted for seed: F, its degrees of freedom, p.
    pub genotype_f: f64,
    /// Seed effect, adjusted for genotype: F.
    pub seed_f: f64,
    /// Genotypes − 1.
    pub df_genotype: usize,
    /// Seeds − 1.
    pub df_seed: usize,
    /// Values − genotypes − seeds + 1.
    pub df_residual: usize,
    /// Upper-tail p-value of `genotype_f`.
    pub genotype_p: f64,
    /// Upper-tail p-value of `seed_f`.
    pub seed_p: f64,
    /// √(residual mean square): the noise left once genotype and seed are accounted for.
    pub residual_std: f64,
    /// Each genotype's least-squares mean, in the order of the genotype indices.
    pub adjusted_means: Vec<f64>,
}

impl TwoWay {
    /// The analysis of `(genotype, seed, value)` triples (indices from 0). `None` unless there
    /// are two genotypes and two seeds, every index in 0..n is used, the design is connected
    /// (every genotype reaches every seed through shared seeds), and a residual degree of
    /// freedom is left.
    pub fn of(values: &[(usize, usize, f64)]) -> Option<TwoWay> {
        let g = values.iter().map(|v| v.0 + 1).max()?;
        let s = values.iter().map(|v| v.1 + 1).max()?;
        let n = values.len();
        let used = |k: usize, pick: fn(&(usize, usize, f64)) -> usize| {
            (0..k).all(|i| values.iter().any(|v| pick(v) == i))
        };
        if g < 2 || s < 2 || n < g + s || !used(g, |v| v.0) || !used(s, |v| v.1) {
            return None;
        }
        if !connected(values, g, s) {
            return None;
        }
        // Treatment coding: μ, genotypes 1..g, seeds 1..s.
        let p = g + s - 1;
        let row = |&(gi, si, _): &(usize, usize, f64)| -> Vec<f64> {
            let mut r = vec![0.0; p];
            r[0] = 1.0;
            if gi > 0 {
                r[gi] = 1.0;
            }
            if si > 0 {
                r[g + si - 1] = 1.0;
            }
            r
        };
        let mut xtx = vec![vec![0.0; p]; p];
        let mut xty = vec![0.0; p];
        for v in values {
            let r = row(v);
            for i in 0..p {
                xty[i] += r[i] * v.2;
                for j in 0..p {
                    xtx[i][j] += r[i] * r[j];
                }
            }
        }
        let beta = solve(xtx, xty)?;
        let fit =
            |v: &(usize, usize, f64)| -> f64 { row(v).iter().zip(&beta).map(|(a, b)| a * b).sum() };
        let rss_full: f64 = values.iter().map(|v| (v.2 - fit(v)).powi(2)).sum();
        let rss_seed_only = within(values, s, |v| v.1);
        let rss_genotype_only = within(values, g, |v| v.0);
        let (df_genotype, df_seed, df_residual) = (g - 1, s - 1, n - p);
        let ms_res = rss_full / df_residual as f64;
        let f_of = |ss: f64, df: usize| (ss.max(0.0) / df as f64) / ms_res;
        let genotype_f = f_of(rss_seed_only - rss_full, df_genotype);
        let seed_f = f_of(rss_genotype_only - rss_full, df_seed);
        let p_of = |f: f64, df: usize| {
            if ms_res > 0.0 { super::f_upper(f, df as f64, df_residual as f64) } else { 0.0 }
        };
        let seed_mean = (1..s).map(|si| beta[g + si - 1]).sum::<f64>() / s as f64;
        let adjusted_means =
            (0..g).map(|gi| beta[0] + if gi > 0 { beta[gi] } else { 0.0 } + seed_mean).collect();
        Some(TwoWay {
            genotype_f,
            seed_f,
            df_genotype,
            df_seed,
            df_residual,
            genotype_p: p_of(genotype_f, df_genotype),
            seed_p: p_of(seed_f, df_seed),
            residual_std: ms_res.sqrt(),
            adjusted_means,
        })
    }
}

/// The residual sum of squares of a one-way fit: each value less its level's mean.
fn within(
    values: &[(usize, usize, f64)],
    k: usize,
    level: fn(&(usize, usize, f64)) -> usize,
) -> f64 {
    let mut sum = vec![0.0; k];
    let mut count = vec![0usize; k];
    for v in values {
        sum[level(v)] += v.2;
        count[level(v)] += 1;
    }
    values.iter().map(|v| (v.2 - sum[level(v)] / count[level(v)] as f64).powi(2)).sum()
}

/// Whether genotypes and seeds form one component when each value joins its two levels.
fn connected(values: &[(usize, usize, f64)], g: usize, s: usize) -> bool {
    let mut parent: Vec<usize> = (0..g + s).collect();
    fn root(parent: &mut [usize], mut i: usize) -> usize {
        while parent[i] != i {
            parent[i] = parent[parent[i]];
            i = parent[i];
        }
        i
    }
    for v in values {
        let (a, b) = (root(&mut parent, v.0), root(&mut parent, g + v.1));
        parent[a] = b;
    }
    let first = root(&mut parent, 0);
    (1..g + s).all(|i| root(&mut parent, i) == first)
}

/// Solves A x = b by Gaussian elimination with partial pivoting; `None` when A is singular.
fn solve(mut a: Vec<Vec<f64>>, mut b: Vec<f64>) -> Option<Vec<f64>> {
    let n = b.len();
    let scale = a.iter().flatten().fold(0.0f64, |m, v| m.max(v.abs()));
    for col in 0..n {
        let pivot = (col..n).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[pivot][col].abs() <= 1e-12 * scale {
            return None;
        }
        a.swap(col, pivot);
        b.swap(col, pivot);
        let pivot_row = a[col].clone();
        for r in col + 1..n {
            let k = a[r][col] / pivot_row[col];
            for (x, p) in a[r][col..].iter_mut().zip(&pivot_row[col..]) {
                *x -= k * p;
            }
            b[r] -= k * b[col];
        }
    }
    let mut x = vec![0.0; n];
    for r in (0..n).rev() {
        let tail: f64 = (r + 1..n).map(|c| a[r][c] * x[c]).sum();
        x[r] = (b[r] - tail) / a[r][r];
    }
    Some(x)
}
