//! Fixed-point requantization as in integer-only inference (Jacob et al. 2018; gemmlowp,
//! TFLite): a real multiplier `M` is stored as `M0` (int32 in [2^30, 2^31)) and a shift `n`
//! with `M ≈ M0 · 2^-31 · 2^-n`, and applied with `SaturatingRoundingDoublingHighMul` followed
//! by `RoundingDivideByPOT`.
//!
//! Rounding: gemmlowp's `RoundingDivideByPOT` rounds half away from zero; qdarts' default
//! elsewhere is ties to even, so both final roundings are offered ([`Rounding`]).

use serde::{Deserialize, Serialize};

/// How the final right shift rounds a tie.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rounding {
    /// Half to even (ONNX QuantizeLinear, torch).
    TiesToEven,
    /// Half away from zero (gemmlowp `RoundingDivideByPOT`, Paddle round_type 1).
    TiesAwayFromZero,
}

/// A real multiplier as `M0 · 2^-31 · 2^-n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FixedMultiplier {
    /// In [2^30, 2^31), or 0 for a zero multiplier.
    pub m0: i32,
    /// Right shift `n` (negative: a left shift, for `M ≥ 1`).
    pub n: i32,
}

/// Why a multiplier cannot be represented.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MultiplierError {
    /// Negative, infinite or NaN.
    #[error("rescale multiplier {0} is not a finite non-negative number")]
    NotFinite(f64),
    /// Too large for an int32 left shift.
    #[error("rescale multiplier {0} is too large (at most 2^30)")]
    TooLarge(f64),
}

impl FixedMultiplier {
    /// TFLite's `QuantizeMultiplier`: `M = q·2^e` with `q ∈ [0.5, 1)`, `M0 = round(q·2^31)`
    /// (half away from zero), `n = -e`; a multiplier under 2^-31 becomes 0.
    pub fn new(m: f64) -> Result<Self, MultiplierError> {
        if !(m.is_finite() && m >= 0.0) {
            return Err(MultiplierError::NotFinite(m));
        }
        if m == 0.0 {
            return Ok(FixedMultiplier { m0: 0, n: 0 });
        }
        if m > f64::from(1u32 << 30) {
            return Err(MultiplierError::TooLarge(m));
        }
        let (q, mut e) = frexp(m);
        let mut q_fixed = (q * 2f64.powi(31)).round() as i64;
        if q_fixed == 1i64 << 31 {
            q_fixed /= 2;
            e += 1;
        }
        if e < -31 {
            return Ok(FixedMultiplier { m0: 0, n: 0 });
        }
        Ok(FixedMultiplier { m0: q_fixed as i32, n: -e })
    }

    /// The real value `M0 · 2^-31 · 2^-n`.
    pub fn value(self) -> f64 {
        f64::from(self.m0) * 2f64.powi(-31 - self.n)
    }

    /// `x · M`. `TiesAwayFromZero` is bit-exact TFLite `MultiplyByQuantizedMultiplier`
    /// (`SaturatingRoundingDoublingHighMul`, whose ties go up, then `RoundingDivideByPOT`);
    /// `TiesToEven` rounds the exact product `x·M0·2^-(31+n)` once, half to even.
    pub fn apply(self, x: i32, rounding: Rounding) -> i32 {
        match rounding {
            Rounding::TiesAwayFromZero => {
                let left = (-self.n).clamp(0, 31);
                let right = self.n.max(0);
                let shifted = x.saturating_mul(1i32 << left);
                rounding_divide_by_pot(
                    saturating_rounding_doubling_high_mul(shifted, self.m0),
                    right,
                )
            }
            Rounding::TiesToEven => {
                let shift = 31 + self.n;
                // |x·M0| < 2^62: the product is exact in i64, and so is every shift below 63.
                let p = i64::from(x) * i64::from(self.m0);
                let v =
                    if shift <= 0 {
                        return i32::try_from(i128::from(p) << (-shift).min(64))
                            .unwrap_or(if p < 0 { i32::MIN } else { i32::MAX });
                    } else if shift >= 63 {
                        // |p| < 2^62 ≤ half the divisor: rounds to 0 (a tie only at p = 0).
                        0
                    } else {
                        let floor = p >> shift;
                        let rem = p - (floor << shift);
                        let half = 1i64 << (shift - 1);
                        floor + i64::from(rem > half || (rem == half && floor & 1 == 1))
                    };
                v.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32
            }
        }
    }
}

