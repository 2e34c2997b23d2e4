//! Methods against the random baseline, genotype by genotype: which runs count (finished
//! training runs only), which training keys may differ between the sides (genotype and seed),
//! what a method is (the search config its genotypes came from), each genotype's score (its
//! seeds' mean, or its mean adjusted for the seeds where the seeds are shared), and the tests.

use std::collections::{BTreeMap, BTreeSet};

use super::{Comparison, PairedResult, RunSummary};
use crate::stats::{Anova, Bootstrap, MannWhitney, Permutation, Stats, TwoWay, Welch, holm};

/// Keys a run's config may differ in from another's on the same side of a comparison without
/// making it another training: the genotype under test, the training seed, and bookkeeping.
fn free_key(key: &str) -> bool {
    matches!(key, "genotype" | "seed" | "name" | "data.epoch_test_limit")
        || key.starts_with("record.")
}

/// Keys of a search config that do not make another method.
fn search_free_key(key: &str) -> bool {
    matches!(key, "seed" | "name") || key.starts_with("record.")
}

/// Bootstrap resamples, permutation resamples beyond the exact enumeration, and their seed: a
/// report is the same every time it is made.
pub const RESAMPLES: usize = 20_000;
/// The seed of every resampling in a report.
pub const RESAMPLE_SEED: u64 = 0x5eed;

/// One genotype: its finished training runs and its score.
#[derive(Debug, Clone)]
pub struct Unit {
    /// Its group's label (what varies but the seed).
    pub label: String,
    /// The method (index into [`Analysis::methods`]), `None` for the baseline.
    pub method: Option<usize>,
    /// Indices into [`Comparison::runs`].
    pub runs: Vec<usize>,
    /// The mean score of its runs, or its seed-adjusted mean.
    pub score: f64,
    /// The seed of the search it came from (what pairs it with another side's genotype).
    pub search_seed: Option<String>,
}

/// One method against the baseline.
#[derive(Debug, Clone)]
pub struct MethodResult {
    /// What distinguishes it (`key=value` of its search config), or `searched`.
    pub label: String,
    /// Its genotypes' scores.
    pub scores: Vec<f64>,
    /// Runs behind them.
    pub runs: usize,
    /// Difference of means with its percentile bootstrap interval.
    pub bootstrap: Option<Bootstrap>,
    /// Welch's t-test.
    pub welch: Option<Welch>,
    /// The exact Mann–Whitney test and P(method > baseline).
    pub mann_whitney: Option<MannWhitney>,
    /// The permutation test of the difference of means.
    pub permutation: Option<Permutation>,
    /// Holm-adjusted p-values across methods: Welch, Mann–Whitney, permutation.
    pub holm: [Option<f64>; 3],
    /// With `Options::paired`: the differences paired by search seed, and their tests.
    pub paired: Option<PairedResult>,
}

/// How the genotypes' scores were made and how much the genotypes differ beyond seed noise.
#[derive(Debug, Clone)]
pub enum Noise {
    /// Seeds not shared across genotypes: scores are seed means; one-way ANOVA.
    OneWay(Anova),
    /// Seeds shared (a crossed block): scores are seed-adjusted means; two-way ANOVA.
    TwoWay(TwoWay),
}

/// The analysis of a comparison with a baseline.
#[derive(Debug, Clone)]
pub struct Analysis {
    /// Every genotype with a finished training run, baseline ones included.
    pub units: Vec<Unit>,
    /// The baseline genotypes' scores.
    pub baseline: Vec<f64>,
    /// One per method, Holm's correction across them.
    pub methods: Vec<MethodResult>,
    /// The ANOVA over genotypes, when there is a degree of freedom for it.
    pub noise: Option<Noise>,
    /// Why the methods were not told apart, when they were not.
    pub method_note: Option<String>,
}

impl Comparison {
    /// Runs that are left out of every statistic: not finished (with their state).
    pub fn unfinished(&self) -> Vec<usize> {
        (0..self.runs.len()).filter(|&i| !self.runs[i].finished()).collect()
    }

