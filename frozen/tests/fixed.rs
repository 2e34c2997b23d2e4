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
