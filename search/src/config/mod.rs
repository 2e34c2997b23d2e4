//! The search experiment config: TOML with unknown keys rejected, `key=value` overrides, and
//! validation that names the key at fault.

use std::path::{Path, PathBuf};

use qdarts_data::DatasetKind;
pub use qdarts_engine::config::Experiment;
use qdarts_engine::config::{CommonKeys, Ranges};
use qdarts_engine::{ConfigError, NanGuardConfig, RecordConfig};
use qdarts_genotypes::Primitive;
use qdarts_ops::qconfig::QuantConfig;
use serde::{Deserialize, Serialize};

pub use crate::selection::config::{
    PerturbationConfig, Selection, SelectionCriterion, SelectionOrder,
};

mod cost;
mod guards;

pub use cost::{BitsConfig, CostCharge, CostConfig, CostMetric, PenaltyKind};
pub use guards::GuardConfig;

/// Where the data comes from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataConfig {
    /// `fashion-mnist` (embedded when `path` is absent), `mnist`, `cifar10`.
    pub dataset: DatasetKind,
    /// Folder of the dataset files.
    #[serde(default)]
    pub path: Option<PathBuf>,
    /// Use only the first `limit` training images (0: all).
    #[serde(default)]
    pub limit: usize,
    /// Fraction of the training set that trains the weights; the rest trains α.
    #[serde(default = "DataConfig::default_train_portion")]
    pub train_portion: f64,
}

impl DataConfig {
    fn default_train_portion() -> f64 {
        0.5
    }
}

/// The supernet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Channels of the first cell.
    pub init_channels: usize,
    /// Cells.
    pub layers: usize,
    /// Intermediate nodes per cell.
    #[serde(default = "ModelConfig::default_nodes")]
    pub nodes: usize,
    /// Stem channels = `stem_multiplier · init_channels`.
    #[serde(default = "ModelConfig::default_stem_multiplier")]
    pub stem_multiplier: usize,
    /// Candidate ops (default: the eight of DARTS).
    #[serde(default = "ModelConfig::default_primitives")]
    pub primitives: Vec<Primitive>,
    /// PC-DARTS partial channels `K`: each mixed op runs its candidates on `C/K` channels and
    /// passes the rest through (1: plain DARTS; PC-DARTS uses 4).
    #[serde(default = "ModelConfig::default_partial_channels")]
    pub partial_channels: usize,
    /// Run each cell in waves (the batched cell, docs/design/waves.md): each candidate kind one
    /// chain of kernels over a wave's stacked edges. Float searches without partial channels,
    /// edge normalization, DARTS-' β, a bit-width search or perturbation selection.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub batched_cells: bool,
}

impl ModelConfig {
    fn default_nodes() -> usize {
        4
    }
    fn default_stem_multiplier() -> usize {
        3
    }
    fn default_primitives() -> Vec<Primitive> {
        Primitive::DARTS.to_vec()
    }
    fn default_partial_channels() -> usize {
        1
    }
}

/// First-order (α from the validation loss at the current weights) or second-order (unrolled
/// one virtual SGD step) architecture gradient.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Order {
    /// DARTS first order.
    First,
    /// DARTS second order.
    Second,
}

/// The optimisation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SearchConfig {
    /// Epochs.
    pub epochs: usize,
    /// Batch size (train and validation).
    pub batch_size: usize,
    /// Cap on steps per epoch (0: the whole split).
    #[serde(default)]
    pub steps_per_epoch: usize,
    /// Architecture gradient.
    #[serde(default = "SearchConfig::default_order")]
    pub order: Order,
    /// Weight SGD: initial learning rate (cosine annealed per epoch).
    #[serde(default = "SearchConfig::default_w_lr")]
    pub w_lr: f64,
    /// Weight SGD: final learning rate.
    #[serde(default = "SearchConfig::default_w_lr_min")]
    pub w_lr_min: f64,
    /// Weight SGD momentum.
    #[serde(default = "SearchConfig::default_w_momentum")]
    pub w_momentum: f64,
    /// Weight decay of the weights.
    #[serde(default = "SearchConfig::default_w_weight_decay")]
    pub w_weight_decay: f64,
    /// Global gradient-norm clip of the weights.
    #[serde(default = "SearchConfig::default_w_grad_clip")]
    pub w_grad_clip: f64,
    /// Adam learning rate of α.
    #[serde(default = "SearchConfig::default_alpha_lr")]
    pub alpha_lr: f64,
    /// Adam betas of α.
    #[serde(default = "SearchConfig::default_alpha_betas")]
    pub alpha_betas: [f64; 2],
    /// Weight decay of α.
    #[serde(default = "SearchConfig::default_alpha_weight_decay")]
    pub alpha_weight_decay: f64,
    /// Guards against DARTS' collapse to parameter-free cells (all off by default).
    #[serde(default)]
    pub guards: GuardConfig,
    /// A bit-width search over each op's weight and activation widths (off when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bits: Option<BitsConfig>,
    /// A hardware cost added to the architecture loss (none when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<CostConfig>,
    /// How the genotype is read off the trained supernet: α's magnitudes (DARTS) or
    /// perturbation (DARTS-PT).
    #[serde(default, skip_serializing_if = "Selection::is_magnitude")]
    pub selection: Selection,
    /// `[search.perturbation]`: the settings of `selection = "perturbation"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub perturbation: Option<PerturbationConfig>,
}

