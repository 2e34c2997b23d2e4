//! The statistics of `compare --baseline` held to closed forms and hand-computed cases: the t
//! distribution with 1 and 2 degrees of freedom (Cauchy, and 1 − t/√(2 + t²)), F with 2
//! numerator degrees of freedom ((1 + 2f/d)^(−d/2)), F(1, d) = t(d)², and tabulated critical
//! values.

use qdarts_sweep::stats::{Anova, Welch, beta_inc, f_upper, t_two_sided};

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
