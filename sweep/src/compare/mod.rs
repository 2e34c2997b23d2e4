//! Many run records side by side: what each run's config changed, its seed, how far it got,
//! its final top-1, genotype, integer-model cost when evaluated, wall time; runs that differ
//! only in their seed grouped with mean ± std; how often each edge and op was chosen across
//! the search runs of a group (genotype stability); and, against a random-genotype baseline,
//! how the searched genotypes compare.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use qdarts_genotypes::{Edge, Genotype, Primitive};
use qdarts_record::{MetricsRow, Phase, RunLayout, read_plan, read_table};

pub use crate::stats::Stats;
use crate::trials::SweepDir;

mod analysis;
mod paired;
mod report;
mod tables;

use crate::{SweepError, invalid, io_err};
pub use analysis::{Analysis, MethodResult, Noise, RESAMPLE_SEED, RESAMPLES, Unit};
pub use paired::PairedResult;
pub use report::{baseline_summary, report};
pub use tables::{csv, stats_csv};

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

/// Keys every run sets differently by construction, never a "difference".
const IGNORED: [&str; 2] = ["name", "record.results_dir"];

/// Runs that differ only in their seed.
#[derive(Debug, Clone)]
pub struct Group {
    /// The varying keys' values (seed excluded), as `key=value`.
    pub label: String,
    /// Indices into [`Comparison::runs`].
    pub members: Vec<usize>,
    /// Mean and sample standard deviation of the score over the finished members.
    pub top1: Option<Stats>,
}

/// Which figure of a training run a comparison scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Score {
    /// The last evaluation's top-1 (the fake-quant network on the test set).
    #[default]
    FakeQuant,
    /// `qdarts eval`'s integer model top-1 (`eval.json`); runs without it are not counted.
    Integer,
}

/// How a comparison is made.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Options {
    /// The figure compared.
    pub score: Score,
    /// Pair each method's genotypes with the baseline's by the seed of the search they came
    /// from (one pair per search seed), and test the paired differences.
    pub paired: bool,
    /// With `paired`: the margin (a fraction, 0.005 = 0.5 points) of the two one-sided tests of
    /// equivalence.
    pub margin: Option<f64>,
}

/// The comparison of some runs.
#[derive(Debug, Clone)]
pub struct Comparison {
    /// How it is made.
    pub options: Options,
    /// The runs, in the order given.
    pub runs: Vec<RunSummary>,
    /// Config keys whose values differ between runs (seed included when it differs).
    pub varying: Vec<String>,
    /// Runs grouped by everything that varies but the seed (baseline runs apart).
    pub groups: Vec<Group>,
}

impl Comparison {
    /// Compares runs (already read) by their final top-1, unpaired.
    pub fn new(runs: Vec<RunSummary>) -> Comparison {
        Comparison::with_options(runs, Options::default())
    }

    /// Compares runs (already read) as `options` say.
    pub fn with_options(runs: Vec<RunSummary>, options: Options) -> Comparison {
        let keys: BTreeSet<&String> = runs.iter().flat_map(|r| r.config.keys()).collect();
        let varying: Vec<String> = keys
            .into_iter()
            .filter(|k| !IGNORED.contains(&k.as_str()))
            .filter(|k| {
                let mut values = runs.iter().map(|r| r.config.get(*k));
                let first = values.next().flatten();
                values.any(|v| v != first)
            })
            .cloned()
            .collect();
        let mut groups: Vec<Group> = Vec::new();
        for (i, r) in runs.iter().enumerate() {
            let mut parts: Vec<String> = varying
                .iter()
                .filter(|k| k.as_str() != "seed")
                .map(|k| format!("{k}={}", r.config.get(k).map_or("-", String::as_str)))
                .collect();
            if r.baseline {
                parts.insert(0, "baseline".into());
            }
            let label = if parts.is_empty() { "all".into() } else { parts.join(" ") };
            match groups.iter_mut().find(|g| g.label == label) {
                Some(g) => g.members.push(i),
                None => groups.push(Group { label, members: vec![i], top1: None }),
            }
        }
        for g in &mut groups {
            let v: Vec<f64> = g
                .members
                .iter()
                .filter(|&&i| runs[i].finished())
                .filter_map(|&i| runs[i].top1)
                .collect();
            g.top1 = Stats::of(&v);
        }
        Comparison { options, runs, varying, groups }
    }

