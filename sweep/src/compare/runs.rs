//! Reading run records for a comparison: each run's config changes, seed, state, scores and
//! wall time, and the run folders a path names.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use qdarts_genotypes::Genotype;
use qdarts_record::{MetricsRow, Phase, RunLayout, read_plan, read_table};

use super::Score;
use crate::trials::SweepDir;
use crate::{SweepError, invalid, io_err};

/// What `qdarts eval` measured on a training run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EvalSummary {
    /// Integer model top-1.
    pub integer_top1: f64,
    /// Top-1 agreement of the integer and the fake-quant model.
    pub agreement: f64,
    /// Bit operations per image.
    pub bitops: u64,
    /// Bytes of integer parameters.
    pub param_bytes: u64,
}

/// One run, read from its folder.
#[derive(Debug, Clone)]
pub struct RunSummary {
    /// The folder.
    pub dir: PathBuf,
    /// `search` or `train` (from the config's sections).
    pub kind: &'static str,
    /// The config, flattened to `section.key` → TOML value text.
    pub config: BTreeMap<String, String>,
    /// Epochs with a validation row.
    pub epochs_done: usize,
    /// Epochs planned (`plan.json`).
    pub epochs_planned: Option<usize>,
    /// The last step recorded.
    pub steps: usize,
    /// Top-1 of the last validation (search: the α split; training: the test set).
    pub top1: Option<f64>,
    /// Wall-clock seconds over all of the run's processes (restarts included).
    pub seconds: f64,
    /// The final genotype, when written.
    pub genotype: Option<Genotype>,
    /// `eval.json`, when present.
    pub eval: Option<EvalSummary>,
    /// Part of the random-genotype baseline (`compare --baseline`).
    pub baseline: bool,
    /// For a training run whose genotype came from a search run folder: that search's
    /// config, flattened (what tells methods apart).
    pub source_config: Option<BTreeMap<String, String>>,
}

impl RunSummary {
    /// Whether every planned epoch has its validation row.
    pub fn finished(&self) -> bool {
        self.epochs_planned.is_some_and(|p| self.epochs_done >= p)
    }

    /// `finished`, or how far it got: `3 of 6 epochs (running or stopped)`, `no plan.json`.
    pub fn state(&self) -> String {
        match self.epochs_planned {
            _ if self.finished() => "finished".into(),
            Some(p) => format!("{} of {p} epochs (running or stopped)", self.epochs_done),
            None => format!("{} epochs, no plan.json", self.epochs_done),
        }
    }

    /// The figure `score` names, when the run has it.
    pub fn score(&self, score: Score) -> Option<f64> {
        match score {
            Score::FakeQuant => self.top1,
            Score::Integer => self.eval.map(|e| e.integer_top1),
        }
    }

    /// The seed of the search its genotype came from, when it came from a search run folder.
    pub fn search_seed(&self) -> Option<&str> {
        self.source_config.as_ref()?.get("seed").map(String::as_str)
    }

    /// Its seed, from the config.
    pub fn seed(&self) -> Option<&str> {
        self.config.get("seed").map(String::as_str)
    }

    /// The folder's last component.
    pub fn name(&self) -> String {
        self.dir
            .file_name()
            .map_or_else(|| self.dir.display().to_string(), |f| f.to_string_lossy().into())
    }
}

fn flatten(prefix: &str, table: &toml::Table, out: &mut BTreeMap<String, String>) {
    for (k, v) in table {
        let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
        match v {
            toml::Value::Table(t) => flatten(&key, t, out),
            // Strings bare (`float`, a genotype path), everything else as TOML writes it.
            toml::Value::String(s) => {
                out.insert(key, s.clone());
            }
            other => {
                out.insert(key, other.to_string());
            }
        }
    }
}

/// Wall-clock seconds of a run whose `seconds` column restarts at 0 with each process.
fn wall_seconds(rows: &[MetricsRow]) -> f64 {
    let mut total = 0.0;
    let mut last = 0.0f64;
    for r in rows {
        if r.seconds < last {
            total += last;
        }
        last = r.seconds;
    }
    total + last
}

