//! `QuantSpec`: what a quantizer computes (bits, sign, symmetry, granularity, rounding, observer).
//!
//! A spec is validated when it is built or deserialized, so an invalid one never reaches a kernel.
//! The integer range follows torch.ao: signed `[-2^(b-1), 2^(b-1)-1]`, unsigned `[0, 2^b-1]`,
//! unless `quant_min`/`quant_max` narrow it. Paddle-style abs-max observers use Paddle's own
//! grid (`bin_cnt = 2^(b-1)-1`, see [`QuantSpec::grid_range`]).

use serde::{Deserialize, Serialize};

use super::error::SpecError;
pub use super::observer_kind::{ObserverKind, RawObserver};

/// Rounding of the scaled value to an integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum RoundMode {
    /// Round half to even: `std::nearbyint`, ONNX QuantizeLinear, torch, Paddle `round_type` 0.
    #[default]
    TiesToEven,
    /// Round half away from zero: gemmlowp's RoundingDivideByPOT, Paddle `round_type` 1.
    TiesAwayFromZero,
}

/// Which elements share one scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Granularity {
    /// One scale (and zero point) for the whole tensor.
    #[default]
    PerTensor,
    /// One scale per index along `axis` (0 = output channels of a conv weight).
    PerChannel {
        /// The channel axis.
        axis: usize,
    },
}

impl Granularity {
    /// The channel axis, if per-channel.
    pub fn axis(&self) -> Option<usize> {
        match self {
            Granularity::PerTensor => None,
            Granularity::PerChannel { axis } => Some(*axis),
        }
    }
}

/// The full description of one quantizer. Build with [`QuantSpec::new`] or deserialize; both
/// validate.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawQuantSpec", into = "RawQuantSpec")]
pub struct QuantSpec {
    bits: u32,
    signed: bool,
    symmetric: bool,
    granularity: Granularity,
    round: RoundMode,
    observer: ObserverKind,
    quant_min: Option<i32>,
    quant_max: Option<i32>,
}

/// The unvalidated wire form of [`QuantSpec`].
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawQuantSpec {
    /// Bit width, 2 to 16.
    pub bits: u32,
    /// Signed integers (e.g. int8) or unsigned (uint8).
    #[serde(default = "default_true")]
    pub signed: bool,
    /// Symmetric (zero point 0, or mid-range for unsigned) or affine (free zero point).
    #[serde(default = "default_true")]
    pub symmetric: bool,
    /// Per-tensor or per-channel.
    #[serde(default)]
    pub granularity: Granularity,
    /// Rounding at ties.
    #[serde(default)]
    pub round: RoundMode,
    /// Where the scale comes from.
    pub observer: ObserverKind,
    /// Narrower integer minimum (e.g. -127 for a "narrow range" int8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quant_min: Option<i32>,
    /// Narrower integer maximum.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quant_max: Option<i32>,
}

fn default_true() -> bool {
    true
}

impl TryFrom<RawQuantSpec> for QuantSpec {
    type Error = SpecError;

    fn try_from(raw: RawQuantSpec) -> Result<Self, SpecError> {
        QuantSpec::new(raw)
    }
}

impl From<QuantSpec> for RawQuantSpec {
    fn from(s: QuantSpec) -> Self {
        RawQuantSpec {
            bits: s.bits,
            signed: s.signed,
            symmetric: s.symmetric,
            granularity: s.granularity,
            round: s.round,
            observer: s.observer,
            quant_min: s.quant_min,
            quant_max: s.quant_max,
        }
    }
}

