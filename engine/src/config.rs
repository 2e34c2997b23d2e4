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

/// Splits `a.b.c=value` and parses the value as TOML (a bare word becomes a string). An empty
/// value (`a.b.c=`) removes the key, which then takes its default (off, for an optional key).
fn apply_override(doc: &mut toml::Table, item: &str) -> Result<(), String> {
    let (key, raw) = item.split_once('=').ok_or_else(|| format!("`{item}` is not KEY=VALUE"))?;
    let key = key.trim();
    if raw.trim().is_empty() {
        let parts: Vec<&str> = key.split('.').collect();
        let (last, path) = parts.split_last().ok_or("empty key")?;
        let mut table = Some(doc);
        for p in path {
            table = table.and_then(|t| t.get_mut(*p)).and_then(toml::Value::as_table_mut);
        }
        if let Some(t) = table {
            t.remove(*last);
        }
        return Ok(());
    }
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

/// The name an error gives to an override: `--set KEY=VALUE`.
fn override_source(item: &str) -> PathBuf {
    PathBuf::from(format!("--set {item}"))
}

/// Whether the override `item` sets `key` or a key inside it.
fn sets_key(item: &str, key: &str) -> bool {
    let k = item.split_once('=').map_or(item, |(k, _)| k).trim();
    let key = key.split_once('[').map_or(key, |(k, _)| k);
    k == key || k.starts_with(&format!("{key}.")) || key.starts_with(&format!("{k}."))
}

/// Parses config text with overrides into `T` and validates it with `validate`. An error names
/// where the bad value came from: the file, or the `--set` argument that gave it.
pub fn parse_validated<T: DeserializeOwned>(
    text: &str,
    path: &Path,
    overrides: &[String],
    validate: impl Fn(&T, &Path) -> Result<(), ConfigError>,
) -> Result<T, ConfigError> {
    let mut doc: toml::Table = toml::from_str(text)
        .map_err(|e| ConfigError::Parse { path: path.into(), message: e.to_string() })?;
    for o in overrides {
        apply_override(&mut doc, o)
            .map_err(|message| ConfigError::Parse { path: override_source(o), message })?;
    }
    let cfg: T = match doc.try_into() {
        Ok(cfg) => cfg,
        Err(e) => {
            let e: toml::de::Error = e;
            // The first prefix of the overrides that no longer parses names the culprit.
            let mut source = path.to_path_buf();
            let mut partial: toml::Table = toml::from_str(text)
                .map_err(|e| ConfigError::Parse { path: path.into(), message: e.to_string() })?;
            if partial.clone().try_into::<T>().is_ok() {
                for o in overrides {
                    let _ = apply_override(&mut partial, o);
                    if partial.clone().try_into::<T>().is_err() {
                        source = override_source(o);
                        break;
                    }
                }
            }
            return Err(ConfigError::Parse { path: source, message: e.to_string() });
        }
    };
    validate(&cfg, path).map_err(|e| match e {
        ConfigError::Invalid { key, message, .. } => {
            let source = overrides
                .iter()
                .rev()
                .find(|o| sets_key(o, &key))
                .map_or_else(|| path.to_path_buf(), |o| override_source(o));
            ConfigError::Invalid { path: source, key, message }
        }
        other => other,
    })?;
    Ok(cfg)
}

/// Reads a config file with overrides into `T` and validates it (see [`parse_validated`]).
pub fn load_validated<T: DeserializeOwned>(
    path: &Path,
    overrides: &[String],
    validate: impl Fn(&T, &Path) -> Result<(), ConfigError>,
) -> Result<T, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|cause| ConfigError::Io { path: path.into(), cause })?;
    parse_validated(&text, path, overrides, validate)
}

/// The keys every experiment file has: the run name, the first cell's channels, the run
/// record, the NaN guard and the quantization config.
#[derive(Debug, Clone, Copy)]
pub struct CommonKeys<'a> {
    /// `name`: the run folder's prefix.
    pub name: &'a str,
    /// `model.init_channels`.
    pub init_channels: usize,
    /// `[record]`.
    pub record: &'a RecordConfig,
    /// `[nan_guard]`.
    pub nan_guard: &'a NanGuardConfig,
    /// `[quant]`.
    pub quant: &'a qdarts_ops::qconfig::QuantConfig,
}

/// An experiment file (`qdarts search`'s or `qdarts train`'s): TOML with unknown keys
/// rejected, `key=value` overrides, validation that names the key at fault (and the file or
/// the `--set` argument it came from), and the resolved config as the run's `config.toml`.
pub trait Experiment: Serialize + DeserializeOwned {
    /// The keys every experiment has.
    fn common(&self) -> CommonKeys<'_>;

    /// The checks of the experiment's own keys.
    fn validate_own(&self, path: &Path, r: &Ranges<'_>) -> Result<(), ConfigError>;

    /// Every check: the name and the first cell's channels, the experiment's own keys, then
    /// the run record, the NaN guard and the quantization config.
    fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        let r = Ranges::new(path);
        let c = self.common();
        if c.name.is_empty() || c.name.contains(['/', '\\']) {
            return Err(ConfigError::invalid(path, "name", "must be a non-empty folder name"));
        }
        if c.init_channels < 2 || !c.init_channels.is_multiple_of(2) {
            let message = "must be even and at least 2";
            return Err(ConfigError::invalid(path, "model.init_channels", message));
        }
        r.count("model.init_channels", c.init_channels, 2, 4096)?;
        self.validate_own(path, &r)?;
        c.record.validate(&r)?;
        c.nan_guard.validate(&r)?;
        c.quant.validate().map_err(|e| ConfigError::invalid(path, "quant", e.to_string()))
    }