    /// The group a run belongs to.
    pub fn group_of(&self, run: usize) -> usize {
        self.groups.iter().position(|g| g.members.contains(&run)).unwrap_or(0)
    }
}

/// A short code per op for tables (legend printed with them).
pub fn op_code(p: Primitive) -> &'static str {
    match p {
        Primitive::None => "none",
        Primitive::MaxPool3x3 => "max3",
        Primitive::AvgPool3x3 => "avg3",
        Primitive::SkipConnect => "skip",
        Primitive::SepConv3x3 => "sep3",
        Primitive::SepConv5x5 => "sep5",
        Primitive::DilConv3x3 => "dil3",
        Primitive::DilConv5x5 => "dil5",
        Primitive::SepConv7x7 => "sep7",
        Primitive::Conv7x1_1x7 => "c7x1",
    }
}

/// A cell in one short line: `node: op(input) op(input); …`.
pub fn cell_short(nodes: &[Vec<Edge>]) -> String {
    nodes
        .iter()
        .map(|edges| {
            edges
                .iter()
                .map(|e| format!("{}({})", op_code(e.op), e.input))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// How often each edge (node, input, op) and each op was chosen over some genotypes.
#[derive(Debug, Clone, Default)]
pub struct Stability {
    /// Genotypes counted.
    pub runs: usize,
    /// Distinct genotypes among them.
    pub distinct: usize,
    /// Per cell (`normal`, `reduce`): (node state, input, op) → count.
    pub edges: BTreeMap<&'static str, BTreeMap<(usize, usize, Primitive), usize>>,
    /// Per cell: op → count over all kept edges.
    pub ops: BTreeMap<&'static str, BTreeMap<Primitive, usize>>,
}

impl Stability {
    /// Counts over genotypes.
    pub fn of<'a>(genotypes: impl IntoIterator<Item = &'a Genotype>) -> Stability {
        let mut s = Stability::default();
        let mut seen: Vec<&Genotype> = Vec::new();
        for g in genotypes {
            s.runs += 1;
            if !seen.contains(&g) {
                seen.push(g);
            }
            for (cell, nodes) in [("normal", &g.normal), ("reduce", &g.reduce)] {
                for (i, edges) in nodes.iter().enumerate() {
                    for e in edges {
                        *s.edges
                            .entry(cell)
                            .or_default()
                            .entry((i + 2, e.input, e.op))
                            .or_default() += 1;
                        *s.ops.entry(cell).or_default().entry(e.op).or_default() += 1;
                    }
                }
            }
        }
        s.distinct = seen.len();
        s
    }

    /// Lines for the report.
    pub fn lines(&self) -> Vec<String> {
        let mut out = vec![format!("  {} genotypes, {} distinct", self.runs, self.distinct)];
        for cell in ["normal", "reduce"] {
            let Some(edges) = self.edges.get(cell) else { continue };
            let mut by_node: BTreeMap<usize, Vec<(usize, usize, Primitive)>> = BTreeMap::new();
            for (&(node, input, op), &n) in edges {
                by_node.entry(node).or_default().push((n, input, op));
            }
            for (node, mut list) in by_node {
                list.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
                let items: Vec<String> = list
                    .iter()
                    .map(|(n, input, op)| format!("{}({input}) {n}/{}", op_code(*op), self.runs))
                    .collect();
                out.push(format!("  {cell:<6} node {node}: {}", items.join(", ")));
            }
            if let Some(ops) = self.ops.get(cell) {
                let total: usize = ops.values().sum();
                let mut list: Vec<(&Primitive, &usize)> = ops.iter().collect();
                list.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
                let items: Vec<String> = list
                    .iter()
                    .map(|(op, n)| {
                        format!("{} {:.0}%", op_code(**op), 100.0 * **n as f64 / total as f64)
                    })
                    .collect();
                out.push(format!("  {cell:<6} ops: {}", items.join(", ")));
            }
        }
        out
    }
}