impl QuantSpec {
    /// Validates a raw spec.
    pub fn new(raw: RawQuantSpec) -> Result<Self, SpecError> {
        if !(2..=16).contains(&raw.bits) {
            return Err(SpecError::Bits(raw.bits));
        }
        let spec = QuantSpec {
            bits: raw.bits,
            signed: raw.signed,
            symmetric: raw.symmetric,
            granularity: raw.granularity,
            round: raw.round,
            observer: raw.observer,
            quant_min: raw.quant_min,
            quant_max: raw.quant_max,
        };
        let (full_min, full_max) = spec.full_range();
        let (qmin, qmax) = spec.quant_range();
        if qmin >= qmax {
            return Err(SpecError::EmptyRange { quant_min: qmin, quant_max: qmax });
        }
        if qmin < full_min || qmax > full_max {
            return Err(SpecError::RangeExceedsBits {
                quant_min: qmin,
                quant_max: qmax,
                bits: spec.bits,
                signed: spec.signed,
            });
        }
        match spec.observer {
            o if o.is_abs_max_family() && !spec.symmetric => {
                return Err(SpecError::AbsMaxNeedsSymmetric(o.name()));
            }
            ObserverKind::ChannelWiseAbsMax if spec.granularity.axis().is_none() => {
                return Err(SpecError::ChannelWiseNeedsAxis);
            }
            ObserverKind::Fixed { min, max }
                if !(min.is_finite() && max.is_finite() && min < max) =>
            {
                return Err(SpecError::FixedRange { min, max });
            }
            ObserverKind::RangeAbsMax { window: 0 } => {
                return Err(SpecError::Window);
            }
            ObserverKind::MovingAverageAbsMax { rate } if !(rate > 0.0 && rate < 1.0) => {
                return Err(SpecError::Rate { name: "rate", value: rate, range: "(0, 1)" });
            }
            ObserverKind::MovingAverageMinMax { averaging_constant: c }
                if !(c > 0.0 && c <= 1.0) =>
            {
                return Err(SpecError::Rate {
                    name: "averaging_constant",
                    value: c,
                    range: "(0, 1]",
                });
            }
            _ => {}
        }
        if spec.observer.is_abs_max_family() && (raw.quant_min.is_some() || raw.quant_max.is_some())
        {
            return Err(SpecError::AbsMaxFixedGrid);
        }
        Ok(spec)
    }

    /// A ties-to-even spec on the full integer range of `bits`.
    pub fn with(
        bits: u32,
        signed: bool,
        symmetric: bool,
        granularity: Granularity,
        observer: ObserverKind,
    ) -> Result<Self, SpecError> {
        Self::new(RawQuantSpec {
            bits,
            signed,
            symmetric,
            granularity,
            round: RoundMode::TiesToEven,
            observer,
            quant_min: None,
            quant_max: None,
        })
    }

    /// The fixed `[0, 1]` range of softmax outputs and mixing weights, unsigned, per tensor.
    pub fn unit_interval(bits: u32) -> Result<Self, SpecError> {
        Self::with(
            bits,
            false,
            false,
            Granularity::PerTensor,
            ObserverKind::Fixed { min: 0.0, max: 1.0 },
        )
    }

    /// A common preset: symmetric signed per-tensor, ties-to-even, with the given observer.
    pub fn symmetric(bits: u32, observer: ObserverKind) -> Result<Self, SpecError> {
        Self::with(bits, true, true, Granularity::PerTensor, observer)
    }

    /// Returns the spec with another granularity, validated again.
    pub fn with_granularity(self, granularity: Granularity) -> Result<Self, SpecError> {
        Self::new(RawQuantSpec { granularity, ..self.into() })
    }

    /// Returns the spec with another rounding mode.
    pub fn with_round(self, round: RoundMode) -> Self {
        QuantSpec { round, ..self }
    }

    /// Returns the spec as signed or unsigned, validated again.
    pub fn with_signed(self, signed: bool) -> Result<Self, SpecError> {
        Self::new(RawQuantSpec { signed, ..self.into() })
    }

