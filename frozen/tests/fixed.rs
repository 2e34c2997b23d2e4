//! Fixed-point requantization against exact arithmetic: for products small enough to be exact
//! in f64, the ties-to-even path equals `round_ties_even(x·M0·2^-(31+n))`, and the gemmlowp path
//! is within one unit of it (it rounds twice) and equal away from ties.

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use qdarts_frozen::fixed::{FixedMultiplier, Rounding};

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 2000,
        // Seeded: the same cases every run (CI must not fail by chance).
        rng_seed: proptest::test_runner::RngSeed::Fixed(102),
        ..ProptestConfig::default()
    })]

    #[test]
    fn ties_to_even_is_the_exact_product_rounded_once(
        x in -(1i32 << 20)..(1i32 << 20),
        m in 1e-6f64..4.0,
    ) {
        let f = FixedMultiplier::new(m).unwrap();
        prop_assert!((1 << 30..=i32::MAX).contains(&f.m0));
        // |M - M0·2^-31·2^-n| ≤ half a unit of M0.
        prop_assert!((f.value() - m).abs() <= m * 2f64.powi(-30));
        // x·M0 < 2^51 and the scale is a power of two: exact in f64.
        let exact = f64::from(x) * f64::from(f.m0) * 2f64.powi(-31 - f.n);
        prop_assert_eq!(f64::from(f.apply(x, Rounding::TiesToEven)), exact.round_ties_even());
        let g = f64::from(f.apply(x, Rounding::TiesAwayFromZero));
        prop_assert!((g - exact).abs() <= 1.0, "{} vs {}", g, exact);
        if (exact - exact.trunc()).abs() != 0.5 && f.n <= 0 {
            // No right shift: one rounding (ties up), equal to round-to-nearest off ties.
            prop_assert_eq!(g, exact.round());
        }
    }
}

/// The ties-to-even path as first written, in i128: the oracle for its i64 form.
fn ties_to_even_i128(x: i32, f: FixedMultiplier) -> i32 {
    let shift = 31 + f.n;
    let p = i128::from(x) * i128::from(f.m0);
    let v = if shift <= 0 {
        p << (-shift).min(64)
    } else if shift >= 100 {
        0
    } else {
        let floor = p >> shift;
        let rem = p - (floor << shift);
        let half = 1i128 << (shift - 1);
        floor + i128::from(rem > half || (rem == half && floor & 1 == 1))
    };
    v.clamp(i128::from(i32::MIN), i128::from(i32::MAX)) as i32
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 20000,
        rng_seed: proptest::test_runner::RngSeed::Fixed(103),
        ..ProptestConfig::default()
    })]

    #[test]
    fn ties_to_even_in_i64_equals_i128_over_every_input(
        x in any::<i32>(),
        m0 in prop_oneof![Just(0i32), Just(i32::MAX), (1i32 << 30)..=i32::MAX],
        n in -40i32..110,
        small in any::<bool>(),
    ) {
        // Ties (exact halves) are frequent for small x and small shifts.
        let x = if small { x % 64 } else { x };
        let f = FixedMultiplier { m0, n };
        prop_assert_eq!(f.apply(x, Rounding::TiesToEven), ties_to_even_i128(x, f));
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 20000,
        rng_seed: proptest::test_runner::RngSeed::Fixed(104),
        ..ProptestConfig::default()
    })]

    #[test]
    fn lanes_apply_equals_apply_for_both_roundings(
        x in any::<i32>(),
        m0 in prop_oneof![Just(0i32), Just(i32::MAX), Just(1i32 << 30), (1i32 << 30)..=i32::MAX],
        n in -45i32..110,
        small in 0u8..3,
    ) {
        // Ties are frequent for small x; the extremes for the saturations.
        let x = match small { 0 => x % 64, 1 => x, _ => if x < 0 { i32::MIN + (x & 7) } else { i32::MAX - (x & 7) } };
        let f = FixedMultiplier { m0, n };
        for r in [Rounding::TiesToEven, Rounding::TiesAwayFromZero] {
            prop_assert_eq!(f.lanes(r).apply(x), f.apply(x, r), "{:?} {:?} x={}", f, r, x);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 20000,
        rng_seed: proptest::test_runner::RngSeed::Fixed(105),
        ..ProptestConfig::default()
    })]

    #[test]
    fn the_f64_path_equals_apply_below_its_bound(
        x in -(1i32 << 22) + 1..(1i32 << 22),
        m0 in prop_oneof![Just(0i32), Just(i32::MAX), Just(1i32 << 30), (1i32 << 30)..=i32::MAX],
        n in -30i32..=62,
        small in any::<bool>(),
    ) {
        let x = if small { x % 64 } else { x };
        let f = FixedMultiplier { m0, n };
        let l = f.lanes(Rounding::TiesToEven);
        prop_assert!(l.is_ties_to_even());
        let want = f64::from(f.apply(x, Rounding::TiesToEven));
        let got = l.ties_to_even_f64(x).clamp(f64::from(i32::MIN), f64::from(i32::MAX));
        prop_assert_eq!(got, want, "{:?} x={}", f, x);
    }
}
