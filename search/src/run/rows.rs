//! The search task's rows beyond the loop's own: the perturbation-based selection's
//! decisions (`selection.csv`), the bit widths' softmaxes (`bits.csv`) and the cost
//! (`cost.csv`).

use burn::module::Module;
use qdarts_engine::RunError;
use qdarts_genotypes::edge_input;
use qdarts_ops::candidates::has_bits;
use qdarts_record::{BitRow, BitSite, CellType, CostRow, RunDir, SelectionRow};

use super::SearchTask;
use crate::config::{PerturbationConfig, Selection};
use crate::selection::{At, Measure, Trial, decide_cell};

/// Images per forward of the selection's measurements.
const MEASURE_BATCH: usize = 160;

impl SearchTask<'_> {
    /// The selection rounds due at the end of `epoch` (DARTS-PT): round `r` follows epoch
    /// `search.epochs − 1 + r·tune_epochs`. Each round decides one edge (or, once every edge
    /// has its op, one node) of each cell type; each decision's measurements go to
    /// `selection.csv` as soon as it is made.
    pub(super) fn select(&mut self, epoch: usize, run: &RunDir) -> Result<(), RunError> {
        let s = &self.cfg.search;
        if s.selection != Selection::Perturbation || epoch + 1 < s.epochs {
            return Ok(());
        }
        let p = s.perturbation_or_default();
        let after = epoch + 1 - s.epochs;
        let mut w = run.writer::<SelectionRow>()?;
        loop {
            let Some(proj) = &self.alphas.projection else { return Ok(()) };
            let Some(kind) = proj.next_round() else { return Ok(()) };
            // Rounds already made, and the epoch after which this one is due.
            let r = proj.rounds_done();
            if p.tune_epochs > 0 && r * p.tune_epochs != after {
                return Ok(());
            }
            for reduction in [false, true] {
                let rows = self.decide(At { epoch, round: r, kind, reduction }, &p);
                rows.iter().try_for_each(|row| w.push(row))?;
            }
        }
    }

    /// One decision of one cell type: the candidates' measurements as rows.
    fn decide(&mut self, at: At, p: &PerturbationConfig) -> Vec<SelectionRow> {
        let cfg = self.cfg;
        let n = match p.eval_images {
            0 => self.val_idx.len(),
            k => k.min(self.val_idx.len()),
        };
        let eval = self.net.valid();
        let alphas = self.alphas.valid();
        let Some(mut proj) = self.alphas.projection.take() else { return Vec::new() };
        // Forward only: larger batches than the search's cost little memory and save the
        // per-op overhead of the many small ops of a supernet.
        let bs = MEASURE_BATCH.max(cfg.search.batch_size);
        let measure = |trial: &Trial| {
            let arch = alphas.arch_with(at.reduction, trial);
            let e = self.evaluate(&eval, arch, &self.val_idx[..n], bs);
            Measure { top1: e.top1, loss: e.loss }
        };
        let rows = decide_cell(&mut proj, at, p, (&cfg.model.primitives, cfg.seed), measure);
        self.alphas.projection = Some(proj);
        rows
    }

    /// `bits.csv` rows: the softmax over each op's candidate widths (ops with convolutions).
    pub(super) fn bit_rows(&self, epoch: usize) -> Result<Vec<BitRow>, RunError> {
        let (Some(b), Some(rows)) = (&self.cfg.search.bits, self.alphas.bit_rows()?) else {
            return Ok(Vec::new());
        };
        let primitives = &self.cfg.model.primitives;
        let [wn, wr, a_n, a_r] = rows;
        let mut out = Vec::new();
        let parts = [
            (CellType::Normal, BitSite::Weight, &wn, &b.weight),
            (CellType::Reduce, BitSite::Weight, &wr, &b.weight),
            (CellType::Normal, BitSite::Act, &a_n, &b.act),
            (CellType::Reduce, BitSite::Act, &a_r, &b.act),
        ];
        for (cell_type, site, rows, choices) in parts {
            for (edge, ops) in rows.iter().enumerate() {
                let stride =
                    if cell_type == CellType::Reduce && edge_input(edge) < 2 { 2 } else { 1 };
                for (k, probs) in ops.iter().enumerate() {
                    if !has_bits(primitives[k], stride) {
                        continue;
                    }
                    for (&bits, &w) in choices.iter().zip(probs) {
                        out.push(BitRow {
                            epoch,
                            cell_type,
                            edge,
                            op: primitives[k].to_string(),
                            site,
                            bits,
                            weight: f64::from(w),
                        });
                    }
                }
            }
        }
        Ok(out)
    }

    /// `cost.csv` row: the expected cost and the penalty.
    pub(super) fn cost_rows(&self, epoch: usize) -> Vec<CostRow> {
        let Some(model) = &self.cost else { return Vec::new() };
        let arch = self.alphas.valid().arch();
        let c = model.report(&arch);
        let penalty = self.cfg.search.cost.as_ref().map_or(0.0, |cc| {
            let p = model.penalty(cc.metric, &cc.penalty(), &arch);
            f64::from(p.into_scalar::<f32>())
        });
        vec![CostRow { epoch, bitops: c.bitops, weight_bytes: c.weight_bytes, penalty }]
    }
}
