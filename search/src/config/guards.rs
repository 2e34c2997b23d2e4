//! `[search.guards]`: DARTS-, P-DARTS, PC-DARTS, β-DARTS and SDARTS-RS against the collapse.

use serde::{Deserialize, Serialize};

/// `[search.guards]`: guards against the collapse of DARTS' normal cell to parameter-free ops
/// (skip_connect, pooling). All off by default, which is the search as DARTS defines it.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuardConfig {
    /// DARTS- (Chu et al., ICLR 2021): `β·x` added to every stride-1 edge of the supernet, an
    /// auxiliary skip connection outside the softmax, so that skip_connect's own weight need
    /// not carry the residual path; β decays linearly from this value to 0 over the search
    /// (DARTS- uses 1; 0 is off). The derived network has no such term.
    #[serde(default)]
    pub aux_skip: f64,
    /// P-DARTS (Chen et al., ICCV 2019): at most this many skip_connect edges in the derived
    /// normal cell (P-DARTS uses 2); unset: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_skip: Option<usize>,
    /// P-DARTS' rule applied to every parameter-free op (pooling and skip_connect): at most
    /// this many such edges in the derived normal cell, the weakest taken off their edges one
    /// by one. For a search that collapses to pooling, where `max_skip` never acts; unset: no
    /// limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_param_free: Option<usize>,
    /// PC-DARTS (Xu et al., ICLR 2020): a parameter β per edge, softmax over each node's
    /// inputs, scaling each edge's output in the node sum and its rank in the derivation.
    /// PC-DARTS uses it with partial channels (`model.partial_channels > 1`), where sampling
    /// channels makes the edge choice noisy.
    #[serde(default)]
    pub edge_normalization: bool,
    /// β-DARTS (Ye et al., CVPR 2022): `λ_e·mean over edges of logsumexp(α_edge)` added to
    /// the architecture loss, every edge of both cell types, with `λ_e = beta_decay·e/E` at
    /// epoch `e` (0-based) of `E`. It keeps α's magnitudes from running away, which is what
    /// lets parameter-free ops win (0: off).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub beta_decay: f64,
    /// SDARTS-RS (Chen & Hsieh, ICML 2020): during the weight step each edge's softmax(α) gets
    /// uniform noise in `[-ε, ε]`, is clamped to `[0, 1]` and renormalized; `ε` grows linearly
    /// from 0.03 at the first epoch to this value (SDARTS uses 0.3; 0: off).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub random_smoothing: f64,
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

impl GuardConfig {
    /// β of the auxiliary skip at global step `step` (1-based) of `total`: linear from
    /// `aux_skip` at the first step to 0 after the last.
    pub fn aux_skip_at(&self, step: usize, total: usize) -> f32 {
        if self.aux_skip == 0.0 || total == 0 {
            return 0.0;
        }
        let done = (step.saturating_sub(1) as f64 / total as f64).clamp(0.0, 1.0);
        (self.aux_skip * (1.0 - done)) as f32
    }

    /// β-DARTS' λ at epoch `epoch` (0-based) of `epochs`: linear from 0.
    pub fn beta_decay_at(&self, epoch: usize, epochs: usize) -> f64 {
        if epochs == 0 { 0.0 } else { self.beta_decay * epoch as f64 / epochs as f64 }
    }

    /// SDARTS-RS' ε at epoch `epoch` (0-based) of `epochs`: linear from 0.03 (or the maximum,
    /// if smaller) to `random_smoothing`; 0 when off.
    pub fn smoothing_at(&self, epoch: usize, epochs: usize) -> f64 {
        if self.random_smoothing == 0.0 || epochs == 0 {
            return 0.0;
        }
        let start = self.random_smoothing.min(0.03);
        start + (self.random_smoothing - start) * epoch as f64 / epochs as f64
    }
}
