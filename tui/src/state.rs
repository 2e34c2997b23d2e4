//! `DashboardState`: plain data built from run-record rows, and what the panels derive from it
//! (rates, ETA, entropies, the worst quantizer). No I/O and no rendering here.

use std::collections::HashMap;
use std::path::PathBuf;

use qdarts_record::{
    AlphaRow, BitRow, BitSite, CostRow, GenotypeRow, MetricsRow, NanAction, NanEventRow, Phase,
    QuantError, QuantErrorRow, RunLayout, SelectionRow, parse_line,
};
pub use qdarts_record::{CellType, Verdict};

/// Which table of the run record a row comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// `metrics.csv`.
    Metrics,
    /// `nan_events.csv`.
    Nan,
    /// `quant_error.csv`.
    Quant,
    /// `alphas.csv`.
    Alphas,
    /// `genotypes.csv`.
    Genotypes,
    /// `bits.csv` (bit-width searches).
    Bits,
    /// `cost.csv` (bit-width or cost-aware searches).
    Cost,
    /// `selection.csv` (perturbation-based selection).
    Selection,
}

impl Source {
    /// Every table the dashboard follows.
    pub const ALL: [Source; 8] = [
        Source::Metrics,
        Source::Nan,
        Source::Quant,
        Source::Alphas,
        Source::Genotypes,
        Source::Bits,
        Source::Cost,
        Source::Selection,
    ];

    /// The table's file in `run`.
    pub fn path(self, run: &RunLayout) -> PathBuf {
        match self {
            Source::Metrics => run.table::<MetricsRow>(),
            Source::Nan => run.table::<NanEventRow>(),
            Source::Quant => run.table::<QuantErrorRow>(),
            Source::Alphas => run.table::<AlphaRow>(),
            Source::Genotypes => run.table::<GenotypeRow>(),
            Source::Bits => run.table::<BitRow>(),
            Source::Cost => run.table::<CostRow>(),
            Source::Selection => run.table::<SelectionRow>(),
        }
    }
}

/// The softmax over one op's candidate widths at the latest epoch: `(width, weight)` pairs.
pub type WidthWeights = Vec<(u32, f64)>;

/// The latest epoch's width weights per (cell type, edge, op, site).
pub type BitTable = HashMap<(CellType, usize, String, BitSite), WidthWeights>;

/// A training step (`phase = train`).
#[derive(Debug, Clone, PartialEq)]
pub struct TrainPoint {
    /// Epoch (0-based).
    pub epoch: usize,
    /// Global step (1-based).
    pub step: usize,
    /// Training loss.
    pub loss: f64,
    /// Running top-1 of the epoch.
    pub top1: f64,
    /// Weight learning rate.
    pub lr: f64,
    /// Architecture learning rate.
    pub arch_lr: f64,
    /// Seconds since the (re)start of the search process.
    pub seconds: f64,
}

/// A validation pass at the end of an epoch.
#[derive(Debug, Clone, PartialEq)]
pub struct ValPoint {
    /// Epoch.
    pub epoch: usize,
    /// Global step at the end of the epoch.
    pub step: usize,
    /// Validation loss.
    pub loss: f64,
    /// Validation top-1.
    pub top1: f64,
}

/// One quantizer: its latest statistics and its SQNR over the recorded steps.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantLayer {
    /// Its latest statistics.
    pub error: QuantError,
    /// Global step of these statistics.
    pub step: usize,
    /// (step, SQNR dB) of every recorded step.
    pub history: Vec<(u32, f32)>,
}

/// The softmax weights of α at the end of one epoch: `[edge][op]` per cell type.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AlphaEpoch {
    /// Epoch.
    pub epoch: usize,
    /// Normal cell.
    pub normal: Vec<Vec<f64>>,
    /// Reduction cell.
    pub reduce: Vec<Vec<f64>>,
}

impl AlphaEpoch {
    /// The weights of one cell type.
    pub fn cell(&self, c: CellType) -> &[Vec<f64>] {
        match c {
            CellType::Normal => &self.normal,
            CellType::Reduce => &self.reduce,
        }
    }

    /// Mean entropy of an edge's op weights, divided by ln(ops) (1: uniform, 0: one op).
    pub fn entropy(&self, c: CellType) -> Option<f64> {
        let edges = self.cell(c);
        let n = edges.first()?.len();
        if n < 2 {
            return None;
        }
        let h: f64 = edges
            .iter()
            .map(|w| w.iter().filter(|&&p| p > 0.0).map(|&p| -p * p.ln()).sum::<f64>())
            .sum();
        Some(h / edges.len() as f64 / (n as f64).ln())
    }
}

/// How the search is planned (from the run's `config.toml` and `plan.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Epochs.
    pub epochs: usize,
    /// Steps per epoch.
    pub steps_per_epoch: usize,
}

/// Whether a process is writing the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunStatus {
    /// A live process holds the run's lock.
    Running(u32),
    /// `genotype.txt` is written: the search ran all its epochs.
    Finished,
    /// Neither: stopped or killed; `qdarts search --resume` continues it.
    Stopped,
}

