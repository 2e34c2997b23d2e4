//! The config pieces the search and training experiments share: errors that name the file and
//! key, `key=value` overrides, the run-record settings and the NaN guard.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use thiserror::Error;

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

impl ConfigError {
    /// A value of `key` in `path` that is out of range.
    pub fn invalid(path: &Path, key: &str, message: impl Into<String>) -> Self {
        ConfigError::Invalid { path: path.into(), key: key.into(), message: message.into() }
    }
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

/// Parses config text with overrides into `T` (`path` names it in errors); the caller
/// validates the values.
pub fn parse_with_overrides<T: DeserializeOwned>(
    text: &str,
    path: &Path,
    overrides: &[String],
) -> Result<T, ConfigError> {
    let parse_err = |message: String| ConfigError::Parse { path: path.into(), message };
    let doc = apply_overrides(text, overrides).map_err(parse_err)?;
    doc.try_into().map_err(|e: toml::de::Error| parse_err(e.to_string()))
}

/// Reads a config file, with overrides, into `T` (not yet validated).
pub fn read_with_overrides<T: DeserializeOwned>(
    path: &Path,
    overrides: &[String],
) -> Result<T, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|cause| ConfigError::Io { path: path.into(), cause })?;
    parse_with_overrides(&text, path, overrides)
}

/// A resolved config as TOML (the run's `config.toml`).
pub fn to_toml<T: Serialize>(cfg: &T) -> Result<String, toml::ser::Error> {
    toml::to_string(cfg)
}

/// What the run record keeps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordConfig {
    /// Folder that holds the run folders.
    #[serde(default = "RecordConfig::default_results_dir")]
    pub results_dir: PathBuf,
    /// Write every quantizer's error every this many steps (0: only at epoch ends).
    #[serde(default = "RecordConfig::default_quant_error_every")]
    pub quant_error_every: usize,
    /// Also checkpoint every this many global steps inside an epoch (0: only at epoch ends).
    #[serde(default = "RecordConfig::default_checkpoint_every")]
    pub checkpoint_every: usize,
}

impl RecordConfig {
    fn default_results_dir() -> PathBuf {
        PathBuf::from("results")
    }
    fn default_quant_error_every() -> usize {
        50
    }
    fn default_checkpoint_every() -> usize {
        200
    }
}

impl Default for RecordConfig {
    fn default() -> Self {
        RecordConfig {
            results_dir: Self::default_results_dir(),
            quant_error_every: Self::default_quant_error_every(),
            checkpoint_every: Self::default_checkpoint_every(),
        }
    }
}

/// Where an injected non-finite value goes (for tests of the guard).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InjectSite {
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
    /// Reload the last checkpoint and halve the learning rate.
    Rollback,
}

/// The non-finite guard. After every step the loss, the gradient norm and (search) α are
/// checked, and the quantizer scales on steps whose statistics are recorded; a non-finite one
/// is logged to `nan_events.csv` and the policy applies: skip the step (weights kept, α step
/// undone if α went bad), or roll back to the last checkpoint and halve the learning rate.
/// After `max_events` events the run aborts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NanGuardConfig {
    /// What to do with a non-finite step.
    #[serde(default = "NanGuardConfig::default_policy")]
    pub policy: NanPolicy,
    /// Abort after this many events.
    #[serde(default = "NanGuardConfig::default_max_events")]
    pub max_events: usize,
    /// Inject a NaN at this global step (1-based).
    #[serde(default)]
    pub inject_step: Option<usize>,
    /// Where to inject it.
    #[serde(default = "NanGuardConfig::default_inject_site")]
    pub inject_site: InjectSite,
}

impl NanGuardConfig {
    fn default_policy() -> NanPolicy {
        NanPolicy::Skip
    }
    fn default_max_events() -> usize {
        10
    }
    fn default_inject_site() -> InjectSite {
        InjectSite::Loss
    }
}

impl Default for NanGuardConfig {
    fn default() -> Self {
        NanGuardConfig {
            policy: Self::default_policy(),
            max_events: Self::default_max_events(),
            inject_step: None,
            inject_site: Self::default_inject_site(),
        }
    }
}