    /// Finished training runs without the score compared (no `eval.json` when the integer
    /// model is scored): left out too.
    pub fn unscored(&self) -> Vec<usize> {
        (0..self.runs.len())
            .filter(|&i| self.runs[i].finished() && self.runs[i].kind == "train")
            .filter(|&i| self.runs[i].score(self.options.score).is_none())
            .collect()
    }

    /// Finished training runs: what the analysis against a baseline counts.
    fn counted(&self) -> Vec<usize> {
        (0..self.runs.len())
            .filter(|&i| self.runs[i].finished() && self.runs[i].kind == "train")
            .filter(|&i| self.runs[i].score(self.options.score).is_some())
            .collect()
    }

    /// The training keys other than genotype and seed in which the counted runs differ, with
    /// the values seen: sides trained differently, which a comparison must not mix silently.
    pub fn training_mismatch(&self) -> Vec<(String, Vec<String>)> {
        let counted = self.counted();
        let keys: BTreeSet<&String> =
            counted.iter().flat_map(|&i| self.runs[i].config.keys()).collect();
        keys.into_iter()
            .filter(|k| !free_key(k))
            .filter_map(|k| {
                let values: BTreeSet<String> = counted
                    .iter()
                    .map(|&i| self.runs[i].config.get(k).cloned().unwrap_or_else(|| "-".into()))
                    .collect();
                (values.len() > 1).then(|| (k.clone(), values.into_iter().collect()))
            })
            .collect()
    }

    /// The methods of the counted non-baseline runs: each run's method index, the labels, and
    /// a note when the methods could not be read (every genotype source must be a search run
    /// folder; otherwise all searched runs are one method).
    fn methods(&self, counted: &[usize]) -> (BTreeMap<usize, usize>, Vec<String>, Option<String>) {
        let searched: Vec<usize> =
            counted.iter().copied().filter(|&i| !self.runs[i].baseline).collect();
        let one = || searched.iter().map(|&i| (i, 0)).collect::<BTreeMap<_, _>>();
        if searched.is_empty() {
            return (BTreeMap::new(), Vec::new(), None);
        }
        if let Some(&i) = searched.iter().find(|&&i| self.runs[i].source_config.is_none()) {
            let source = self.runs[i].config.get("genotype").map_or("-", String::as_str);
            let note = format!(
                "the genotype of {} ({source}) is not a search run folder here, so every \
                 searched genotype is taken as one method",
                self.runs[i].name()
            );
            return (one(), vec!["searched".into()], Some(note));
        }
        let configs: Vec<BTreeMap<&String, &String>> = searched
            .iter()
            .map(|&i| {
                let c = self.runs[i].source_config.as_ref().expect("checked above");
                c.iter().filter(|(k, _)| !search_free_key(k)).collect()
            })
            .collect();
        let keys: BTreeSet<&String> = configs.iter().flat_map(|c| c.keys().copied()).collect();
        let varying: Vec<&String> = keys
            .into_iter()
            .filter(|k| configs.iter().any(|c| c.get(k) != configs[0].get(k)))
            .collect();
        let mut labels: Vec<String> = Vec::new();
        let mut of = BTreeMap::new();
        for (&i, c) in searched.iter().zip(&configs) {
            let label = if varying.is_empty() {
                "searched".to_string()
            } else {
                let parts: Vec<String> = varying
                    .iter()
                    .map(|k| format!("{k}={}", c.get(*k).map_or("-", |v| v.as_str())))
                    .collect();
                parts.join(" ")
            };
            let m = labels.iter().position(|l| *l == label).unwrap_or_else(|| {
                labels.push(label);
                labels.len() - 1
            });
            of.insert(i, m);
        }
        (of, labels, None)
    }