/// Everything the dashboard shows, built from the run record's rows.
#[derive(Debug, Clone)]
pub struct DashboardState {
    /// The run folder's name.
    pub run_name: String,
    /// Epochs and steps, when known.
    pub plan: Option<Plan>,
    /// Live, finished or stopped.
    pub status: RunStatus,
    /// Training steps.
    pub train: Vec<TrainPoint>,
    /// Validation passes.
    pub val: Vec<ValPoint>,
    /// Non-finite events.
    pub nan: Vec<NanEventRow>,
    /// Quantizers, in the order first seen.
    pub quant: Vec<QuantLayer>,
    quant_index: HashMap<String, usize>,
    /// The latest step with quantization statistics.
    pub quant_step: usize,
    /// Op names of α's columns, in the order first seen.
    pub ops: Vec<String>,
    /// α per epoch, in epoch order.
    pub alphas: Vec<AlphaEpoch>,
    /// The derived genotype per epoch (DARTS text).
    pub genotypes: Vec<(usize, String)>,
    /// `genotype.txt` of a finished run.
    pub final_genotype: Option<String>,
    /// The latest epoch of `bits.csv` and its rows: per (cell type, edge, op, site), the
    /// weights of the candidate widths.
    pub bits: Option<(usize, BitTable)>,
    /// `cost.csv`: the expected cost per epoch.
    pub cost: Vec<CostRow>,
    /// `selection.csv`: the selection's verdicts so far (kept ops, removed inputs).
    pub selection: Vec<SelectionRow>,
    /// Rows that did not parse (skipped).
    pub skipped_rows: usize,
}

impl DashboardState {
    /// An empty state for the run folder `run_name`.
    pub fn new(run_name: impl Into<String>) -> Self {
        DashboardState {
            run_name: run_name.into(),
            plan: None,
            status: RunStatus::Stopped,
            train: Vec::new(),
            val: Vec::new(),
            nan: Vec::new(),
            quant: Vec::new(),
            quant_index: HashMap::new(),
            quant_step: 0,
            ops: Vec::new(),
            alphas: Vec::new(),
            genotypes: Vec::new(),
            final_genotype: None,
            bits: None,
            cost: Vec::new(),
            selection: Vec::new(),
            skipped_rows: 0,
        }
    }

    /// Applies one line of `source` read under `header`; a row that does not parse is
    /// counted and skipped.
    pub fn apply(&mut self, source: Source, header: &csv::StringRecord, line: &str) {
        let ok = match source {
            Source::Metrics => parse_line(header, line).and_then(|r| self.apply_metrics(r)),
            Source::Nan => parse_line(header, line).map(|r| self.nan.push(r)),
            Source::Quant => parse_line(header, line).map(|r| self.apply_quant(r)),
            Source::Alphas => parse_line(header, line).and_then(|r| self.apply_alpha(r)),
            Source::Genotypes => parse_line(header, line).map(|r| self.apply_genotype(r)),
            Source::Bits => parse_line(header, line).map(|r| self.apply_bits(r)),
            Source::Cost => parse_line(header, line).map(|r: CostRow| {
                self.cost.retain(|c: &CostRow| c.epoch != r.epoch);
                self.cost.push(r)
            }),
            Source::Selection => parse_line(header, line).map(|r: SelectionRow| {
                if r.verdict != Verdict::None {
                    self.selection.push(r);
                }
            }),
        };
        if ok.is_none() {
            self.skipped_rows += 1;
        }
    }

    /// A row whose accuracy is not a fraction, or whose learning rate is not a non-negative
    /// number, is not one the run wrote: it is refused (and counted) rather than plotted.
    fn apply_metrics(&mut self, r: MetricsRow) -> Option<()> {
        let (epoch, step, loss, top1) = (r.epoch, r.step, r.loss, r.top1);
        let rate = |x: f64| x.is_finite() && x >= 0.0;
        if !(0.0..=1.0).contains(&top1) || !rate(r.lr) || !rate(r.arch_lr) {
            return None;
        }
        match r.phase {
            Phase::Train => self.train.push(TrainPoint {
                epoch,
                step,
                loss,
                top1,
                lr: r.lr,
                arch_lr: r.arch_lr,
                seconds: r.seconds,
            }),
            Phase::Val => self.val.push(ValPoint { epoch, step, loss, top1 }),
        }
        Some(())
    }

    fn apply_quant(&mut self, r: QuantErrorRow) {
        let point = (u32::try_from(r.step).unwrap_or(u32::MAX), r.error.sqnr_db as f32);
        let step = r.step;
        let row = QuantLayer { error: r.error, step, history: Vec::new() };
        match self.quant_index.get(&row.error.layer) {
            Some(&i) => {
                let old = std::mem::take(&mut self.quant[i].history);
                self.quant[i] = QuantLayer { history: old, ..row };
                self.quant[i].history.push(point);
            }
            None => {
                self.quant_index.insert(row.error.layer.clone(), self.quant.len());
                self.quant.push(QuantLayer { history: vec![point], ..row });
            }
        }
        self.quant_step = self.quant_step.max(step);
    }

