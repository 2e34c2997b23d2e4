//! Perturbation-based architecture selection (DARTS-PT: Wang et al., "Rethinking Architecture
//! Selection in Differentiable NAS", ICLR 2021).
//!
//! After the supernet is trained, each cell type's edges are decided one at a time: every op of
//! the edge is taken out of the supernet in turn (its softmax weight set to 0, the others left
//! as they are), the supernet's validation top-1 is measured, and the op whose removal costs
//! the most is kept; the edge is then fixed to that op alone (weight 1). Once every edge has
//! its op, each node's inputs are chosen the same way: while a node has more than two input
//! edges, the edge whose removal hurts least is taken off. Between rounds of decisions (one
//! edge, or one node, of each cell type per round, as DARTS-PT does) the supernet is
//! fine-tuned. The measurement runs on the fake-quantized supernet with frozen statistics, so
//! an op's quantization error is part of what its removal costs.
//!
//! The state of the decisions, [`Projection`], rides with [`crate::supernet::Alphas`]: the
//! forward sees the projected weights everywhere (search steps, fine-tuning, validation).

use qdarts_data::Rng;
use qdarts_genotypes::{Edge, Genotype, Primitive, edge_count, edge_index, edge_input};
use serde::{Deserialize, Serialize};

pub mod config;

use qdarts_record::{CellType, Decision, SelectionRow, Verdict};

use crate::config::{PerturbationConfig, SelectionCriterion, SelectionOrder};

/// The decisions of one cell type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellProjection {
    /// The op kept on each edge (pt.darts' edge order); `None`: undecided.
    pub ops: Vec<Option<usize>>,
    /// The input edges kept by each node; `None`: undecided.
    pub inputs: Vec<Option<Vec<usize>>>,
}

impl CellProjection {
    fn new(nodes: usize) -> Self {
        // The first node has exactly two inputs: nothing to decide.
        let inputs = (0..nodes).map(|n| (n == 0).then(|| vec![0, 1])).collect();
        CellProjection { ops: vec![None; edge_count(nodes)], inputs }
    }

    /// Edges whose op is still open.
    pub fn open_edges(&self) -> Vec<usize> {
        (0..self.ops.len()).filter(|e| self.ops[*e].is_none()).collect()
    }

    /// Nodes whose inputs are still open.
    pub fn open_nodes(&self) -> Vec<usize> {
        (0..self.inputs.len()).filter(|n| self.inputs[*n].is_none()).collect()
    }

    fn removed(&self, e: usize) -> bool {
        let node = node_of(e);
        self.inputs[node].as_ref().is_some_and(|kept| !kept.contains(&e))
    }

    /// `(keep, fill)`, `[edges·K]` each, so that the projected weights are
    /// `softmax(α)·keep + fill`: an undecided edge keeps its softmax (less `trial`'s removed
    /// op or edges), a decided one is one-hot on its op, a removed one is 0.
    pub fn masks(&self, k: usize, trial: &Trial) -> (Vec<f32>, Vec<f32>) {
        let (mut keep, mut fill) = (vec![0.0; self.ops.len() * k], vec![0.0; self.ops.len() * k]);
        for (e, op) in self.ops.iter().enumerate() {
            let gone = self.removed(e) || matches!(trial, Trial::Edges(es) if es.contains(&e));
            if gone {
                continue;
            }
            match op {
                Some(c) => fill[e * k + c] = 1.0,
                None => {
                    keep[e * k..(e + 1) * k].fill(1.0);
                    if let Trial::Op { edge, op } = trial
                        && *edge == e
                    {
                        keep[e * k + op] = 0.0;
                    }
                }
            }
        }
        (keep, fill)
    }

    /// The cell as α rows for the magnitude derivation (the `genotypes.csv` row of an epoch
    /// in the middle of the selection): decided edges are one-hot, removed ones uniform.
    fn rows(&self, alpha: &[Vec<f32>]) -> Vec<Vec<f32>> {
        let mut out = alpha.to_vec();
        for (e, row) in out.iter_mut().enumerate() {
            if self.removed(e) {
                row.fill(0.0);
            } else if let Some(c) = self.ops[e] {
                row.fill(-1e4);
                row[c] = 0.0;
            }
        }
        out
    }