fn read_eval(path: &Path) -> Result<Option<EvalSummary>, SweepError> {
    if !path.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(io_err(path))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| invalid(path, e.to_string()))?;
    let f = |k: &str| v.get(k).and_then(serde_json::Value::as_f64);
    let u = |k: &str| v.get(k).and_then(serde_json::Value::as_u64);
    match (f("integer_top1"), f("agreement"), u("bitops"), u("param_bytes")) {
        (Some(integer_top1), Some(agreement), Some(bitops), Some(param_bytes)) => {
            Ok(Some(EvalSummary { integer_top1, agreement, bitops, param_bytes }))
        }
        _ => Err(invalid(path, "lacks integer_top1, agreement, bitops or param_bytes")),
    }
}

/// Reads one run folder.
pub fn read_run(dir: &Path) -> Result<RunSummary, SweepError> {
    let layout = RunLayout::new(dir);
    let config_path = layout.config();
    let text = std::fs::read_to_string(&config_path).map_err(io_err(&config_path))?;
    let table: toml::Table =
        toml::from_str(&text).map_err(|e| invalid(&config_path, e.to_string()))?;
    let kind = if table.contains_key("search") {
        "search"
    } else if table.contains_key("train") {
        "train"
    } else {
        return Err(invalid(&config_path, "has neither [search] nor [train]: not a qdarts run"));
    };
    let mut config = BTreeMap::new();
    flatten("", &table, &mut config);
    let source_config = match config.get("genotype") {
        Some(g) if kind == "train" => read_source_config(Path::new(g))?,
        _ => None,
    };
    let metrics = layout.table::<MetricsRow>();
    let rows: Vec<MetricsRow> = if metrics.exists() {
        read_table(&metrics).map_err(|e| SweepError::Other(e.to_string()))?
    } else {
        Vec::new()
    };
    let vals: Vec<&MetricsRow> = rows.iter().filter(|r| r.phase == Phase::Val).collect();
    let genotype_path = layout.genotype_json();
    let genotype = if genotype_path.exists() {
        let text = std::fs::read_to_string(&genotype_path).map_err(io_err(&genotype_path))?;
        Some(Genotype::from_json(&text).map_err(|e| invalid(&genotype_path, e.to_string()))?)
    } else {
        None
    };
    Ok(RunSummary {
        dir: dir.to_path_buf(),
        kind,
        config,
        epochs_done: vals.len(),
        epochs_planned: read_plan(&layout).map(|p| p.epochs),
        steps: rows.last().map_or(0, |r| r.step),
        top1: vals.last().map(|r| r.top1),
        seconds: wall_seconds(&rows),
        genotype,
        eval: read_eval(&layout.eval_report())?,
        baseline: false,
        source_config,
    })
}

/// The flattened config of the search run a genotype source names, when it is a search run
/// folder.
fn read_source_config(source: &Path) -> Result<Option<BTreeMap<String, String>>, SweepError> {
    let path = RunLayout::new(source).config();
    if !source.is_dir() || !path.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&path).map_err(io_err(&path))?;
    let table: toml::Table = toml::from_str(&text).map_err(|e| invalid(&path, e.to_string()))?;
    if !table.contains_key("search") {
        return Ok(None);
    }
    let mut config = BTreeMap::new();
    flatten("", &table, &mut config);
    Ok(Some(config))
}

/// The run folders a path names: a run, a sweep (its trials that have started), or a folder
/// of runs (such as `results/`).
pub fn expand(path: &Path) -> Result<Vec<PathBuf>, SweepError> {
    if !path.is_dir() {
        return Err(invalid(path, "is not a folder (give run or sweep folders)"));
    }
    if let Ok(sweep) = SweepDir::open(path) {
        return Ok((0..sweep.len())
            .map(|n| sweep.trial_dir(n))
            .filter(|d| RunLayout::new(d).config().exists())
            .collect());
    }
    if RunLayout::new(path).looks_like_run() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut runs: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(io_err(path))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| RunLayout::new(p).config().exists())
        .collect();
    runs.sort();
    if runs.is_empty() {
        return Err(invalid(path, "holds no run (no config.toml in it or in its folders)"));
    }
    Ok(runs)
}