    fn apply_alpha(&mut self, r: AlphaRow) -> Option<()> {
        let (epoch, edge) = (r.epoch, r.edge);
        // A corrupt edge index must not make the dashboard allocate without bound.
        if edge > 4096 {
            return None;
        }
        let k = match self.ops.iter().position(|o| *o == r.op) {
            Some(k) => k,
            None => {
                self.ops.push(r.op);
                self.ops.len() - 1
            }
        };
        if self.alphas.last().is_none_or(|a| a.epoch != epoch) {
            self.alphas.push(AlphaEpoch { epoch, ..AlphaEpoch::default() });
        }
        let a = self.alphas.last_mut()?;
        let edges = match r.cell_type {
            CellType::Normal => &mut a.normal,
            CellType::Reduce => &mut a.reduce,
        };
        if edges.len() <= edge {
            edges.resize(edge + 1, Vec::new());
        }
        if edges[edge].len() <= k {
            edges[edge].resize(k + 1, f64::NAN);
        }
        edges[edge][k] = r.weight;
        Some(())
    }

    fn apply_bits(&mut self, r: BitRow) {
        if self.bits.as_ref().is_none_or(|(e, _)| *e != r.epoch) {
            self.bits = Some((r.epoch, HashMap::new()));
        }
        if let Some((_, map)) = self.bits.as_mut() {
            let widths = map.entry((r.cell_type, r.edge, r.op, r.site)).or_default();
            widths.retain(|(b, _)| *b != r.bits);
            widths.push((r.bits, r.weight));
        }
    }

    /// The most likely widths `(weight, act)` of op `op` on edge `edge` of a cell type, at
    /// the latest epoch of a bit-width search (`None` for ops without widths).
    pub fn op_widths(&self, cell: CellType, edge: usize, op: &str) -> Option<(u32, u32)> {
        let (_, map) = self.bits.as_ref()?;
        let best = |site| {
            let w = map.get(&(cell, edge, op.to_string(), site))?;
            w.iter().max_by(|a, b| a.1.total_cmp(&b.1)).map(|(b, _)| *b)
        };
        Some((best(BitSite::Weight)?, best(BitSite::Act)?))
    }

    fn apply_genotype(&mut self, r: GenotypeRow) {
        self.genotypes.retain(|(e, _)| *e != r.epoch);
        self.genotypes.push((r.epoch, r.genotype));
    }

    /// The last training step.
    pub fn last(&self) -> Option<&TrainPoint> {
        self.train.last()
    }

    /// Steps per second over the last (up to) 20 steps of the current process (the time column
    /// restarts on resume).
    pub fn steps_per_sec(&self) -> Option<f64> {
        let tail = &self.train[self.train.len().saturating_sub(20)..];
        let start =
            tail.windows(2).rposition(|w| w[1].seconds <= w[0].seconds).map_or(0, |i| i + 1);
        let tail = &tail[start..];
        let (first, last) = (tail.first()?, tail.last()?);
        let dt = last.seconds - first.seconds;
        (tail.len() > 1 && dt > 0.0).then(|| (last.step - first.step) as f64 / dt)
    }

    /// Steps in the whole search, when planned.
    pub fn total_steps(&self) -> Option<usize> {
        self.plan.map(|p| p.epochs * p.steps_per_epoch)
    }

    /// Seconds left at the current rate (validation passes not counted).
    pub fn eta_seconds(&self) -> Option<f64> {
        if self.status == RunStatus::Finished {
            return Some(0.0);
        }
        let done = self.last().map_or(0, |t| t.step);
        let left = self.total_steps()?.saturating_sub(done);
        Some(left as f64 / self.steps_per_sec()?)
    }

    /// Quantizers recorded at the latest recorded step.
    pub fn current_quant(&self) -> impl Iterator<Item = &QuantLayer> {
        self.quant.iter().filter(move |q| q.step == self.quant_step)
    }

    /// The quantizer with the lowest SQNR at the latest recorded step.
    pub fn worst_quant(&self) -> Option<&QuantLayer> {
        self.current_quant().min_by(|a, b| a.error.sqnr_db.total_cmp(&b.error.sqnr_db))
    }

    /// The collapse alert of the genotype shown (more than half of the normal cell's kept
    /// edges parameter-free), if it has one.
    pub fn collapse_alert(&self) -> Option<String> {
        let text = self.current_genotype()?;
        qdarts_genotypes::Genotype::from_darts_text(text).ok()?.collapse_alert()
    }

    /// The genotype to show: the final one, else the latest epoch's.
    pub fn current_genotype(&self) -> Option<&str> {
        self.final_genotype.as_deref().or_else(|| self.genotypes.last().map(|(_, g)| g.as_str()))
    }

    /// NaN events that are not bookkeeping (`lr_halved` rows follow a rollback).
    pub fn nan_count(&self) -> usize {
        self.nan.iter().filter(|e| e.action != NanAction::LrHalved).count()
    }
}