/// A multiplier prepared for [`FixedMultiplier::apply`] over many values: the same integers,
/// computed without branches so that a loop over a slice vectorizes.
#[derive(Debug, Clone, Copy)]
pub struct Lanes {
    m0: i64,
    /// Ties to even: right shift of the product, in `1..=63`.
    shift: u32,
    /// gemmlowp: left shift before the high multiply, in `0..=30`.
    left: u32,
    /// gemmlowp: right shift after it, in `0..=31`, and whether it is 32 or more.
    right: u32,
    right_zero: bool,
    rounding: Rounding,
    /// `M0` and `2^-shift` as f64 (both exact).
    m0f: f64,
    scale: f64,
    /// Outside the range a model's validation allows (`n` in `-30..=62`): use `apply`.
    exact: Option<FixedMultiplier>,
}

impl FixedMultiplier {
    /// This multiplier prepared for [`Lanes::apply`].
    pub fn lanes(self, rounding: Rounding) -> Lanes {
        let in_range = (-30..=62).contains(&self.n) && self.m0 >= 0;
        Lanes {
            m0: i64::from(self.m0),
            shift: (31 + self.n).clamp(1, 63) as u32,
            left: (-self.n).clamp(0, 30) as u32,
            right: self.n.clamp(0, 31) as u32,
            right_zero: self.n >= 32,
            rounding,
            m0f: f64::from(self.m0),
            scale: 2f64.powi(-(31 + self.n).clamp(1, 63)),
            exact: (!in_range).then_some(self),
        }
    }
}

impl Lanes {
    /// Inputs below this magnitude may use [`Lanes::ties_to_even_f64`].
    pub const F64_EXACT: i32 = 1 << 22;

    /// Whether [`Lanes::ties_to_even`] applies this multiplier.
    #[inline(always)]
    pub fn is_ties_to_even(&self) -> bool {
        self.exact.is_none() && self.rounding == Rounding::TiesToEven
    }

    /// `FixedMultiplier::apply(x, TiesToEven)` for a multiplier in a validated model's range
    /// (see [`Lanes::is_ties_to_even`]): no branch at all.
    #[inline(always)]
    pub fn ties_to_even(&self, x: i32) -> i32 {
        // |x·M0| < 2^62; a shift of 63 leaves 0 (see `apply`).
        let p = i64::from(x) * self.m0;
        let floor = p >> self.shift;
        let rem = p.wrapping_sub(floor.wrapping_shl(self.shift));
        let half = 1i64 << (self.shift - 1);
        let up = (rem > half) | ((rem == half) & (floor & 1 == 1));
        (floor + i64::from(up)).clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32
    }

    /// `FixedMultiplier::apply(x, TiesToEven)` in f64, for `|x| <` [`Lanes::F64_EXACT`] and a
    /// multiplier in a validated model's range: `x·M0 < 2^53` is exact, the power-of-two scale
    /// is exact, and `round_ties_even` is the rounding itself. Not clamped to i32.
    #[inline(always)]
    pub fn ties_to_even_f64(&self, x: i32) -> f64 {
        (f64::from(x) * self.m0f * self.scale).round_ties_even()
    }

    /// `M0·2^-shift` as one f64 (exact): `x` times it, rounded half to even, is
    /// [`Lanes::ties_to_even_f64`].
    pub fn f64_factor(&self) -> f64 {
        self.m0f * self.scale
    }

