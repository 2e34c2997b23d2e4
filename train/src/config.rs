//! The training experiment config (`experiments/train-*.toml`): TOML with unknown keys
//! rejected, `key=value` overrides, and validation that names the key at fault.

use std::path::{Path, PathBuf};

use qdarts_data::DatasetKind;
pub use qdarts_engine::config::Experiment;
use qdarts_engine::config::{CommonKeys, Ranges};
use qdarts_engine::{ConfigError, NanGuardConfig, RecordConfig};
use qdarts_ops::qconfig::QuantConfig;
use serde::{Deserialize, Serialize};

/// Data of a training run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainData {
    /// `fashion-mnist` (embedded when `path` is absent), `mnist`, `cifar10`.
    pub dataset: DatasetKind,
    /// Folder of the dataset files.
    #[serde(default)]
    pub path: Option<PathBuf>,
    /// Use only the first `limit` training images (0: all).
    #[serde(default)]
    pub limit: usize,
    /// Score only the first `test_limit` test images (0: all): the last epoch's evaluation,
    /// the run's figure, and `qdarts eval`.
    #[serde(default)]
    pub test_limit: usize,
    /// Score only the first `epoch_test_limit` of them at the end of the other epochs, a
    /// cheaper figure to watch (0: as many as the last epoch).
    #[serde(default = "TrainData::default_epoch_test_limit")]
    pub epoch_test_limit: usize,
}

impl TrainData {
    fn default_epoch_test_limit() -> usize {
        2000
    }
}

/// The evaluation network.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainModel {
    /// Channels of the first cell.
    pub init_channels: usize,
    /// Cells.
    pub layers: usize,
    /// Stem channels = `stem_multiplier · init_channels`.
    #[serde(default = "TrainModel::default_stem_multiplier")]
    pub stem_multiplier: usize,
    /// Auxiliary head after the second reduction cell.
    #[serde(default = "TrainModel::default_auxiliary")]
    pub auxiliary: bool,
    /// Weight of the auxiliary loss.
    #[serde(default = "TrainModel::default_auxiliary_weight")]
    pub auxiliary_weight: f64,
    /// Drop-path probability at the last epoch (rises linearly from 0).
    #[serde(default = "TrainModel::default_drop_path_prob")]
    pub drop_path_prob: f64,
}

impl TrainModel {
    fn default_stem_multiplier() -> usize {
        3
    }
    fn default_auxiliary() -> bool {
        true
    }
    fn default_auxiliary_weight() -> f64 {
        0.4
    }
    fn default_drop_path_prob() -> f64 {
        0.2
    }
}

/// The optimisation (pt.darts' augment defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainOpt {
    /// Epochs.
    pub epochs: usize,
    /// Batch size.
    pub batch_size: usize,
    /// Cap on steps per epoch (0: the whole training set).
    #[serde(default)]
    pub steps_per_epoch: usize,
    /// Initial learning rate (cosine annealed per epoch).
    #[serde(default = "TrainOpt::default_lr")]
    pub lr: f64,
    /// Final learning rate.
    #[serde(default)]
    pub lr_min: f64,
    /// SGD momentum.
    #[serde(default = "TrainOpt::default_momentum")]
    pub momentum: f64,
    /// Weight decay.
    #[serde(default = "TrainOpt::default_weight_decay")]
    pub weight_decay: f64,
    /// Global gradient-norm clip.
    #[serde(default = "TrainOpt::default_grad_clip")]
    pub grad_clip: f64,
    /// Cutout square side (0: off); applied to datasets that augment (CIFAR-10).
    #[serde(default = "TrainOpt::default_cutout_length")]
    pub cutout_length: usize,
}

impl TrainOpt {
    fn default_lr() -> f64 {
        0.025
    }
    fn default_momentum() -> f64 {
        0.9
    }
    fn default_weight_decay() -> f64 {
        3e-4
    }
    fn default_grad_clip() -> f64 {
        5.0
    }
    fn default_cutout_length() -> usize {
        16
    }
}

/// A training experiment (`experiments/train-*.toml`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    /// Run name.
    pub name: String,
    /// Seed of weights, data order, drop-path and cutout.
    #[serde(default)]
    pub seed: u64,
    /// The genotype: a JSON or DARTS-text file, a search run folder (its `genotype.json`), or
    /// a shipped name (`DARTS_V2`, ...).
    pub genotype: String,
    /// Data.
    pub data: TrainData,
    /// Network.
    pub model: TrainModel,
    /// Optimisation.
    pub train: TrainOpt,
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

impl Experiment for TrainConfig {
    fn common(&self) -> CommonKeys<'_> {
        CommonKeys {
            name: &self.name,
            init_channels: self.model.init_channels,
            record: &self.record,
            nan_guard: &self.nan_guard,
            quant: &self.quant,
        }
    }

    fn validate_own(&self, _path: &Path, r: &Ranges<'_>) -> Result<(), ConfigError> {
        let (m, t) = (&self.model, &self.train);
        r.count("model.layers", m.layers, 3, 64)?;
        r.count("model.stem_multiplier", m.stem_multiplier, 1, 16)?;
        r.fraction("model.drop_path_prob", m.drop_path_prob)?;
        r.within("model.auxiliary_weight", m.auxiliary_weight, 0.0, 100.0)?;
        r.count("train.epochs", t.epochs, 1, 1_000_000)?;
        r.count("train.batch_size", t.batch_size, 1, 1 << 16)?;
        r.positive("train.lr", t.lr)?;
        r.within("train.lr_min", t.lr_min, 0.0, t.lr)?;
        r.fraction("train.momentum", t.momentum)?;
        r.within("train.weight_decay", t.weight_decay, 0.0, 1.0)?;
        r.positive("train.grad_clip", t.grad_clip)?;
        r.count("train.cutout_length", t.cutout_length, 0, 4096)?;
        Ok(())
    }
}
