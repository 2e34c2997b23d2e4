//! The statistics of `compare --baseline` held to SciPy's and statsmodels' figures on fixed
//! data (`fixtures/stats.json`, written by `scripts/stats_reference.py`), and to closed forms
//! and hand-computed cases: the t distribution with 1 and 2 degrees of freedom (Cauchy, and
//! 1 − t/√(2 + t²)), F with 2 numerator degrees of freedom ((1 + 2f/d)^(−d/2)), F(1, d) =
//! t(d)², and tabulated critical values.

use qdarts_sweep::stats::{
    Anova, Bootstrap, MannWhitney, PairedT, Permutation, SignFlip, TwoWay, Welch, Wilcoxon,
    beta_inc, f_upper, holm, t_two_sided,
};
use serde_json::Value;

fn fixture() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/stats.json");
    let text = std::fs::read_to_string(path).expect("the stats fixture");
    serde_json::from_str(&text).expect("the stats fixture is JSON")
}

fn num(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("{key} in {v}"))
}

fn nums(v: &Value) -> Vec<f64> {
    v.as_array().expect("an array").iter().map(|x| x.as_f64().expect("a number")).collect()
}

/// Relative closeness for p-values and statistics.
fn rel(a: f64, b: f64, tol: f64, what: &str) {
    assert!((a - b).abs() <= tol * b.abs().max(1e-300), "{what}: {a} vs SciPy's {b}");
}

#[test]
fn welch_mann_whitney_and_exact_permutation_tests_agree_with_scipy() {
    let f = fixture();
    for case in f["two_sample"].as_array().expect("cases") {
        let (x, y) = (nums(&case["x"]), nums(&case["y"]));
        let what = format!("{} vs {} values", x.len(), y.len());
        let w = Welch::of(&x, &y).expect("welch");
        rel(w.t, num(&case["welch"], "t"), 1e-9, &what);
        rel(w.df, num(&case["welch"], "df"), 1e-9, &what);
        rel(w.p, num(&case["welch"], "p"), 1e-7, &what);
        let u = MannWhitney::of(&x, &y).expect("mann-whitney");
        rel(u.u, num(&case["mann_whitney"], "u"), 1e-12, &what);
        rel(u.p, num(&case["mann_whitney"], "p"), 1e-9, &what);
        rel(u.p_greater, num(&case["mann_whitney"], "p_greater"), 1e-12, &what);
        let reference = &case["permutation"];
        let p = Permutation::of(&x, &y, 100_000, 7).expect("permutation");
        if reference["exact"].as_bool().expect("exact") {
            assert!(p.exact, "{what}: enumerated");
            assert_eq!(p.resamples as f64, num(reference, "splits"), "{what}");
            // Exact in rational arithmetic; SciPy's float statistics may split a few ties.
            rel(p.p, num(reference, "p_rational"), 1e-12, &what);
            assert!((p.p - num(reference, "p")).abs() <= 8.0 / p.resamples as f64, "{what}");
        } else {
            // Both Monte Carlo: within four standard errors of the two estimates together.
            assert!(!p.exact, "{what}");
            let q = num(reference, "p");
            let se = (2.0 * q * (1.0 - q) / 100_000.0).sqrt();
            assert!((p.p - q).abs() <= 4.0 * se, "{what}: {} vs SciPy's {q} (se {se})", p.p);
        }
    }
}

#[test]
fn paired_tests_and_equivalence_agree_with_scipy_and_statsmodels() {
    let f = fixture();
    for case in f["paired"].as_array().expect("cases") {
        let (x, y) = (nums(&case["x"]), nums(&case["y"]));
        let d: Vec<f64> = x.iter().zip(&y).map(|(a, b)| a - b).collect();
        let what = format!("{} pairs", d.len());
        let t = PairedT::of(&d).expect("paired t");
        rel(t.t, num(&case["t"], "t"), 1e-9, &what);
        rel(t.df, num(&case["t"], "df"), 1e-12, &what);
        rel(t.p, num(&case["t"], "p"), 1e-7, &what);
        let e = &case["equivalence"];
        rel(t.equivalence_p(num(e, "margin")), num(e, "p"), 1e-7, &what);
        let w = Wilcoxon::of(&d).expect("wilcoxon");
        rel(w.statistic, num(&case["wilcoxon"], "statistic"), 1e-12, &what);
        rel(w.p, num(&case["wilcoxon"], "p"), 1e-12, &what);
        let s = SignFlip::of(&d, 100_000, 5).expect("sign flips");
        assert!(case["sign_flip"]["exact"].as_bool().expect("exact") && s.exact, "{what}");
        assert_eq!(s.resamples as f64, num(&case["sign_flip"], "flips"), "{what}");
        // Exact in rational arithmetic; SciPy's float statistics may split a few ties.
        rel(s.p, num(&case["sign_flip"], "p_rational"), 1e-12, &what);
        assert!((s.p - num(&case["sign_flip"], "p")).abs() <= 8.0 / s.resamples as f64, "{what}");
        let b = Bootstrap::of_mean(&d, 0.95, 100_000, 13).expect("bootstrap");
        let (low, high) = (num(&case["bootstrap"], "low"), num(&case["bootstrap"], "high"));
        // Two Monte Carlo estimates of quantiles of a lattice distribution (means of n values
        // drawn from d): within 3 % of the width plus one step of the lattice, the widest gap
        // between neighbouring differences over n.
        let mut sorted = d.clone();
        sorted.sort_by(f64::total_cmp);
        let step = sorted.windows(2).map(|w| w[1] - w[0]).fold(0.0, f64::max) / d.len() as f64;
        let tol = 0.03 * (high - low) + step;
        assert!((b.low - low).abs() <= tol && (b.high - high).abs() <= tol, "{what}: {b:?}");
    }
}