impl SearchConfig {
    /// `epochs` of `batch_size`, with every other setting at its default (DARTS').
    pub fn with_defaults(epochs: usize, batch_size: usize) -> Self {
        SearchConfig {
            epochs,
            batch_size,
            steps_per_epoch: 0,
            order: Self::default_order(),
            w_lr: Self::default_w_lr(),
            w_lr_min: Self::default_w_lr_min(),
            w_momentum: Self::default_w_momentum(),
            w_weight_decay: Self::default_w_weight_decay(),
            w_grad_clip: Self::default_w_grad_clip(),
            alpha_lr: Self::default_alpha_lr(),
            alpha_betas: Self::default_alpha_betas(),
            alpha_weight_decay: Self::default_alpha_weight_decay(),
            guards: GuardConfig::default(),
            bits: None,
            cost: None,
            selection: Selection::Magnitude,
            perturbation: None,
        }
    }

    /// `[search.perturbation]` as given, or its defaults when absent.
    pub fn perturbation_or_default(&self) -> PerturbationConfig {
        self.perturbation.clone().unwrap_or_default()
    }

    fn default_order() -> Order {
        Order::First
    }
    fn default_w_lr() -> f64 {
        0.025
    }
    fn default_w_lr_min() -> f64 {
        0.001
    }
    fn default_w_momentum() -> f64 {
        0.9
    }
    fn default_w_weight_decay() -> f64 {
        3e-4
    }
    fn default_w_grad_clip() -> f64 {
        5.0
    }
    fn default_alpha_lr() -> f64 {
        3e-4
    }
    fn default_alpha_betas() -> [f64; 2] {
        [0.5, 0.999]
    }
    fn default_alpha_weight_decay() -> f64 {
        1e-3
    }
}

/// A whole experiment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExperimentConfig {
    /// Run name (the run folder is `<results_dir>/<name>-<UTC time>`).
    pub name: String,
    /// Seed of weights, α and data order.
    #[serde(default)]
    pub seed: u64,
    /// Data.
    pub data: DataConfig,
    /// Supernet.
    pub model: ModelConfig,
    /// Optimisation.
    pub search: SearchConfig,
    /// Quantization.
    #[serde(default)]
    pub quant: QuantConfig,
    /// Run record.
    #[serde(default)]
    pub record: RecordConfig,
    /// Non-finite guard.
    #[serde(default)]
    pub nan_guard: NanGuardConfig,
}

