//! `ObserverKind`: where a quantizer's scale (and zero point) comes from, and its TOML form
//! (`observer = { kind = "…", … }`), validated so that a field the kind does not take is an
//! error.

use serde::{Deserialize, Serialize};

/// Where a quantizer's scale (and zero point) comes from.
///
/// In TOML: `observer = { kind = "moving_average_abs_max", rate = 0.9 }`; a field that the kind
/// does not take is an error.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawObserver", into = "RawObserver")]
pub enum ObserverKind {
    /// Paddle `fake_quantize_abs_max`: threshold = max|x| of the current tensor.
    AbsMax,
    /// Paddle `fake_channel_wise_quantize_abs_max`: max|x| per channel (needs per-channel
    /// granularity).
    ChannelWiseAbsMax,
    /// Paddle `fake_quantize_range_abs_max`: the max of the batch abs-maxima over the last
    /// `window` training steps.
    RangeAbsMax {
        /// Number of past batches in the window.
        window: usize,
    },
    /// Paddle `fake_quantize_moving_average_abs_max`: `state = rate·state + 1`,
    /// `accum = rate·accum + max|x|`, threshold = `accum / state`.
    MovingAverageAbsMax {
        /// Moving rate (Paddle's default 0.9).
        rate: f32,
    },
    /// torch.ao `MinMaxObserver` / `PerChannelMinMaxObserver`: running min and max of every
    /// tensor seen.
    MinMax,
    /// torch.ao `MovingAverageMinMaxObserver`: `min += c·(min(x) - min)`, likewise max.
    MovingAverageMinMax {
        /// Averaging constant `c` (torch's default 0.01).
        averaging_constant: f32,
    },
    /// A fixed range `[min, max]` (PT2E's fixed-qparams spec): softmax outputs and DARTS mixing
    /// weights live in `[0, 1]`.
    Fixed {
        /// Smallest representable value.
        min: f32,
        /// Largest representable value.
        max: f32,
    },
    /// LSQ (Esser et al., 2020): a learnable step size initialised to `2·mean|x|/sqrt(Qp)`,
    /// with gradient scale `1/sqrt(N·Qp)`; affine specs also learn the zero point (LSQ+).
    Lsq,
}

/// The wire form of [`ObserverKind`]: serde's internally tagged enums ignore unknown fields of
/// unit variants, so the kind and its fields are checked by hand.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawObserver {
    kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    window: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rate: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    averaging_constant: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    min: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max: Option<f32>,
}

impl TryFrom<RawObserver> for ObserverKind {
    type Error = String;

    fn try_from(r: RawObserver) -> Result<Self, String> {
        let given: Vec<&str> = [
            r.window.map(|_| "window"),
            r.rate.map(|_| "rate"),
            r.averaging_constant.map(|_| "averaging_constant"),
            r.min.map(|_| "min"),
            r.max.map(|_| "max"),
        ]
        .into_iter()
        .flatten()
        .collect();
        let (kind, takes): (ObserverKind, &[&str]) = match r.kind.as_str() {
            "abs_max" => (ObserverKind::AbsMax, &[]),
            "channel_wise_abs_max" => (ObserverKind::ChannelWiseAbsMax, &[]),
            "range_abs_max" => {
                (ObserverKind::RangeAbsMax { window: r.window.unwrap_or(10000) }, &["window"])
            }
            "moving_average_abs_max" => {
                (ObserverKind::MovingAverageAbsMax { rate: r.rate.unwrap_or(0.9) }, &["rate"])
            }
            "min_max" => (ObserverKind::MinMax, &[]),
            "moving_average_min_max" => (
                ObserverKind::MovingAverageMinMax {
                    averaging_constant: r.averaging_constant.unwrap_or(0.01),
                },
                &["averaging_constant"],
            ),
            "lsq" => (ObserverKind::Lsq, &[]),
            "fixed" => match (r.min, r.max) {
                (Some(min), Some(max)) => (ObserverKind::Fixed { min, max }, &["min", "max"]),
                _ => return Err("observer `fixed` needs both `min` and `max`".into()),
            },
            other => {
                return Err(format!(
                    "unknown observer kind `{other}`: expected one of abs_max, \
                     channel_wise_abs_max, range_abs_max, moving_average_abs_max, min_max, \
                     moving_average_min_max, fixed, lsq"
                ));
            }
        };
        match given.iter().find(|f| !takes.contains(f)) {
            Some(f) => Err(format!("observer `{}` takes no field `{f}`", r.kind)),
            None => Ok(kind),
        }
    }
}

impl From<ObserverKind> for RawObserver {
    fn from(k: ObserverKind) -> Self {
        let mut r = RawObserver {
            kind: k.name().to_string(),
            window: None,
            rate: None,
            averaging_constant: None,
            min: None,
            max: None,
        };
        match k {
            ObserverKind::RangeAbsMax { window } => r.window = Some(window),
            ObserverKind::MovingAverageAbsMax { rate } => r.rate = Some(rate),
            ObserverKind::MovingAverageMinMax { averaging_constant } => {
                r.averaging_constant = Some(averaging_constant)
            }
            ObserverKind::Fixed { min, max } => {
                r.min = Some(min);
                r.max = Some(max);
            }
            _ => {}
        }
        r
    }
}

impl ObserverKind {
    /// Observers that compute a Paddle-style abs-max threshold.
    pub fn is_abs_max_family(&self) -> bool {
        matches!(
            self,
            ObserverKind::AbsMax
                | ObserverKind::ChannelWiseAbsMax
                | ObserverKind::RangeAbsMax { .. }
                | ObserverKind::MovingAverageAbsMax { .. }
        )
    }

    /// A short stable name, used in reports.
    pub fn name(&self) -> &'static str {
        match self {
            ObserverKind::AbsMax => "abs_max",
            ObserverKind::ChannelWiseAbsMax => "channel_wise_abs_max",
            ObserverKind::RangeAbsMax { .. } => "range_abs_max",
            ObserverKind::MovingAverageAbsMax { .. } => "moving_average_abs_max",
            ObserverKind::MinMax => "min_max",
            ObserverKind::MovingAverageMinMax { .. } => "moving_average_min_max",
            ObserverKind::Fixed { .. } => "fixed",
            ObserverKind::Lsq => "lsq",
        }
    }
}
