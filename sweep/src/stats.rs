//! The statistics `compare --baseline` reports: whether the training used to score genotypes
//! tells them apart beyond its seed noise (one-way ANOVA over genotypes, each a group of
//! seeds), and whether searched genotypes beat random ones (Welch's t-test on the genotypes'
//! seed means). p-values come from the regularized incomplete beta function (Numerical
//! Recipes' continued fraction, Lentz's method), as SciPy's `t.sf` and `f.sf` compute them.

/// ln Γ(x) for x > 0 (Lanczos, g = 7, nine coefficients; relative error below 1e-14).
fn ln_gamma(x: f64) -> f64 {
    const G: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection: Γ(x)Γ(1 − x) = π / sin(πx).
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut a = G[0];
    let t = x + 7.5;
    for (i, g) in G.iter().enumerate().skip(1) {
        a += g / (x + i as f64);
    }
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

/// The continued fraction of the incomplete beta function (Lentz's method).
fn beta_cf(a: f64, b: f64, x: f64) -> f64 {
    const TINY: f64 = 1e-300;
    let (qab, qap, qam) = (a + b, a + 1.0, a - 1.0);
    let mut c = 1.0;
    let mut d = 1.0 - qab * x / qap;
    if d.abs() < TINY {
        d = TINY;
    }
    d = 1.0 / d;
    let mut h = d;
    for m in 1..=300 {
        let m = m as f64;
        let m2 = 2.0 * m;
        for aa in [
            m * (b - m) * x / ((qam + m2) * (a + m2)),
            -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2)),
        ] {
            d = 1.0 + aa * d;
            if d.abs() < TINY {
                d = TINY;
            }
            c = 1.0 + aa / c;
            if c.abs() < TINY {
                c = TINY;
            }
            d = 1.0 / d;
            h *= d * c;
        }
        if (d * c - 1.0).abs() < 1e-15 {
            break;
        }
    }
    h
}

/// The regularized incomplete beta function I_x(a, b), for a, b > 0 and x in [0, 1].
pub fn beta_inc(a: f64, b: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    let front =
        (ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * x.ln() + b * (1.0 - x).ln()).exp();
    if x < (a + 1.0) / (a + b + 2.0) {
        front * beta_cf(a, b, x) / a
    } else {
        1.0 - front * beta_cf(b, a, 1.0 - x) / b
    }
}

/// Two-sided p-value of Student's t with `df` degrees of freedom: P(|T| ≥ |t|).
pub fn t_two_sided(t: f64, df: f64) -> f64 {
    beta_inc(df / 2.0, 0.5, df / (df + t * t))
}

/// Upper-tail p-value of Fisher's F with (`d1`, `d2`) degrees of freedom: P(F ≥ f).
pub fn f_upper(f: f64, d1: f64, d2: f64) -> f64 {
    if f <= 0.0 {
        return 1.0;
    }
    beta_inc(d2 / 2.0, d1 / 2.0, d2 / (d2 + d1 * f))
}

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
