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
mod validate;

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
    /// chain of kernels over a wave's stacked edges. Not with LSQ quantizers (refused: they
    /// run edge by edge).
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
        self.validate_model(path, r)?;
        self.validate_training(path, r)?;
        self.validate_guards(path, r)?;
        self.validate_selection(path, r)?;
        self.validate_bits(path)?;
        self.validate_cost(path, r)
    }
}