    /// `FixedMultiplier::apply(x, rounding)`.
    #[inline(always)]
    pub fn apply(&self, x: i32) -> i32 {
        if let Some(m) = self.exact {
            return m.apply(x, self.rounding);
        }
        match self.rounding {
            Rounding::TiesToEven => self.ties_to_even(x),
            Rounding::TiesAwayFromZero => {
                let shifted =
                    (i64::from(x) << self.left).clamp(i64::from(i32::MIN), i64::from(i32::MAX));
                // SaturatingRoundingDoublingHighMul (M0 ≥ 0: no saturation case).
                let ab = shifted * self.m0;
                let nudge = if ab >= 0 { 1i64 << 30 } else { 1 - (1i64 << 30) };
                let t = ab + nudge;
                let high = (t + ((t >> 63) & ((1i64 << 31) - 1))) >> 31;
                // RoundingDivideByPOT.
                let mask = (1i64 << self.right) - 1;
                let rem = high & mask;
                let threshold = (mask >> 1) + i64::from(high < 0);
                let v = (high >> self.right) + i64::from(rem > threshold);
                if self.right_zero { 0 } else { v as i32 }
            }
        }
    }
}

/// `m = q · 2^e` with `q ∈ [0.5, 1)` for a positive finite `m` (C's `frexp`).
fn frexp(m: f64) -> (f64, i32) {
    let mut e = m.log2().floor() as i32 + 1;
    let mut q = m / 2f64.powi(e);
    // log2 can be off by one near powers of two.
    while q >= 1.0 {
        q /= 2.0;
        e += 1;
    }
    while q < 0.5 {
        q *= 2.0;
        e -= 1;
    }
    (q, e)
}

/// gemmlowp `SaturatingRoundingDoublingHighMul`: the high 32 bits of `2·a·b`, rounded (the
/// nudge `2^30`, or `1 - 2^30` for a negative product, then division truncating toward zero);
/// `i32::MIN · i32::MIN` saturates to `i32::MAX`.
pub fn saturating_rounding_doubling_high_mul(a: i32, b: i32) -> i32 {
    if a == i32::MIN && b == i32::MIN {
        return i32::MAX;
    }
    let ab = i64::from(a) * i64::from(b);
    let nudge = if ab >= 0 { 1i64 << 30 } else { 1 - (1i64 << 30) };
    ((ab + nudge) / (1i64 << 31)) as i32
}

/// gemmlowp `RoundingDivideByPOT`: `x / 2^exponent`, ties away from zero.
pub fn rounding_divide_by_pot(x: i32, exponent: i32) -> i32 {
    if exponent <= 0 {
        return x;
    }
    if exponent >= 32 {
        return 0;
    }
    let mask = ((1i64 << exponent) - 1) as i32;
    let remainder = x & mask;
    let threshold = (mask >> 1) + i32::from(x < 0);
    (x >> exponent) + i32::from(remainder > threshold)
}

/// `x / 2^exponent`, ties to even.
pub fn rounding_divide_by_pot_even(x: i32, exponent: i32) -> i32 {
    if exponent <= 0 {
        return x;
    }
    if exponent >= 32 {
        return 0;
    }
    let floor = x >> exponent;
    let remainder = i64::from(x) - (i64::from(floor) << exponent);
    let half = 1i64 << (exponent - 1);
    floor + i32::from(remainder > half || (remainder == half && floor & 1 == 1))
}