    /// Bit width.
    pub fn bits(&self) -> u32 {
        self.bits
    }
    /// Signed integers.
    pub fn signed(&self) -> bool {
        self.signed
    }
    /// Symmetric quantization.
    pub fn is_symmetric(&self) -> bool {
        self.symmetric
    }
    /// Granularity.
    pub fn granularity(&self) -> Granularity {
        self.granularity
    }
    /// Rounding mode.
    pub fn round(&self) -> RoundMode {
        self.round
    }
    /// Observer.
    pub fn observer(&self) -> ObserverKind {
        self.observer
    }

    fn full_range(&self) -> (i32, i32) {
        if self.signed {
            (-(1 << (self.bits - 1)), (1 << (self.bits - 1)) - 1)
        } else {
            (0, (1 << self.bits) - 1)
        }
    }

    /// The integer range `[quant_min, quant_max]` of the torch-style grid.
    pub fn quant_range(&self) -> (i32, i32) {
        let (lo, hi) = self.full_range();
        (self.quant_min.unwrap_or(lo), self.quant_max.unwrap_or(hi))
    }

    /// The same spec at `bits` wide (2 to 8): the range is the new width's full one, or its
    /// narrow one (`[−2^(b−1)+1, 2^(b−1)−1]`) when this spec's range was narrow; other narrowed
    /// ranges belong to their width and are dropped.
    pub fn at_bits(self, bits: u32) -> Result<Self, SpecError> {
        if !(2..=8).contains(&bits) {
            return Err(SpecError::Bits(bits));
        }
        let (lo, hi) = self.full_range();
        let narrow = self.signed && self.quant_range() == (lo + 1, hi);
        let quant_min = narrow.then(|| -(1 << (bits - 1)) + 1);
        Self::new(RawQuantSpec { bits, quant_min, quant_max: None, ..self.into() })
    }

    /// Paddle's `bin_cnt`: the integer that the abs-max threshold maps to.
    pub fn bin_cnt(&self) -> i32 {
        if self.signed { (1 << (self.bits - 1)) - 1 } else { (1 << self.bits) - 1 }
    }

    /// The integer range that values are clamped to on this spec's grid.
    ///
    /// Abs-max observers follow Paddle: ties-to-even clips to `[-bin_cnt-1, bin_cnt]`,
    /// ties-away clips `x` to `[-s, s]` first, which is the range `[-bin_cnt, bin_cnt]`.
    pub fn grid_range(&self) -> (i32, i32) {
        if self.observer.is_abs_max_family() {
            let b = self.bin_cnt();
            match (self.signed, self.round) {
                (false, _) => (0, b),
                (true, RoundMode::TiesToEven) => (-b - 1, b),
                (true, RoundMode::TiesAwayFromZero) => (-b, b),
            }
        } else {
            self.quant_range()
        }
    }