impl Experiment for ExperimentConfig {
    fn common(&self) -> CommonKeys<'_> {
        CommonKeys {
            name: &self.name,
            init_channels: self.model.init_channels,
            record: &self.record,
            nan_guard: &self.nan_guard,
            quant: &self.quant,
        }
    }

    fn validate_own(&self, path: &Path, r: &Ranges<'_>) -> Result<(), ConfigError> {
        let bad = |key: &str, message: &str| Err(ConfigError::invalid(path, key, message));
        let (m, s, d) = (&self.model, &self.search, &self.data);
        r.count("model.layers", m.layers, 3, 64)?;
        if m.partial_channels == 0 || !m.init_channels.is_multiple_of(m.partial_channels) {
            return bad(
                "model.partial_channels",
                "must be at least 1 and divide model.init_channels (PC-DARTS uses 4)",
            );
        }
        r.count("model.nodes", m.nodes, 1, 16)?;
        if m.batched_cells {
            let conflict = [
                (
                    self.quant.preset != qdarts_ops::qconfig::Preset::Float,
                    "quant.preset (not float)",
                ),
                (m.partial_channels > 1, "model.partial_channels > 1"),
                (s.guards.edge_normalization, "search.guards.edge_normalization"),
                (s.guards.aux_skip > 0.0, "search.guards.aux_skip > 0"),
                (s.bits.is_some(), "[search.bits]"),
                (s.selection == Selection::Perturbation, "search.selection = \"perturbation\""),
            ];
            if let Some((_, what)) = conflict.iter().find(|(on, _)| *on) {
                let message = format!(
                    "runs float cells without partial channels, edge normalization, β, a \
                     bit-width search or perturbation selection; this config has {what}: \
                     set model.batched_cells = false (or leave it out) to run it edge by edge"
                );
                return bad("model.batched_cells", &message);
            }
        }
        r.count("model.stem_multiplier", m.stem_multiplier, 1, 16)?;
        if m.primitives.is_empty() || m.primitives.iter().all(|p| *p == Primitive::None) {
            return bad("model.primitives", "needs an op other than none");
        }
        let mut seen = m.primitives.clone();
        seen.sort();
        seen.dedup();
        if seen.len() != m.primitives.len() {
            return bad("model.primitives", "lists an op twice");
        }
        r.count("search.epochs", s.epochs, 1, 1_000_000)?;
        r.count("search.batch_size", s.batch_size, 1, 1 << 16)?;
        if !(d.train_portion > 0.0 && d.train_portion < 1.0) {
            return bad("data.train_portion", "must lie in (0, 1)");
        }
        r.positive("search.w_lr", s.w_lr)?;
        r.within("search.w_lr_min", s.w_lr_min, 0.0, s.w_lr)?;
        r.fraction("search.w_momentum", s.w_momentum)?;
        r.within("search.w_weight_decay", s.w_weight_decay, 0.0, 1.0)?;
        r.positive("search.w_grad_clip", s.w_grad_clip)?;
        r.positive("search.alpha_lr", s.alpha_lr)?;
        r.fraction("search.alpha_betas[0]", s.alpha_betas[0])?;
        r.fraction("search.alpha_betas[1]", s.alpha_betas[1])?;
        r.within("search.alpha_weight_decay", s.alpha_weight_decay, 0.0, 1.0)?;
        r.within("search.guards.aux_skip", s.guards.aux_skip, 0.0, 10.0)?;
        r.within("search.guards.beta_decay", s.guards.beta_decay, 0.0, 1e4)?;
        r.within("search.guards.random_smoothing", s.guards.random_smoothing, 0.0, 1.0)?;
        if let Some(max) = s.guards.max_skip {
            // Two edges per node are kept.
            r.count("search.guards.max_skip", max, 0, 2 * m.nodes)?;
            let others =
                m.primitives.iter().any(|p| !matches!(p, Primitive::None | Primitive::SkipConnect));
            if !others {
                return bad(
                    "search.guards.max_skip",
                    "needs an op other than none and skip_connect in model.primitives",
                );
            }
        }
        if let Some(max) = s.guards.max_param_free {
            r.count("search.guards.max_param_free", max, 0, 2 * m.nodes)?;
            if !m.primitives.iter().any(|p| p.has_weights()) {
                return bad(
                    "search.guards.max_param_free",
                    "needs an op with weights (a convolution) in model.primitives",
                );
            }
        }
        if s.perturbation.is_some() && s.selection != Selection::Perturbation {
            return bad(
                "search.perturbation",
                "is read only with search.selection = \"perturbation\"",
            );
        }
        if s.selection == Selection::Perturbation {
            let p = s.perturbation_or_default();
            r.count("search.perturbation.tune_epochs", p.tune_epochs, 0, 1000)?;
            for (key, set) in [
                ("search.guards.max_skip", s.guards.max_skip),
                ("search.guards.max_param_free", s.guards.max_param_free),
            ] {
                if set.is_some() {
                    let message = format!(
                        "limits the magnitude derivation; search.selection = \"perturbation\" \
                         decides every edge by measurement: remove it from the config, or with \
                         `--set {key}=` (an empty value removes a key)"
                    );
                    return bad(key, &message);
                }
            }
            if s.guards.edge_normalization {
                return bad(
                    "search.guards.edge_normalization",
                    "is not supported with search.selection = \"perturbation\"",
                );
            }
        }
        if let Some(b) = &s.bits {
            for (key, set) in [("search.bits.weight", &b.weight), ("search.bits.act", &b.act)] {
                let mut seen = set.clone();
                seen.sort_unstable();
                seen.dedup();
                if set.is_empty() || seen.len() != set.len() {
                    return bad(key, "give one or more widths, each once");
                }
                if let Some(w) = set.iter().find(|w| !(2..=8).contains(*w)) {
                    return bad(key, &format!("{w} bits: widths lie in 2..8"));
                }
            }
            if self.quant.preset == qdarts_ops::qconfig::Preset::Float {
                return bad("search.bits", "needs quantization: quant.preset is float");
            }
        }
        if let Some(c) = &s.cost {
            r.within("search.cost.weight", c.weight, 0.0, 1e6)?;
            if m.partial_channels > 1 {
                return bad(
                    "search.cost",
                    "is counted on the supernet's ops, which see C/K channels with \
                     model.partial_channels > 1: not supported",
                );
            }
            if c.charge == CostCharge::Bits && s.bits.is_none() {
                return bad(
                    "search.cost.charge",
                    "\"bits\" (the default) needs [search.bits]; without a bit-width search use \
                     charge = \"ops_and_bits\"",
                );
            }
            match (c.penalty, c.target) {
                (PenaltyKind::Hinge, None) => {
                    return bad("search.cost.target", "the hinge penalty needs a target");
                }
                (PenaltyKind::Hinge, Some(t)) if !(t.is_finite() && t > 0.0) => {
                    return bad("search.cost.target", "must be a positive number");
                }
                (PenaltyKind::Log, Some(_)) => {
                    return bad("search.cost.target", "the log penalty has no target");
                }
                _ => {}
            }
        }
        Ok(())
    }
}