    /// Reads a config file, applies `key=value` overrides, and validates.
    fn load(path: &Path, overrides: &[String]) -> Result<Self, ConfigError> {
        load_validated(path, overrides, Self::validate)
    }

    /// Parses config text (`path` names it in errors).
    fn parse(text: &str, path: &Path, overrides: &[String]) -> Result<Self, ConfigError> {
        parse_validated(text, path, overrides, Self::validate)
    }

    /// The resolved config as TOML (the run's `config.toml`).
    fn to_toml(&self) -> Result<String, ConfigError> {
        to_toml(self).map_err(|e| ConfigError::Parse {
            path: PathBuf::from("<resolved config>"),
            message: e.to_string(),
        })
    }
}

/// Range checks of numeric keys, naming the key at fault.
#[derive(Debug, Clone, Copy)]
pub struct Ranges<'a> {
    path: &'a Path,
}

impl<'a> Ranges<'a> {
    /// Checks for the config read from `path`.
    pub fn new(path: &'a Path) -> Self {
        Ranges { path }
    }

    fn bad(&self, key: &str, message: String) -> Result<(), ConfigError> {
        Err(ConfigError::invalid(self.path, key, message))
    }

    /// A finite number in `[lo, hi]`.
    pub fn within(&self, key: &str, v: f64, lo: f64, hi: f64) -> Result<(), ConfigError> {
        if v.is_finite() && (lo..=hi).contains(&v) {
            Ok(())
        } else {
            self.bad(key, format!("is {v}; it must be a number in [{lo}, {hi}]"))
        }
    }

    /// A finite number above 0.
    pub fn positive(&self, key: &str, v: f64) -> Result<(), ConfigError> {
        if v.is_finite() && v > 0.0 {
            Ok(())
        } else {
            self.bad(key, format!("is {v}; it must be a positive number"))
        }
    }

    /// A finite number in `[0, 1)` (a momentum, a beta, a probability).
    pub fn fraction(&self, key: &str, v: f64) -> Result<(), ConfigError> {
        if v.is_finite() && (0.0..1.0).contains(&v) {
            Ok(())
        } else {
            self.bad(key, format!("is {v}; it must be a number in [0, 1)"))
        }
    }

    /// An integer in `[lo, hi]`.
    pub fn count(&self, key: &str, v: usize, lo: usize, hi: usize) -> Result<(), ConfigError> {
        if (lo..=hi).contains(&v) {
            Ok(())
        } else {
            self.bad(key, format!("is {v}; it must be an integer from {lo} to {hi}"))
        }
    }
}

impl RecordConfig {
    /// Checks the settings' ranges.
    pub fn validate(&self, r: &Ranges<'_>) -> Result<(), ConfigError> {
        if self.results_dir.as_os_str().is_empty() {
            return r.bad("record.results_dir", "is empty".into());
        }
        Ok(())
    }
}

impl NanGuardConfig {
    /// Checks the settings' ranges: at least one event before aborting.
    pub fn validate(&self, r: &Ranges<'_>) -> Result<(), ConfigError> {
        r.count("nan_guard.max_events", self.max_events, 1, 1_000_000)
    }
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

/// Where an injected non-finite value goes (tests of the guard, [`crate::inject`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InjectSite {
    /// The training loss becomes NaN.
    Loss,
    /// The weight gradients become NaN.
    Grad,
    /// The validation (or test) loss of the epoch that holds the step becomes NaN.
    Val,
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
    /// `inject_site`, a retired key that every run record written before NaN injection left
    /// the config carries: read (so that such a run resumes and compares) and ignored.
    #[serde(default, rename = "inject_site", skip_serializing)]
    pub retired_inject_site: Option<serde::de::IgnoredAny>,
}

impl NanGuardConfig {
    fn default_policy() -> NanPolicy {
        NanPolicy::Skip
    }
    fn default_max_events() -> usize {
        10
    }
}

impl Default for NanGuardConfig {
    fn default() -> Self {
        NanGuardConfig {
            policy: Self::default_policy(),
            max_events: Self::default_max_events(),
            retired_inject_site: None,
        }
    }
}

/// What kind of run a folder holds, from its `config.toml`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunKind {
    /// A search (`[search]`).
    Search,
    /// A training run (`[train]`).
    Train,
}

impl RunKind {
    /// The kind of the run in `dir`, when its config says.
    pub fn of(dir: &Path) -> Option<RunKind> {
        let text = std::fs::read_to_string(qdarts_record::RunLayout::new(dir).config()).ok()?;
        let doc: toml::Table = toml::from_str(&text).ok()?;
        if doc.contains_key("search") {
            Some(RunKind::Search)
        } else if doc.contains_key("train") {
            Some(RunKind::Train)
        } else {
            None
        }
    }

    /// An error when the run in `dir` is not of kind `want`, saying what to do instead.
    pub fn expect(dir: &Path, want: RunKind) -> Result<(), ConfigError> {
        let hint = match (RunKind::of(dir), want) {
            (Some(RunKind::Search), RunKind::Train) => {
                "is a search run, not a training run: train its genotype with `qdarts train \
                 --genotype <run>`, then freeze, export or evaluate that training run"
            }
            (Some(RunKind::Train), RunKind::Search) => {
                "is a training run, not a search: continue it with `qdarts train --resume <run>`"
            }
            _ => return Ok(()),
        };
        Err(ConfigError::Parse { path: dir.into(), message: hint.into() })
    }
}