#[test]
fn the_bootstrap_interval_agrees_with_scipys_percentile_interval() {
    let f = fixture();
    for case in f["two_sample"].as_array().expect("cases") {
        let (x, y) = (nums(&case["x"]), nums(&case["y"]));
        let b = Bootstrap::of(&x, &y, 0.95, 100_000, 11).expect("bootstrap");
        let (low, high) = (num(&case["bootstrap"], "low"), num(&case["bootstrap"], "high"));
        // Two Monte Carlo estimates of the same quantiles: within 3 % of the interval's width
        // (the ends' own resampling error at 1e5 draws is well under 1 %).
        let tol = 0.03 * (high - low);
        assert!((b.low - low).abs() <= tol, "low {} vs SciPy's {low}", b.low);
        assert!((b.high - high).abs() <= tol, "high {} vs SciPy's {high}", b.high);
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        rel(b.diff, mean(&x) - mean(&y), 1e-12, "difference");
    }
    // The same seed, the same interval.
    let x = [0.85, 0.86, 0.87];
    assert_eq!(
        Bootstrap::of(&x, &[0.84, 0.85], 0.95, 500, 3),
        Bootstrap::of(&x, &[0.84, 0.85], 0.95, 500, 3)
    );
}

#[test]
fn holm_and_both_anovas_agree_with_statsmodels_and_scipy() {
    let f = fixture();
    let adjusted = holm(&nums(&f["holm"]["p"]));
    for (a, b) in adjusted.iter().zip(nums(&f["holm"]["adjusted"])) {
        rel(*a, b, 1e-12, "holm");
    }
    let groups: Vec<Vec<f64>> =
        f["one_way"]["groups"].as_array().expect("groups").iter().map(nums).collect();
    let a = Anova::of(&groups).expect("anova");
    rel(a.f, num(&f["one_way"], "f"), 1e-9, "one-way F");
    rel(a.p, num(&f["one_way"], "p"), 1e-7, "one-way p");
    let t = &f["two_way"];
    let values: Vec<(usize, usize, f64)> = t["values"]
        .as_array()
        .expect("values")
        .iter()
        .map(|r| {
            let r = nums(r);
            (r[0] as usize, r[1] as usize, r[2])
        })
        .collect();
    let fit = TwoWay::of(&values).expect("two-way");
    rel(fit.genotype_f, num(t, "genotype_f"), 1e-8, "genotype F");
    rel(fit.genotype_p, num(t, "genotype_p"), 1e-7, "genotype p");
    rel(fit.seed_f, num(t, "seed_f"), 1e-8, "seed F");
    rel(fit.seed_p, num(t, "seed_p"), 1e-7, "seed p");
    assert_eq!(fit.df_residual as f64, num(t, "df_residual"));
    rel(fit.residual_std, num(t, "residual_std"), 1e-8, "residual std");
    for (a, b) in fit.adjusted_means.iter().zip(nums(&t["adjusted_means"])) {
        rel(*a, b, 1e-10, "least-squares mean");
    }
    // A design that does not connect seeds across genotypes has no two-way fit.
    assert!(TwoWay::of(&[(0, 0, 0.8), (0, 0, 0.81), (1, 1, 0.7), (1, 1, 0.72)]).is_none());
    for d in f["distributions"]["t_two_sided"].as_array().expect("t") {
        rel(t_two_sided(num(d, "t"), num(d, "df")), num(d, "p"), 1e-9, "t tail");
    }
    for d in f["distributions"]["f_upper"].as_array().expect("f") {
        rel(f_upper(num(d, "f"), num(d, "d1"), num(d, "d2")), num(d, "p"), 1e-9, "F tail");
    }
}