    fn cell(&self, primitives: &[Primitive]) -> Option<Vec<Vec<Edge>>> {
        let mut cell = Vec::with_capacity(self.inputs.len());
        for kept in &self.inputs {
            let kept = kept.as_ref()?;
            let mut edges = Vec::with_capacity(kept.len());
            for &e in kept {
                edges.push(Edge { op: primitives[self.ops[e]?], input: edge_input(e) });
            }
            cell.push(edges);
        }
        Some(cell)
    }
}

/// The node (0-based) an edge enters.
pub fn node_of(e: usize) -> usize {
    let mut node = 0;
    while edge_count(node + 1) <= e {
        node += 1;
    }
    node
}

/// The input edges of a node.
pub fn node_edges(node: usize) -> Vec<usize> {
    (0..node + 2).map(|i| edge_index(node, i)).collect()
}

/// What one measurement takes out of a cell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trial {
    /// Nothing: the supernet as it stands.
    Nothing,
    /// One op of an undecided edge.
    Op {
        /// The edge.
        edge: usize,
        /// The op's index in the primitives.
        op: usize,
    },
    /// Whole edges (the input decision).
    Edges(Vec<usize>),
}

/// The decisions of both cell types.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Projection {
    /// The normal cell.
    pub normal: CellProjection,
    /// The reduction cell.
    pub reduce: CellProjection,
}

/// What a round decides in each cell type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Round {
    /// One edge's op.
    Op,
    /// One node's inputs.
    Input,
}

impl Projection {
    /// No decision yet.
    pub fn new(nodes: usize) -> Self {
        Projection { normal: CellProjection::new(nodes), reduce: CellProjection::new(nodes) }
    }

    /// Rounds of a whole selection: one per edge (each decides an edge of each cell type),
    /// then one per node with more than two inputs.
    pub fn rounds(nodes: usize) -> usize {
        edge_count(nodes) + nodes.saturating_sub(1)
    }

    /// The cell of a type.
    pub fn cell(&self, reduction: bool) -> &CellProjection {
        if reduction { &self.reduce } else { &self.normal }
    }

    /// The cell of a type, to change.
    pub fn cell_mut(&mut self, reduction: bool) -> &mut CellProjection {
        if reduction { &mut self.reduce } else { &mut self.normal }
    }

    /// What the next round decides; `None` when everything is decided.
    pub fn next_round(&self) -> Option<Round> {
        let cells = [&self.normal, &self.reduce];
        if cells.iter().any(|c| !c.open_edges().is_empty()) {
            Some(Round::Op)
        } else if cells.iter().any(|c| !c.open_nodes().is_empty()) {
            Some(Round::Input)
        } else {
            None
        }
    }

    /// Rounds made so far (both cell types decide in step: the normal cell's count).
    pub fn rounds_done(&self) -> usize {
        let c = &self.normal;
        c.ops.iter().filter(|o| o.is_some()).count()
            + c.inputs.iter().skip(1).filter(|i| i.is_some()).count()
    }

    /// α rows `(normal, reduce)` with the decisions applied, for the per-epoch genotype.
    pub fn rows(&self, an: &[Vec<f32>], ar: &[Vec<f32>]) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
        (self.normal.rows(an), self.reduce.rows(ar))
    }

    /// The genotype of a finished selection (inputs in ascending order); `None` while any
    /// edge or node is open.
    pub fn genotype(&self, primitives: &[Primitive]) -> Option<Genotype> {
        let normal = self.normal.cell(primitives)?;
        let reduce = self.reduce.cell(primitives)?;
        let concat: Vec<usize> = (2..2 + normal.len()).collect();
        Some(Genotype {
            normal,
            normal_concat: concat.clone(),
            reduce,
            reduce_concat: concat,
            normal_bits: None,
            reduce_bits: None,
        })
    }
}

