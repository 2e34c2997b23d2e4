//! The search experiment config: TOML with unknown keys rejected, `key=value` overrides, and
//! validation that names the key at fault.

use std::path::{Path, PathBuf};

use qdarts_genotypes::Primitive;
use qdarts_ops::qconfig::QuantConfig;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::data::DatasetKind;

/// A config that cannot be used.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{path}: {cause}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        cause: std::io::Error,
    },
    /// The TOML does not parse or does not fit the schema.
    #[error("{path}: {message}")]
    Parse {
        /// The file (or `--set`).
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A value out of range.
    #[error("{path}: `{key}` {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
        /// What is wrong.
        message: String,
    },
}

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
    #[serde(default = "half")]
    pub train_portion: f64,
}

fn half() -> f64 {
    0.5
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
    #[serde(default = "four")]
    pub nodes: usize,
    /// Stem channels = `stem_multiplier · init_channels`.
    #[serde(default = "three")]
    pub stem_multiplier: usize,
    /// Candidate ops (default: the eight of DARTS).
    #[serde(default = "darts_primitives")]
    pub primitives: Vec<Primitive>,
    /// PC-DARTS partial channels `K`: each mixed op runs its candidates on `C/K` channels and
    /// passes the rest through (1: plain DARTS; PC-DARTS uses 4).
    #[serde(default = "one")]
    pub partial_channels: usize,
}

fn one() -> usize {
    1
}

fn four() -> usize {
    4
}
fn three() -> usize {
    3
}
fn darts_primitives() -> Vec<Primitive> {
    Primitive::DARTS.to_vec()
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
    #[serde(default = "first")]
    pub order: Order,
    /// Weight SGD: initial learning rate (cosine annealed per epoch).
    #[serde(default = "w_lr")]
    pub w_lr: f64,
    /// Weight SGD: final learning rate.
    #[serde(default = "w_lr_min")]
    pub w_lr_min: f64,
    /// Weight SGD momentum.
    #[serde(default = "w_momentum")]
    pub w_momentum: f64,
    /// Weight decay of the weights.
    #[serde(default = "w_weight_decay")]
    pub w_weight_decay: f64,
    /// Global gradient-norm clip of the weights.
    #[serde(default = "w_grad_clip")]
    pub w_grad_clip: f64,
    /// Adam learning rate of α.
    #[serde(default = "alpha_lr")]
    pub alpha_lr: f64,
    /// Adam betas of α.
    #[serde(default = "alpha_betas")]
    pub alpha_betas: [f64; 2],
    /// Weight decay of α.
    #[serde(default = "alpha_weight_decay")]
    pub alpha_weight_decay: f64,
}

fn first() -> Order {
    Order::First
}
fn w_lr() -> f64 {
    0.025
}
fn w_lr_min() -> f64 {
    0.001
}
fn w_momentum() -> f64 {
    0.9
}
fn w_weight_decay() -> f64 {
    3e-4
}
fn w_grad_clip() -> f64 {
    5.0
}
fn alpha_lr() -> f64 {
    3e-4
}
fn alpha_betas() -> [f64; 2] {
    [0.5, 0.999]
}
fn alpha_weight_decay() -> f64 {
    1e-3
}

/// What the run record keeps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordConfig {
    /// Folder that holds the run folders.
    #[serde(default = "results")]
    pub results_dir: PathBuf,
    /// Write every quantizer's error every this many steps (0: only at epoch ends).
    #[serde(default = "fifty")]
    pub quant_error_every: usize,
    /// Also checkpoint every this many global steps inside an epoch (0: only at epoch ends).
    #[serde(default = "two_hundred")]
    pub checkpoint_every: usize,
}

impl Default for RecordConfig {
    fn default() -> Self {
        RecordConfig {
            results_dir: results(),
            quant_error_every: fifty(),
            checkpoint_every: two_hundred(),
        }
    }
}

fn two_hundred() -> usize {
    200
}

fn results() -> PathBuf {
    PathBuf::from("results")
}
fn fifty() -> usize {
    50
}

/// Where an injected non-finite value goes (for tests of the guard).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NanSite {
    /// The training loss becomes NaN.
    Loss,
    /// The weight gradients become NaN.
    Grad,
}

/// What the guard does with a non-finite step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NanPolicy {
    /// Skip the step: keep the weights, undo the α step if α went bad.
    Skip,
    /// Reload the last checkpoint (the start of the epoch) and halve the learning rate.
    Rollback,
}

/// The non-finite guard. After every step the loss, the gradient norm and α are checked, and
/// the quantizer scales on steps whose statistics are recorded; a non-finite one is logged to
/// `nan_events.csv` and the policy applies: skip the step (weights kept, α step undone if α went
/// bad), or roll back to the last checkpoint and halve the learning rate. After `max_events`
/// events the search aborts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NanGuardConfig {
    /// What to do with a non-finite step.
    #[serde(default = "skip_policy")]
    pub policy: NanPolicy,
    /// Abort after this many events.
    #[serde(default = "ten")]
    pub max_events: usize,
    /// Inject a NaN at this global step (1-based).
    #[serde(default)]
    pub inject_step: Option<usize>,
    /// Where to inject it.
    #[serde(default = "loss_site")]
    pub inject_site: NanSite,
}