fn close(a: f64, b: f64, tol: f64) {
    assert!((a - b).abs() <= tol, "{a} vs {b}");
}

#[test]
fn the_t_and_f_tails_match_their_closed_forms() {
    for t in [0.0, 0.1, 0.7, 1.0, 2.5, 12.706, 100.0] {
        // df = 1: Cauchy, P(|T| ≥ t) = 1 − (2/π) atan t.
        close(t_two_sided(t, 1.0), 1.0 - 2.0 / std::f64::consts::PI * f64::atan(t), 1e-12);
        // df = 2: P(|T| ≥ t) = 1 − t / √(2 + t²).
        close(t_two_sided(t, 2.0), 1.0 - t / (2.0 + t * t).sqrt(), 1e-12);
        // Negative t: the same two-sided tail.
        close(t_two_sided(-t, 7.0), t_two_sided(t, 7.0), 1e-15);
    }
    for (f, d) in [(0.3, 4.0), (1.0, 6.0), (5.0, 9.0), (27.0, 6.0), (0.01, 30.0)] {
        close(f_upper(f, 2.0, d), (1.0 + 2.0 * f / d).powf(-d / 2.0), 1e-12);
    }
    for (t, d) in [(0.5, 3.0), (2.0, 5.0), (3.3, 11.0)] {
        close(f_upper(t * t, 1.0, d), t_two_sided(t, d), 1e-12);
    }
    // Tabulated two-sided 5 % points of t and upper 5 % points of F.
    close(t_two_sided(2.228_139, 10.0), 0.05, 1e-6);
    close(t_two_sided(2.570_582, 5.0), 0.05, 1e-6);
    close(f_upper(5.192_168, 4.0, 5.0), 0.05, 1e-6);
    close(f_upper(2.456_281, 9.0, 18.0), 0.05, 1e-6);
    // I_x(a, b) at its ends and its symmetry I_x(a, b) = 1 − I_{1−x}(b, a).
    assert_eq!((beta_inc(2.0, 3.0, 0.0), beta_inc(2.0, 3.0, 1.0)), (0.0, 1.0));
    close(beta_inc(2.5, 0.5, 0.3), 1.0 - beta_inc(0.5, 2.5, 0.7), 1e-13);
    // I_x(1, b) = 1 − (1 − x)^b.
    close(beta_inc(1.0, 4.0, 0.2), 1.0 - 0.8f64.powi(4), 1e-13);
}

#[test]
fn the_anova_and_welch_test_match_hand_computed_cases() {
    // Three groups of three: between mean square 54 / 2 = 27, within 6 / 6 = 1, so F(2, 6) = 27
    // and p = (1 + 2·27/6)^(−3) = 0.001.
    let g = [vec![1.0, 2.0, 3.0], vec![4.0, 5.0, 6.0], vec![7.0, 8.0, 9.0]];
    let a = Anova::of(&g).expect("anova");
    close(a.f, 27.0, 1e-12);
    assert_eq!((a.df_between, a.df_within), (2, 6));
    close(a.p, 1e-3, 1e-12);
    close(a.within_std, 1.0, 1e-12);
    // Empty groups are left out; one group, or no within-group freedom, is no analysis.
    assert_eq!(Anova::of(&[g[0].clone(), vec![], g[1].clone()]).map(|a| a.df_between), Some(1));
    assert!(Anova::of(&[g[0].clone()]).is_none());
    assert!(Anova::of(&[vec![1.0], vec![2.0]]).is_none());
    // Welch: a = [1, 2, 3] (var 1), b = [2, 4, 6, 8] (var 20/3): se² = 1/3 + 5/3 = 2,
    // df = 4 / ((1/3)²/2 + (5/3)²/3) = 4 / (1/18 + 25/27) = 4.0755…, t = (2 − 5)/√2.
    let w = Welch::of(&[1.0, 2.0, 3.0], &[2.0, 4.0, 6.0, 8.0]).expect("welch");
    close(w.diff, -3.0, 1e-12);
    close(w.se, 2f64.sqrt(), 1e-12);
    close(w.df, 4.0 / (1.0 / 18.0 + 25.0 / 27.0), 1e-12);
    close(w.t, -3.0 / 2f64.sqrt(), 1e-12);
    close(w.p, t_two_sided(w.t, w.df), 0.0);
    assert!(Welch::of(&[1.0], &[2.0, 3.0]).is_none());
    assert!(Welch::of(&[1.0, 1.0], &[2.0, 2.0]).is_none());
}