/// The next item to decide among `open` (edges or nodes) in round `round` of a cell type: the
/// first in the fixed order, or a draw seeded by the run's seed, the round and the cell type,
/// so that a resumed selection draws the same.
pub fn pick(
    open: &[usize],
    order: SelectionOrder,
    seed: u64,
    round: usize,
    reduction: bool,
) -> usize {
    match order {
        SelectionOrder::Fixed => open[0],
        SelectionOrder::Random => {
            let stream = (round as u64) << 1 | u64::from(reduction);
            let mut rng = Rng::new(seed ^ 0xD1B5_4A32_D192_ED03_u64.wrapping_mul(stream + 1));
            open[rng.below(open.len())]
        }
    }
}

/// A measurement: validation top-1 and loss.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measure {
    /// Top-1.
    pub top1: f64,
    /// Loss.
    pub loss: f64,
}

impl Measure {
    /// Whether taking out `self`'s candidate hurts more than taking out `other`'s: a lower
    /// top-1 (ties: a higher loss) under the accuracy criterion, a higher loss under the loss
    /// criterion. NaN never hurts more.
    pub fn hurts_more(&self, other: &Measure, by_loss: bool) -> bool {
        let loss_worse = self.loss > other.loss;
        if by_loss {
            return loss_worse;
        }
        self.top1 < other.top1 || (self.top1 == other.top1 && loss_worse)
    }
}

/// The candidate whose removal hurts most (`most`) or least, the first on a tie;
/// `measures[i]` belongs to `candidates[i]`.
fn extreme(candidates: &[usize], measures: &[Measure], by_loss: bool, most: bool) -> usize {
    let mut best = 0;
    for i in 1..candidates.len() {
        let (a, b) =
            if most { (&measures[i], &measures[best]) } else { (&measures[best], &measures[i]) };
        if a.hurts_more(b, by_loss) {
            best = i;
        }
    }
    candidates[best]
}

/// The op to keep on an edge: the candidate whose removal hurts most (the first on a tie).
pub fn choose_op(candidates: &[usize], measures: &[Measure], by_loss: bool) -> usize {
    extreme(candidates, measures, by_loss, true)
}

/// The input edge to take off a node: the candidate whose removal hurts least (the first on
/// a tie).
pub fn choose_removal(candidates: &[usize], measures: &[Measure], by_loss: bool) -> usize {
    extreme(candidates, measures, by_loss, false)
}

/// The ops an edge's decision measures: every primitive but `none` (which is never kept).
pub fn op_candidates(primitives: &[Primitive]) -> Vec<usize> {
    (0..primitives.len()).filter(|k| primitives[*k] != Primitive::None).collect()
}

/// An op decision: the supernet as it stood, each candidate's measurement, the op kept.
#[derive(Debug, Clone, PartialEq)]
pub struct OpDecision {
    /// The edge decided.
    pub edge: usize,
    /// The measurement with nothing taken out.
    pub base: Measure,
    /// `(op, measurement with it taken out)` per candidate.
    pub measures: Vec<(usize, Measure)>,
    /// The op kept.
    pub kept: usize,
}

/// Decides the op of `edge` among `candidates` by `measure` (the supernet's validation with
/// a [`Trial`] taken out of the cell): the op whose removal hurts most.
pub fn decide_op(
    edge: usize,
    candidates: &[usize],
    by_loss: bool,
    mut measure: impl FnMut(&Trial) -> Measure,
) -> OpDecision {
    let base = measure(&Trial::Nothing);
    let ms: Vec<Measure> = candidates.iter().map(|&op| measure(&Trial::Op { edge, op })).collect();
    let kept = choose_op(candidates, &ms, by_loss);
    OpDecision { edge, base, measures: candidates.iter().copied().zip(ms).collect(), kept }
}

/// One pass of an input decision: the node with the edges `gone` already taken off, each
/// remaining edge's measurement with it taken off too, and the edge removed.
#[derive(Debug, Clone, PartialEq)]
pub struct InputPass {
    /// The measurement with only the earlier passes' edges taken off.
    pub base: Measure,
    /// `(edge, measurement)` per remaining edge.
    pub measures: Vec<(usize, Measure)>,
    /// The edge taken off.
    pub removed: usize,
}