    /// Checks the spec against the rank of the tensor it will quantize.
    pub fn check_rank(&self, rank: usize) -> Result<(), SpecError> {
        match self.granularity.axis() {
            Some(axis) if axis >= rank => Err(SpecError::Axis { axis, rank }),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(bits: u32) -> RawQuantSpec {
        RawQuantSpec {
            bits,
            signed: true,
            symmetric: true,
            granularity: Granularity::PerTensor,
            round: RoundMode::TiesToEven,
            observer: ObserverKind::MinMax,
            quant_min: None,
            quant_max: None,
        }
    }

    #[test]
    fn bits_outside_2_to_16_are_rejected() {
        assert!(matches!(QuantSpec::new(raw(0)), Err(SpecError::Bits(0))));
        assert!(matches!(QuantSpec::new(raw(1)), Err(SpecError::Bits(1))));
        assert!(matches!(QuantSpec::new(raw(17)), Err(SpecError::Bits(17))));
        assert!(QuantSpec::new(raw(2)).is_ok());
        assert!(QuantSpec::new(raw(16)).is_ok());
    }

    #[test]
    fn int8_ranges_match_torch_dtypes() {
        let s = QuantSpec::new(raw(8)).unwrap();
        assert_eq!(s.quant_range(), (-128, 127));
        let u = QuantSpec::new(RawQuantSpec { signed: false, ..raw(8) }).unwrap();
        assert_eq!(u.quant_range(), (0, 255));
    }

    #[test]
    fn quant_min_not_below_quant_max_is_an_error() {
        let r = RawQuantSpec { quant_min: Some(5), quant_max: Some(5), ..raw(8) };
        let err = QuantSpec::new(r).unwrap_err();
        assert!(matches!(err, SpecError::EmptyRange { quant_min: 5, quant_max: 5 }));
        assert!(err.to_string().contains("quant_min"));
        let r = RawQuantSpec { quant_min: Some(-300), ..raw(8) };
        assert!(matches!(QuantSpec::new(r), Err(SpecError::RangeExceedsBits { .. })));
    }

    #[test]
    fn per_channel_axis_must_exist_in_the_tensor() {
        let s = QuantSpec::new(RawQuantSpec {
            granularity: Granularity::PerChannel { axis: 4 },
            ..raw(8)
        })
        .unwrap();
        assert!(s.check_rank(5).is_ok());
        assert!(matches!(s.check_rank(4), Err(SpecError::Axis { axis: 4, rank: 4 })));
    }

    #[test]
    fn paddle_grids_follow_round_type() {
        let s = QuantSpec::symmetric(8, ObserverKind::AbsMax).unwrap();
        assert_eq!(s.bin_cnt(), 127);
        assert_eq!(s.grid_range(), (-128, 127));
        assert_eq!(s.with_round(RoundMode::TiesAwayFromZero).grid_range(), (-127, 127));
    }

    #[test]
    fn abs_max_observers_refuse_affine_specs() {
        let r = RawQuantSpec { symmetric: false, observer: ObserverKind::AbsMax, ..raw(8) };
        assert!(matches!(QuantSpec::new(r), Err(SpecError::AbsMaxNeedsSymmetric(_))));
        let r = RawQuantSpec { observer: ObserverKind::ChannelWiseAbsMax, ..raw(8) };
        assert!(matches!(QuantSpec::new(r), Err(SpecError::ChannelWiseNeedsAxis)));
    }

    #[test]
    fn toml_round_trip_and_unknown_keys() {
        let text = r#"
            bits = 8
            granularity = { per_channel = { axis = 0 } }
            round = "ties_away_from_zero"
            observer = { kind = "moving_average_abs_max", rate = 0.9 }
        "#;
        let s: QuantSpec = toml::from_str(text).unwrap();
        assert_eq!(s.granularity(), Granularity::PerChannel { axis: 0 });
        assert_eq!(s.observer(), ObserverKind::MovingAverageAbsMax { rate: 0.9 });
        let back: QuantSpec = toml::from_str(&toml::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);

        let err =
            toml::from_str::<QuantSpec>("bits = 8\nobserver = { kind = \"abs_max\" }\nbitz = 3")
                .unwrap_err();
        assert!(err.to_string().contains("bitz"), "{err}");
        let err =
            toml::from_str::<QuantSpec>("bits = 17\nobserver = { kind = \"lsq\" }").unwrap_err();
        assert!(err.to_string().contains("17"), "{err}");
        let err = toml::from_str::<QuantSpec>("bits = 8\nobserver = { kind = \"lsq\", rate = 1 }")
            .unwrap_err();
        assert!(err.to_string().contains("rate"), "{err}");
        let err =
            toml::from_str::<QuantSpec>("bits = 8\nobserver = { kind = \"minmax\" }").unwrap_err();
        assert!(err.to_string().contains("unknown observer kind `minmax`"), "{err}");
        let s: QuantSpec =
            toml::from_str("bits = 4\nobserver = { kind = \"range_abs_max\", window = 5 }")
                .unwrap();
        assert_eq!(s.observer(), ObserverKind::RangeAbsMax { window: 5 });
    }
}