impl Default for NanGuardConfig {
    fn default() -> Self {
        NanGuardConfig {
            policy: skip_policy(),
            max_events: ten(),
            inject_step: None,
            inject_site: loss_site(),
        }
    }
}

fn skip_policy() -> NanPolicy {
    NanPolicy::Skip
}
fn ten() -> usize {
    10
}
fn loss_site() -> NanSite {
    NanSite::Loss
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

/// Splits `a.b.c=value` and parses the value as TOML (a bare word becomes a string).
fn apply_override(doc: &mut toml::Table, item: &str) -> Result<(), String> {
    let (key, raw) = item.split_once('=').ok_or_else(|| format!("`{item}` is not KEY=VALUE"))?;
    let key = key.trim();
    let value: toml::Value = match toml::from_str::<toml::Table>(&format!("v = {}", raw.trim())) {
        Ok(mut t) => t.remove("v").ok_or("empty value")?,
        Err(_) => toml::Value::String(raw.trim().to_string()),
    };
    let parts: Vec<&str> = key.split('.').collect();
    let (last, path) = parts.split_last().ok_or("empty key")?;
    let mut table = doc;
    for p in path {
        table = table
            .entry(p.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            .as_table_mut()
            .ok_or_else(|| format!("`{p}` in `{key}` is not a table"))?;
    }
    table.insert(last.to_string(), value);
    Ok(())
}

/// Parses TOML text and applies `key=value` overrides to it.
pub fn apply_overrides(text: &str, overrides: &[String]) -> Result<toml::Table, String> {
    let mut doc: toml::Table = toml::from_str(text).map_err(|e| e.to_string())?;
    for o in overrides {
        apply_override(&mut doc, o).map_err(|m| format!("--set {o}: {m}"))?;
    }
    Ok(doc)
}

impl ExperimentConfig {
    /// Reads a config file, applies `key=value` overrides, and validates.
    pub fn load(path: &Path, overrides: &[String]) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|cause| ConfigError::Io { path: path.into(), cause })?;
        Self::parse(&text, path, overrides)
    }

    /// Parses config text (`path` names it in errors).
    pub fn parse(text: &str, path: &Path, overrides: &[String]) -> Result<Self, ConfigError> {
        let parse_err = |message: String| ConfigError::Parse { path: path.into(), message };
        let doc = apply_overrides(text, overrides).map_err(parse_err)?;
        let cfg: ExperimentConfig =
            doc.try_into().map_err(|e: toml::de::Error| parse_err(e.to_string()))?;
        cfg.validate(path)?;
        Ok(cfg)
    }

    fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        let bad = |key: &str, message: &str| {
            Err(ConfigError::Invalid {
                path: path.into(),
                key: key.into(),
                message: message.into(),
            })
        };
        let (m, s, d) = (&self.model, &self.search, &self.data);
        if self.name.is_empty() || self.name.contains(['/', '\\']) {
            return bad("name", "must be a non-empty folder name");
        }
        if m.init_channels < 2 || m.init_channels % 2 != 0 {
            return bad("model.init_channels", "must be even and at least 2");
        }
        if m.layers < 3 {
            return bad("model.layers", "must be at least 3 (two reduction cells)");
        }
        if m.partial_channels == 0 || !m.init_channels.is_multiple_of(m.partial_channels) {
            return bad(
                "model.partial_channels",
                "must be at least 1 and divide model.init_channels (PC-DARTS uses 4)",
            );
        }
        if m.nodes == 0 || m.stem_multiplier == 0 {
            return bad("model.nodes", "and model.stem_multiplier must be at least 1");
        }
        if m.primitives.is_empty() || m.primitives.iter().all(|p| *p == Primitive::None) {
            return bad("model.primitives", "needs an op other than none");
        }
        let mut seen = m.primitives.clone();
        seen.sort();
        seen.dedup();
        if seen.len() != m.primitives.len() {
            return bad("model.primitives", "lists an op twice");
        }
        if s.epochs == 0 || s.batch_size == 0 {
            return bad("search.epochs", "and search.batch_size must be at least 1");
        }
        if !(d.train_portion > 0.0 && d.train_portion < 1.0) {
            return bad("data.train_portion", "must lie in (0, 1)");
        }
        for (k, v) in [
            ("search.w_lr", s.w_lr),
            ("search.alpha_lr", s.alpha_lr),
            ("search.w_grad_clip", s.w_grad_clip),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return bad(k, "must be a positive number");
            }
        }
        if !(s.w_lr_min >= 0.0 && s.w_lr_min <= s.w_lr) {
            return bad("search.w_lr_min", "must lie in [0, w_lr]");
        }
        self.quant.validate().map_err(|e| ConfigError::Invalid {
            path: path.into(),
            key: "quant".into(),
            message: e.to_string(),
        })
    }

    /// The resolved config as TOML.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_default()
    }
}
