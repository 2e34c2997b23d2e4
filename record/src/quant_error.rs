//! A quantizer's error on the last tensor it saw: the one type the quantizers report
//! (`qdarts_ops`), the loop writes as a `quant_error.csv` row with its epoch and step, and the
//! dashboard and the plots read back.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::rows::{Table, display, fixed3, fixed6, scientific};

/// What a quantizer quantizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TensorRole {
    /// A weight (or folded BN weight).
    Weight,
    /// An activation.
    Act,
    /// DARTS mixing weights (softmax of the architecture parameters).
    Mix,
}

impl TensorRole {
    /// The name written in `quant_error.csv`'s `kind` column.
    pub fn name(self) -> &'static str {
        match self {
            TensorRole::Weight => "weight",
            TensorRole::Act => "act",
            TensorRole::Mix => "mix",
        }
    }
}

impl fmt::Display for TensorRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One quantizer's error on the last tensor it saw.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuantError {
    /// Stable layer path, e.g. `cells.3.edges.5.sep_conv_3x3.op2.conv_pw.weight`.
    pub layer: String,
    /// Weight, activation or mixing weight.
    pub kind: TensorRole,
    /// Bit width.
    pub bits: u32,
    /// Step size (mean over channels when per-channel).
    pub scale: f64,
    /// Zero point (mean over channels when per-channel).
    pub zero_point: f64,
    /// Mean squared error between the tensor and its fake-quantized value.
    pub mse: f64,
    /// Signal-to-quantization-noise ratio in dB, `10·log10(Σx² / Σ(x − x̂)²)`, finite.
    pub sqnr_db: f64,
    /// Fraction of elements outside the integer range before clamping.
    pub clip_frac: f64,
}

/// `quant_error.csv`: one quantizer's error at one step, in the columns of
/// [`Table::COLUMNS`] (the error's fields follow the epoch and step).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(from = "Columns", into = "Columns")]
pub struct QuantErrorRow {
    /// Epoch.
    pub epoch: usize,
    /// Global step.
    pub step: usize,
    /// The quantizer's error at that step.
    pub error: QuantError,
}

impl Table for QuantErrorRow {
    const FILE: &'static str = "quant_error.csv";
    const COLUMNS: &'static [&'static str] = &[
        "epoch",
        "step",
        "layer",
        "kind",
        "bits",
        "scale",
        "zero_point",
        "mse",
        "sqnr_db",
        "clip_frac",
    ];
    const STEPPED: bool = true;
}

/// The row as its CSV columns, with their number formats.
#[derive(Serialize, Deserialize)]
struct Columns {
    epoch: usize,
    step: usize,
    layer: String,
    kind: TensorRole,
    bits: u32,
    #[serde(serialize_with = "scientific")]
    scale: f64,
    #[serde(serialize_with = "display")]
    zero_point: f64,
    #[serde(serialize_with = "scientific")]
    mse: f64,
    #[serde(serialize_with = "fixed3")]
    sqnr_db: f64,
    #[serde(serialize_with = "fixed6")]
    clip_frac: f64,
}

impl From<QuantErrorRow> for Columns {
    fn from(r: QuantErrorRow) -> Self {
        let e = r.error;
        Columns {
            epoch: r.epoch,
            step: r.step,
            layer: e.layer,
            kind: e.kind,
            bits: e.bits,
            scale: e.scale,
            zero_point: e.zero_point,
            mse: e.mse,
            sqnr_db: e.sqnr_db,
            clip_frac: e.clip_frac,
        }
    }
}

impl From<Columns> for QuantErrorRow {
    fn from(c: Columns) -> Self {
        QuantErrorRow {
            epoch: c.epoch,
            step: c.step,
            error: QuantError {
                layer: c.layer,
                kind: c.kind,
                bits: c.bits,
                scale: c.scale,
                zero_point: c.zero_point,
                mse: c.mse,
                sqnr_db: c.sqnr_db,
                clip_frac: c.clip_frac,
            },
        }
    }
}
