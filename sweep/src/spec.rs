//! `SWEEP.toml`: a base config, a grid over config keys and/or a list of named variants, and
//! seeds, expanded into numbered trials.
//!
//! ```toml
//! name = "alpha-lr"                    # the sweep folder: <results_dir>/alpha-lr
//! kind = "search"                      # or "train": what each trial runs
//! config = "experiments/default.toml"  # the base config (copied into the sweep folder)
//! seeds = [1, 2]                       # each combination once per seed
//!
//! [grid]                               # every combination of these values
//! "search.alpha_lr" = [1e-2, 3e-3]
//!
//! [[variant]]                          # named override sets, crossed with the grid
//! label = "first-order"
//! set = { "search.order" = "first" }
//! ```
//!
//! Trials are numbered variant by variant (in file order), then over the grid (keys in name
//! order, the last key fastest), then over the seeds (fastest).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{SweepError, invalid, io_err};

/// The most trials a sweep may have.
pub const MAX_TRIALS: usize = 10_000;

/// What each trial of a sweep runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TrialKind {
    /// `qdarts search`.
    Search,
    /// `qdarts train`.
    Train,
}

impl TrialKind {
    /// The subcommand that runs a trial.
    pub fn command(self) -> &'static str {
        match self {
            TrialKind::Search => "search",
            TrialKind::Train => "train",
        }
    }
}

fn search_kind() -> TrialKind {
    TrialKind::Search
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Variant {
    label: String,
    #[serde(default)]
    set: toml::Table,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SpecFile {
    name: String,
    #[serde(default = "search_kind")]
    kind: TrialKind,
    config: PathBuf,
    #[serde(default)]
    seeds: Vec<u64>,
    #[serde(default)]
    results_dir: Option<PathBuf>,
    #[serde(default)]
    grid: toml::Table,
    #[serde(default)]
    variant: Vec<Variant>,
}

/// One trial: a config override list applied to the base config.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Trial {
    /// Its number (0-based: Slurm's array index, Kubernetes' completion index).
    pub trial: usize,
    /// A short readable label: variant, grid values, seed.
    pub label: String,
    /// Its seed, when the sweep lists seeds.
    pub seed: Option<u64>,
    /// `key=value` overrides (TOML values), as `--set` takes them.
    pub set: Vec<String>,
}

/// A parsed sweep file, expanded.
#[derive(Debug, Clone)]
pub struct SweepSpec {
    /// The file it was read from.
    pub path: PathBuf,
    /// Sweep name (folder name).
    pub name: String,
    /// What the trials run.
    pub kind: TrialKind,
    /// The base config file.
    pub config: PathBuf,
    /// Where the sweep folder goes (default `results`).
    pub results_dir: PathBuf,
    /// The trials.
    pub trials: Vec<Trial>,
}

/// Keys a sweep sets itself: the seed comes from `seeds`, the run's name and folder from the
/// sweep.
const RESERVED: [&str; 3] = ["seed", "name", "record.results_dir"];

/// Checks a name that becomes a folder (and, lower-cased, a Kubernetes job name).
pub fn check_name(path: &Path, name: &str) -> Result<(), SweepError> {
    let ok = !name.is_empty()
        && name.len() <= 48
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        && name.chars().next().is_some_and(|c| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(invalid(
            path,
            format!(
                "`name` = {name:?}: use 1 to 48 letters, digits, `-`, `_` or `.`, starting with a \
                 letter or digit (it names the sweep folder)"
            ),
        ))
    }
}

fn check_key(path: &Path, key: &str, what: &str) -> Result<(), SweepError> {
    if RESERVED.contains(&key) {
        return Err(invalid(
            path,
            format!(
                "{what} sets `{key}`, which the sweep sets itself (seeds: use `seeds = [...]`)"
            ),
        ));
    }
    let ok = !key.is_empty()
        && key.split('.').all(|p| {
            !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        });
    if ok {
        Ok(())
    } else {
        Err(invalid(path, format!("{what}: `{key}` is not a config key such as `search.alpha_lr`")))
    }
}

/// A TOML value as it appears on the right of `--set key=value`, and short for labels.
fn value_text(v: &toml::Value) -> String {
    v.to_string()
}

fn label_value(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => {
            // A path is labelled by its file stem (a genotype file, a config).
            Path::new(s).file_stem().map_or_else(|| s.clone(), |f| f.to_string_lossy().into())
        }
        other => other.to_string(),
    }
}