    /// Methods against the baseline; `None` without baseline runs or searched runs among the
    /// counted ones.
    pub fn analysis(&self) -> Option<Analysis> {
        let counted = self.counted();
        let (method_of, labels, method_note) = self.methods(&counted);
        // One unit per group (genotype), its counted runs only.
        let mut units: Vec<Unit> = Vec::new();
        for g in &self.groups {
            let runs: Vec<usize> =
                g.members.iter().copied().filter(|i| counted.contains(i)).collect();
            let Some(&first) = runs.first() else { continue };
            let method = method_of.get(&first).copied();
            let top: Vec<f64> =
                runs.iter().filter_map(|&i| self.runs[i].score(self.options.score)).collect();
            let score = Stats::of(&top)?.mean;
            let search_seed = self.runs[first].search_seed().map(str::to_string);
            units.push(Unit { label: g.label.clone(), method, runs, score, search_seed });
        }
        if !units.iter().any(|u| u.method.is_none()) || !units.iter().any(|u| u.method.is_some()) {
            return None;
        }
        let noise = self.noise(&mut units);
        let baseline: Vec<f64> =
            units.iter().filter(|u| u.method.is_none()).map(|u| u.score).collect();
        let mut methods: Vec<MethodResult> = labels
            .iter()
            .enumerate()
            .map(|(m, label)| {
                let scores: Vec<f64> =
                    units.iter().filter(|u| u.method == Some(m)).map(|u| u.score).collect();
                let runs = units.iter().filter(|u| u.method == Some(m)).map(|u| u.runs.len()).sum();
                MethodResult {
                    label: label.clone(),
                    bootstrap: Bootstrap::of(&scores, &baseline, 0.95, RESAMPLES, RESAMPLE_SEED),
                    welch: Welch::of(&scores, &baseline),
                    mann_whitney: MannWhitney::of(&scores, &baseline),
                    permutation: Permutation::of(&scores, &baseline, RESAMPLES, RESAMPLE_SEED),
                    holm: [None; 3],
                    paired: self
                        .options
                        .paired
                        .then(|| PairedResult::of(&units, m, self.options.margin)),
                    scores,
                    runs,
                }
            })
            .collect();
        let columns: [fn(&MethodResult) -> Option<f64>; 3] = [
            |m| m.welch.map(|w| w.p),
            |m| m.mann_whitney.map(|w| w.p),
            |m| m.permutation.map(|w| w.p),
        ];
        for (c, column) in columns.iter().enumerate() {
            let with: Vec<usize> =
                (0..methods.len()).filter(|&m| column(&methods[m]).is_some()).collect();
            let p: Vec<f64> = with.iter().filter_map(|&m| column(&methods[m])).collect();
            for (&m, adjusted) in with.iter().zip(holm(&p)) {
                methods[m].holm[c] = Some(adjusted);
            }
        }
        PairedResult::holm_across(&mut methods);
        Some(Analysis { units, baseline, methods, noise, method_note })
    }

    /// The ANOVA over the units; with seeds shared across genotypes (a connected crossed
    /// design with two seeds or more), the two-way one, whose seed-adjusted means replace the
    /// units' scores.
    fn noise(&self, units: &mut [Unit]) -> Option<Noise> {
        let seeds: Vec<String> = units
            .iter()
            .flat_map(|u| &u.runs)
            .map(|&i| self.runs[i].seed().unwrap_or("-").to_string())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let triples: Vec<(usize, usize, f64)> = units
            .iter()
            .enumerate()
            .flat_map(|(u, unit)| unit.runs.iter().map(move |&i| (u, i)))
            .filter_map(|(u, i)| {
                let r: &RunSummary = &self.runs[i];
                let s = seeds.iter().position(|s| s == r.seed().unwrap_or("-"))?;
                Some((u, s, r.score(self.options.score)?))
            })
            .collect();
        if let Some(t) = TwoWay::of(&triples) {
            for (unit, &m) in units.iter_mut().zip(&t.adjusted_means) {
                unit.score = m;
            }
            return Some(Noise::TwoWay(t));
        }
        let groups: Vec<Vec<f64>> = units
            .iter()
            .map(|u| {
                u.runs.iter().filter_map(|&i| self.runs[i].score(self.options.score)).collect()
            })
            .collect();
        Anova::of(&groups).map(Noise::OneWay)
    }
}
