//! `[search.bits]` and `[search.cost]`: the bit-width search and the hardware cost.

use serde::{Deserialize, Serialize};

/// `[search.bits]`: EdMIPS-style differentiable bit-width search. Every op with convolutions
/// on every edge gets parameters over these widths for its weights and for its activations;
/// the derived genotype carries the most likely widths of each kept op.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BitsConfig {
    /// Candidate weight widths (2 to 8, each once), e.g. `[2, 4, 8]`.
    pub weight: Vec<u32>,
    /// Candidate activation widths, e.g. `[4, 8]`.
    pub act: Vec<u32>,
}

/// What the cost counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CostMetric {
    /// Expected BitOPs per image: MACs × weight bits × activation bits.
    Bitops,
    /// Expected bytes of the weights.
    Size,
}

/// How the cost enters the loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum PenaltyKind {
    /// `weight·max(0, cost/target − 1)`: free below the target, linear above it.
    #[default]
    Hinge,
    /// `weight·ln(cost)`: always pushes down, by the same relative amount at any scale.
    Log,
}

/// Which architecture parameters the cost trains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum CostCharge {
    /// Only the bit-width parameters (EdMIPS): the op choice is left to the loss. The
    /// default: charging the op choice too makes parameter-free ops, which cost nothing,
    /// win every edge of a small search.
    #[default]
    Bits,
    /// The op choice α too (FBNet-style hardware-aware op search).
    OpsAndBits,
}

/// `[search.cost]`: a differentiable hardware cost of the architecture (the expected BitOPs or
/// weight bytes of the derived network under the softmaxes), added to the validation loss
/// that trains the architecture parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CostConfig {
    /// What is counted.
    pub metric: CostMetric,
    /// The budget of the hinge penalty, in BitOPs per image or bytes, for the network at the
    /// search's shape (see docs/guide/bit-search.md for how it is estimated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<f64>,
    /// λ.
    pub weight: f64,
    /// The penalty's form.
    #[serde(default)]
    pub penalty: PenaltyKind,
    /// Which parameters it trains.
    #[serde(default)]
    pub charge: CostCharge,
}

impl CostConfig {
    /// The penalty as the ops crate computes it.
    pub fn penalty(&self) -> qdarts_ops::cost::Penalty {
        match self.penalty {
            PenaltyKind::Hinge => qdarts_ops::cost::Penalty::Hinge {
                target: self.target.unwrap_or(f64::INFINITY),
                weight: self.weight,
            },
            PenaltyKind::Log => qdarts_ops::cost::Penalty::Log { weight: self.weight },
        }
    }
}