/// Decides the two inputs of `node` by `measure`: while more than two input edges remain,
/// the one whose removal hurts least is taken off. Returns the passes and the kept edges.
pub fn decide_inputs(
    node: usize,
    by_loss: bool,
    mut measure: impl FnMut(&Trial) -> Measure,
) -> (Vec<InputPass>, Vec<usize>) {
    let mut left = node_edges(node);
    let (mut gone, mut passes) = (Vec::new(), Vec::new());
    while left.len() > 2 {
        let base = measure(&Trial::Edges(gone.clone()));
        let measures: Vec<(usize, Measure)> = left
            .iter()
            .map(|&e| {
                let mut out = gone.clone();
                out.push(e);
                (e, measure(&Trial::Edges(out)))
            })
            .collect();
        let ms: Vec<Measure> = measures.iter().map(|m| m.1).collect();
        let removed = choose_removal(&left, &ms, by_loss);
        left.retain(|e| *e != removed);
        gone.push(removed);
        passes.push(InputPass { base, measures, removed });
    }
    (passes, left)
}

/// Where a decision is made: at the end of `epoch`, in round `round` (0-based) of kind
/// `kind`, in the reduction cell or the normal cell.
#[derive(Debug, Clone, Copy)]
pub struct At {
    /// The epoch at whose end it is made.
    pub epoch: usize,
    /// The round.
    pub round: usize,
    /// What the round decides.
    pub kind: Round,
    /// The cell type.
    pub reduction: bool,
}

/// One decision of one cell type under `p`, made on `proj` (the edge or node chosen by
/// `p.order` from `seed`): the candidates measured by `measure`, as `selection.csv` rows.
pub fn decide_cell(
    proj: &mut Projection,
    at: At,
    p: &PerturbationConfig,
    (primitives, seed): (&[Primitive], u64),
    measure: impl FnMut(&Trial) -> Measure,
) -> Vec<SelectionRow> {
    let by_loss = p.criterion == SelectionCriterion::Loss;
    let reduction = at.reduction;
    let cell = proj.cell(reduction).clone();
    let cell_type = if reduction { CellType::Reduce } else { CellType::Normal };
    let row = |edge: usize, m: &Measure, base: &Measure, verdict: Verdict, decision| {
        let op = cell.ops[edge].map_or("-".to_string(), |k| primitives[k].to_string());
        SelectionRow {
            epoch: at.epoch,
            cell_type,
            decision,
            node: node_of(edge),
            edge,
            candidate: op,
            top1: m.top1,
            loss: m.loss,
            drop: base.top1 - m.top1,
            verdict,
        }
    };
    let mut rows = Vec::new();
    match at.kind {
        Round::Op => {
            let open = cell.open_edges();
            if open.is_empty() {
                return rows;
            }
            let edge = pick(&open, p.order, seed, at.round, reduction);
            let d = decide_op(edge, &op_candidates(primitives), by_loss, measure);
            for (op, m) in &d.measures {
                let verdict = if *op == d.kept { Verdict::Kept } else { Verdict::None };
                let mut r = row(edge, m, &d.base, verdict, Decision::Op);
                r.candidate = primitives[*op].to_string();
                rows.push(r);
            }
            proj.cell_mut(reduction).ops[edge] = Some(d.kept);
        }
        Round::Input => {
            let open = cell.open_nodes();
            if open.is_empty() {
                return rows;
            }
            let node = pick(&open, p.order, seed, at.round, reduction);
            let (passes, kept) = decide_inputs(node, by_loss, measure);
            for pass in &passes {
                for (e, m) in &pass.measures {
                    let verdict = if *e == pass.removed { Verdict::Removed } else { Verdict::None };
                    rows.push(row(*e, m, &pass.base, verdict, Decision::Input));
                }
            }
            proj.cell_mut(reduction).inputs[node] = Some(kept);
        }
    }
    rows
}