/// Requantizes an int32 accumulator to the output grid: `clamp(z_out + x·M, lo, hi)`.
pub fn requantize(acc: i32, m: FixedMultiplier, z_out: i32, lo: i32, hi: i32, r: Rounding) -> i32 {
    m.apply(acc, r).saturating_add(z_out).clamp(lo, hi)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multipliers_match_tflite_quantize_multiplier() {
        // TFLite: QuantizeMultiplier(0.5) = (2^30, shift 0); (1.0) = (2^30, shift 1);
        // (0.75) = (3·2^29, 0); (2^-10) = (2^30, shift -9).
        assert_eq!(FixedMultiplier::new(0.5).unwrap(), FixedMultiplier { m0: 1 << 30, n: 0 });
        assert_eq!(FixedMultiplier::new(1.0).unwrap(), FixedMultiplier { m0: 1 << 30, n: -1 });
        assert_eq!(FixedMultiplier::new(0.75).unwrap(), FixedMultiplier { m0: 3 << 29, n: 0 });
        assert_eq!(
            FixedMultiplier::new(2f64.powi(-10)).unwrap(),
            FixedMultiplier { m0: 1 << 30, n: 9 }
        );
        // A q that rounds up to 2^31 moves to the next exponent.
        let m = FixedMultiplier::new(1.0 - 1e-12).unwrap();
        assert_eq!(m, FixedMultiplier { m0: 1 << 30, n: -1 });
        assert_eq!(FixedMultiplier::new(0.0).unwrap().m0, 0);
        assert_eq!(FixedMultiplier::new(1e-12).unwrap().m0, 0);
        assert!(FixedMultiplier::new(f64::NAN).is_err());
        assert!(FixedMultiplier::new(-0.5).is_err());
        assert!(FixedMultiplier::new(1e12).is_err());
    }

    #[test]
    fn gemmlowp_rounding_by_hand() {
        // 2·a·b / 2^32 with a = 2^30: b/2 → ties go up: 3/2 → 2, -3/2 → -1, -1/2 → 0.
        assert_eq!(saturating_rounding_doubling_high_mul(1 << 30, 3), 2);
        assert_eq!(saturating_rounding_doubling_high_mul(1 << 30, -3), -1);
        assert_eq!(saturating_rounding_doubling_high_mul(1 << 30, -1), 0);
        assert_eq!(saturating_rounding_doubling_high_mul(i32::MIN, i32::MIN), i32::MAX);
        assert_eq!(saturating_rounding_doubling_high_mul(i32::MAX, i32::MAX), i32::MAX - 1);
        // RoundingDivideByPOT: ±2.5 → ±3, ±1.5 → ±2, 2.25 → 2.
        assert_eq!(rounding_divide_by_pot(5, 1), 3);
        assert_eq!(rounding_divide_by_pot(-5, 1), -3);
        assert_eq!(rounding_divide_by_pot(-3, 1), -2);
        assert_eq!(rounding_divide_by_pot(9, 2), 2);
        // Ties to even: 2.5 → 2, -2.5 → -2, 1.5 → 2, -0.5 → 0, 2.75 → 3.
        assert_eq!(rounding_divide_by_pot_even(5, 1), 2);
        assert_eq!(rounding_divide_by_pot_even(-5, 1), -2);
        assert_eq!(rounding_divide_by_pot_even(3, 1), 2);
        assert_eq!(rounding_divide_by_pot_even(-1, 1), 0);
        assert_eq!(rounding_divide_by_pot_even(11, 2), 3);
        // TFLite: MultiplyByQuantizedMultiplier(1000, QuantizeMultiplier(0.5)) = 500.
        let half = FixedMultiplier::new(0.5).unwrap();
        assert_eq!(half.apply(1000, Rounding::TiesAwayFromZero), 500);
        assert_eq!(half.apply(1001, Rounding::TiesAwayFromZero), 501);
        assert_eq!(half.apply(1001, Rounding::TiesToEven), 500);
        assert_eq!(half.apply(1003, Rounding::TiesToEven), 502);
        assert_eq!(half.apply(-1001, Rounding::TiesToEven), -500);
        // M ≥ 1 shifts left first: 3 · 1.5 = 4.5.
        let m = FixedMultiplier::new(1.5).unwrap();
        assert_eq!(m.apply(3, Rounding::TiesAwayFromZero), 5);
        assert_eq!(m.apply(3, Rounding::TiesToEven), 4);
        assert_eq!(requantize(1001, half, -128, -128, 127, Rounding::TiesToEven), 127);
    }
}
