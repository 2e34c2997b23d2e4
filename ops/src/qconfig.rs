//! Quantization config: which spec each weight, activation and mixing weight gets, from a preset
//! (like MQBench's deploy backends) with overrides per op type.
//!
//! ```toml
//! preset = "tensorrt"                  # tensorrt | onnx_qdq | paddle | lsq | float
//! [act]                                # replaces the preset's activation spec everywhere
//! bits = 6
//! observer = { kind = "moving_average_min_max", averaging_constant = 0.01 }
//! [ops.sep_conv_5x5.weight]            # only the weights of sep_conv_5x5
//! bits = 4
//! observer = { kind = "lsq" }
//! [ops.max_pool_3x3]
//! float = true                         # leave this op unquantized
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::quant::{Granularity, ObserverKind, QuantSpec, RawQuantSpec, SpecError};

/// A named starting point for the specs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Preset {
    /// TensorRT: int8 symmetric per-channel weights read on their current value (max|w|/127,
    /// integers in [−127, 127]), int8 symmetric per-tensor activations (moving-average
    /// min/max, torch.ao's default activation observer).
    #[default]
    Tensorrt,
    /// ONNX QDQ: int8 symmetric per-channel weights as TensorRT's, uint8 affine per-tensor
    /// activations.
    OnnxQdq,
    /// PaddleSlim: channel-wise abs-max weights, moving-average abs-max activations (rate 0.9).
    Paddle,
    /// LSQ: learned step sizes for weights (per channel) and activations.
    Lsq,
    /// No quantization at all.
    Float,
}

/// Where a spec applies inside an op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Site {
    /// Convolution (and folded BN) weights.
    Weight,
    /// Activations (op outputs, intermediate activations, add/concat outputs).
    Act,
    /// DARTS mixing weights, softmax outputs.
    Mix,
}

/// Per-op-type overrides.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpOverride {
    /// Leave the op unquantized.
    #[serde(default)]
    pub float: bool,
    /// Weight spec of this op type.
    #[serde(default)]
    pub weight: Option<QuantSpec>,
    /// Activation spec of this op type.
    #[serde(default)]
    pub act: Option<QuantSpec>,
}

/// The quantization config of a network.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuantConfig {
    /// The starting point.
    #[serde(default)]
    pub preset: Preset,
    /// Replaces the preset's weight spec.
    #[serde(default)]
    pub weight: Option<QuantSpec>,
    /// Replaces the preset's activation spec.
    #[serde(default)]
    pub act: Option<QuantSpec>,
    /// Replaces the preset's mixing-weight spec (default: 8-bit fixed `[0, 1]`).
    #[serde(default)]
    pub mix: Option<QuantSpec>,
    /// Overrides by op type (`sep_conv_3x3`, `max_pool_3x3`, `stem`, `classifier`, ...).
    #[serde(default)]
    pub ops: BTreeMap<String, OpOverride>,
    /// Also fake-quantize BatchNorm's folded multiplier `γ/σ` on its own, per tensor, with the
    /// op's weight bits (qdarts 0.1's behaviour). Off by default, as torch.ao's ConvBn QAT and
    /// TensorRT: the multiplier is folded into the per-channel requantization scale, which the
    /// integer model holds to 31 bits, so an 8-bit copy of it only costs small-γ channels their
    /// gain.
    #[serde(default)]
    pub quantize_bn_multiplier: bool,
}

const PER_OUT_CHANNEL: Granularity = Granularity::PerChannel { axis: 0 };

impl Preset {
    /// The preset's spec at a site (`None`: float).
    ///
    /// Weight specs are per output channel (axis 0 of a conv weight); folded BN weights use
    /// [`QuantConfig::bn_weight`] instead.
    pub fn spec(self, site: Site) -> Result<Option<QuantSpec>, SpecError> {
        let ema = ObserverKind::MovingAverageMinMax { averaging_constant: 0.01 };
        Ok(Some(match (self, site) {
            (Preset::Float, _) => return Ok(None),
            (_, Site::Mix) => QuantSpec::unit_interval(8)?,
            // Both read each weight on its current value (no running min/max), per output
            // channel, scale max|w|/127, integers in [−127, 127]: NVIDIA's TensorRT QAT toolkit
            // (pytorch-quantization, `axis=0`, max calibration, narrow range) and onnxruntime's
            // symmetric int8 weights; the same arithmetic as Paddle's channel_wise_abs_max.
            (Preset::Tensorrt | Preset::OnnxQdq, Site::Weight) => {
                QuantSpec::with(8, true, true, PER_OUT_CHANNEL, ObserverKind::ChannelWiseAbsMax)?
            }
            (Preset::Tensorrt, Site::Act) => {
                QuantSpec::with(8, true, true, Granularity::PerTensor, ema)?
            }
            (Preset::OnnxQdq, Site::Act) => {
                QuantSpec::with(8, false, false, Granularity::PerTensor, ema)?
            }
            (Preset::Paddle, Site::Weight) => {
                QuantSpec::with(8, true, true, PER_OUT_CHANNEL, ObserverKind::ChannelWiseAbsMax)?
            }
            (Preset::Paddle, Site::Act) => QuantSpec::with(
                8,
                true,
                true,
                Granularity::PerTensor,
                ObserverKind::MovingAverageAbsMax { rate: 0.9 },
            )?,
            (Preset::Lsq, Site::Weight) => {
                QuantSpec::with(8, true, true, PER_OUT_CHANNEL, ObserverKind::Lsq)?
            }
            (Preset::Lsq, Site::Act) => {
                QuantSpec::with(8, true, true, Granularity::PerTensor, ObserverKind::Lsq)?
            }
        }))
    }
}