/// `[grid]`: each key a config key with a non-empty list of values.
fn check_grid(
    path: &Path,
    grid: toml::Table,
) -> Result<Vec<(String, Vec<toml::Value>)>, SweepError> {
    let mut checked: Vec<(String, Vec<toml::Value>)> = Vec::new();
    for (key, values) in grid {
        check_key(path, &key, "[grid]")?;
        let values = match values {
            toml::Value::Array(a) if !a.is_empty() => a,
            toml::Value::Array(_) => {
                return Err(invalid(path, format!("[grid] `{key}` lists no values")));
            }
            _ => {
                return Err(invalid(
                    path,
                    format!("[grid] `{key}` must be a list of values, e.g. [1e-2, 3e-3]"),
                ));
            }
        };
        checked.push((key, values));
    }
    Ok(checked)
}

/// `[[variant]]`s: labelled, each label once, none setting a key the grid sweeps.
fn check_variants(
    path: &Path,
    variants: &[Variant],
    grid: &[(String, Vec<toml::Value>)],
) -> Result<(), SweepError> {
    let mut labels = Vec::new();
    for v in variants {
        if v.label.trim().is_empty() {
            return Err(invalid(path, "a [[variant]] has an empty `label`"));
        }
        if labels.contains(&v.label) {
            return Err(invalid(path, format!("two [[variant]]s are labelled `{}`", v.label)));
        }
        labels.push(v.label.clone());
        for key in v.set.keys() {
            check_key(path, key, &format!("[[variant]] `{}`", v.label))?;
            if grid.iter().any(|(g, _)| g == key) {
                return Err(invalid(
                    path,
                    format!("`{key}` is both in [grid] and in [[variant]] `{}`", v.label),
                ));
            }
        }
    }
    Ok(())
}

impl SweepSpec {
    /// Reads and expands a sweep file.
    pub fn load(path: &Path) -> Result<SweepSpec, SweepError> {
        let text = std::fs::read_to_string(path).map_err(io_err(path))?;
        Self::parse(&text, path)
    }

    /// Parses and expands sweep text (`path` names it in errors).
    pub fn parse(text: &str, path: &Path) -> Result<SweepSpec, SweepError> {
        let f: SpecFile = toml::from_str(text).map_err(|e| invalid(path, e.to_string()))?;
        check_name(path, &f.name)?;
        let grid = check_grid(path, f.grid)?;
        check_variants(path, &f.variant, &grid)?;
        let mut seen = f.seeds.clone();
        seen.sort_unstable();
        seen.dedup();
        if seen.len() != f.seeds.len() {
            return Err(invalid(path, "`seeds` lists a seed twice"));
        }
        let combos: usize = grid.iter().map(|(_, v)| v.len()).product();
        let total =
            combos.saturating_mul(f.variant.len().max(1)).saturating_mul(f.seeds.len().max(1));
        if total > MAX_TRIALS {
            return Err(invalid(
                path,
                format!("{total} trials; a sweep may have at most {MAX_TRIALS}"),
            ));
        }
        let mut trials = Vec::with_capacity(total);
        let variants: Vec<Option<&Variant>> =
            if f.variant.is_empty() { vec![None] } else { f.variant.iter().map(Some).collect() };
        let seeds: Vec<Option<u64>> = if f.seeds.is_empty() {
            vec![None]
        } else {
            f.seeds.iter().copied().map(Some).collect()
        };
        for variant in &variants {
            for combo in 0..combos {
                for &seed in &seeds {
                    let mut set = Vec::new();
                    let mut label = Vec::new();
                    if let Some(v) = variant {
                        label.push(v.label.clone());
                        set.extend(v.set.iter().map(|(k, x)| format!("{k}={}", value_text(x))));
                    }
                    // Mixed radix, last key fastest.
                    let mut rest = combo;
                    let mut picks = vec![0; grid.len()];
                    for (i, (_, values)) in grid.iter().enumerate().rev() {
                        picks[i] = rest % values.len();
                        rest /= values.len();
                    }
                    for ((key, values), &p) in grid.iter().zip(&picks) {
                        let short = key.rsplit('.').next().unwrap_or(key);
                        label.push(format!("{short}={}", label_value(&values[p])));
                        set.push(format!("{key}={}", value_text(&values[p])));
                    }
                    if let Some(s) = seed {
                        label.push(format!("seed={s}"));
                        set.push(format!("seed={s}"));
                    }
                    let label = if label.is_empty() { "base".into() } else { label.join(" ") };
                    trials.push(Trial { trial: trials.len(), label, seed, set });
                }
            }
        }
        Ok(SweepSpec {
            path: path.to_path_buf(),
            name: f.name,
            kind: f.kind,
            config: f.config,
            results_dir: f.results_dir.unwrap_or_else(|| PathBuf::from("results")),
            trials,
        })
    }
}
