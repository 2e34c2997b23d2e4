//! Many run records side by side: what each run's config changed, its seed, how far it got,
//! its final top-1, genotype, integer-model cost when evaluated, wall time; runs that differ
//! only in their seed grouped with mean ± std; how often each edge and op was chosen across
//! the search runs of a group (genotype stability); and, against a random-genotype baseline,
//! how the searched genotypes compare.

use std::collections::{BTreeMap, BTreeSet};

use qdarts_genotypes::{Edge, Genotype, Primitive};

pub use crate::stats::Stats;

mod analysis;
mod paired;
mod report;
mod runs;
mod tables;

pub use analysis::{Analysis, MethodResult, Noise, RESAMPLE_SEED, RESAMPLES, Unit};
pub use paired::PairedResult;
pub use report::{baseline_summary, report};
pub use runs::{EvalSummary, RunSummary, expand, read_run};
pub use tables::{csv, stats_csv};

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