impl QuantConfig {
    /// A config that is just a preset.
    pub fn preset(preset: Preset) -> Self {
        QuantConfig { preset, ..Default::default() }
    }

    /// No quantization.
    pub fn float() -> Self {
        Self::preset(Preset::Float)
    }

    /// The spec for `site` of an op of type `op` (`None`: leave it float).
    pub fn spec_for(&self, op: &str, site: Site) -> Result<Option<QuantSpec>, SpecError> {
        let ov = self.ops.get(op);
        if ov.is_some_and(|o| o.float) {
            return Ok(None);
        }
        let local = match site {
            Site::Weight => ov.and_then(|o| o.weight),
            Site::Act => ov.and_then(|o| o.act),
            Site::Mix => None,
        };
        let global = match site {
            Site::Weight => self.weight,
            Site::Act => self.act,
            Site::Mix => self.mix,
        };
        match local.or(global) {
            Some(s) => Ok(Some(s)),
            None => self.preset.spec(site),
        }
    }

    /// The spec of a folded BatchNorm weight (`[C]`, one value per channel) when
    /// [`QuantConfig::quantize_bn_multiplier`] is on: the op's weight spec made per-tensor.
    pub fn bn_weight(&self, op: &str) -> Result<Option<QuantSpec>, SpecError> {
        if !self.quantize_bn_multiplier {
            return Ok(None);
        }
        match self.spec_for(op, Site::Weight)? {
            None => Ok(None),
            Some(s) => {
                let observer = match s.observer() {
                    ObserverKind::ChannelWiseAbsMax => ObserverKind::AbsMax,
                    o => o,
                };
                let raw = RawQuantSpec {
                    granularity: Granularity::PerTensor,
                    observer,
                    ..RawQuantSpec::from(s)
                };
                QuantSpec::new(raw).map(Some)
            }
        }
    }

    /// Checks every spec the config can produce, so that errors surface when the config is read.
    pub fn validate(&self) -> Result<(), SpecError> {
        let names: Vec<&str> =
            self.ops.keys().map(String::as_str).chain(std::iter::once("")).collect();
        for op in names {
            for site in [Site::Weight, Site::Act, Site::Mix] {
                self.spec_for(op, site)?;
            }
            self.bn_weight(op)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensorrt_is_per_channel_int8_weights_and_per_tensor_int8_acts() {
        let c = QuantConfig::preset(Preset::Tensorrt);
        let w = c.spec_for("sep_conv_3x3", Site::Weight).unwrap().unwrap();
        assert_eq!(w.granularity(), Granularity::PerChannel { axis: 0 });
        assert_eq!((w.bits(), w.signed(), w.is_symmetric()), (8, true, true));
        let a = c.spec_for("sep_conv_3x3", Site::Act).unwrap().unwrap();
        assert_eq!(a.granularity(), Granularity::PerTensor);
        assert!(a.is_symmetric());
        let m = c.spec_for("mixed", Site::Mix).unwrap().unwrap();
        assert_eq!(m.observer(), ObserverKind::Fixed { min: 0.0, max: 1.0 });
        assert_eq!(m.quant_range(), (0, 255));
    }

    #[test]
    fn float_preset_quantizes_nothing() {
        let c = QuantConfig::float();
        for site in [Site::Weight, Site::Act, Site::Mix] {
            assert!(c.spec_for("sep_conv_3x3", site).unwrap().is_none());
        }
    }

    #[test]
    fn per_op_overrides_beat_global_overrides_beat_the_preset() {
        let text = r#"
            preset = "paddle"
            [act]
            bits = 6
            observer = { kind = "min_max" }
            [ops.sep_conv_5x5.weight]
            bits = 4
            granularity = { per_channel = { axis = 0 } }
            observer = { kind = "lsq" }
            [ops.max_pool_3x3]
            float = true
        "#;
        let c: QuantConfig = toml::from_str(text).unwrap();
        c.validate().unwrap();
        assert_eq!(c.spec_for("sep_conv_5x5", Site::Weight).unwrap().unwrap().bits(), 4);
        let w3 = c.spec_for("sep_conv_3x3", Site::Weight).unwrap().unwrap();
        assert_eq!(w3.observer(), ObserverKind::ChannelWiseAbsMax);
        assert_eq!(c.spec_for("sep_conv_3x3", Site::Act).unwrap().unwrap().bits(), 6);
        assert!(c.spec_for("max_pool_3x3", Site::Act).unwrap().is_none());
        // The BN multiplier is left float unless asked for; then it is per tensor, and
        // channel-wise abs-max becomes abs-max.
        assert!(c.bn_weight("sep_conv_3x3").unwrap().is_none());
        let c = QuantConfig { quantize_bn_multiplier: true, ..c };
        let bn = c.bn_weight("sep_conv_3x3").unwrap().unwrap();
        assert_eq!(bn.granularity(), Granularity::PerTensor);
        assert_eq!(bn.observer(), ObserverKind::AbsMax);
    }

    #[test]
    fn unknown_keys_and_presets_are_errors() {
        let err = toml::from_str::<QuantConfig>("preset = \"tensorrt\"\nweights = 3").unwrap_err();
        assert!(err.to_string().contains("weights"), "{err}");
        let err = toml::from_str::<QuantConfig>("preset = \"tflite\"").unwrap_err();
        assert!(err.to_string().contains("tflite"), "{err}");
    }
}
