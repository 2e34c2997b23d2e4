//! Deriving a discrete genotype from architecture weights (DARTS `Network.genotype`).
//!
//! Per edge, the softmax of its α is taken first (the original DARTS does; pt.darts ranks raw
//! α, which is not invariant to a per-edge shift of α). Then for each intermediate node the
//! `k` incoming edges with the strongest non-`none` op are kept, each with that op. Ties go to
//! the lower index, as Python's stable sort and strict `>` in DARTS do.

use crate::error::GenotypeError;
use crate::genotype::{Edge, Genotype};
use crate::primitive::Primitive;

/// Number of edges of a cell with `nodes` intermediate nodes: `Σ_{i<nodes} (i + 2)`.
pub fn edge_count(nodes: usize) -> usize {
    nodes * (nodes + 3) / 2
}

/// The index of the edge from state `input` into intermediate node `node` (0-based: node 0 is
/// state 2), edges ordered node by node, inputs in increasing order.
pub fn edge_index(node: usize, input: usize) -> usize {
    edge_count(node) + input
}

/// The input state of edge `e` (the inverse of [`edge_index`] in its input).
pub fn edge_input(e: usize) -> usize {
    let mut node = 0;
    while edge_count(node + 1) <= e {
        node += 1;
    }
    e - edge_count(node)
}

/// The softmax of one edge's α over its ops: the weights `alphas.csv` records and the
/// derivation ranks.
pub fn softmax(row: &[f32]) -> Vec<f32> {
    let max = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let z: f32 = row.iter().map(|v| (v - max).exp()).sum();
    row.iter().map(|v| (v - max).exp() / z).collect()
}

/// The nodes of one cell from its raw α (`[edges][ops]`, edges ordered node by node, inputs in
/// increasing order).
pub fn derive_cell(
    alpha: &[Vec<f32>],
    primitives: &[Primitive],
    nodes: usize,
    k: usize,
) -> Result<Vec<Vec<Edge>>, GenotypeError> {
    derive_cell_excluding(alpha, primitives, nodes, k, &[], None)
}

/// [`derive_cell`] with at most `max_skip` skip_connect edges kept, as P-DARTS (Chen et al.,
/// 2019, §3.3) limits them: while the derived cell has more, the skip_connect of the lowest
/// softmax weight among the kept ones is taken off its edge, and the cell is derived again
/// (that edge then offers its next-best op, or loses its place to another edge).
pub fn derive_cell_limited(
    alpha: &[Vec<f32>],
    primitives: &[Primitive],
    nodes: usize,
    k: usize,
    max_skip: usize,
) -> Result<Vec<Vec<Edge>>, GenotypeError> {
    derive_cell_with(alpha, primitives, nodes, k, &[Limit::skip(max_skip)], None)
}

/// A cap on how many kept edges of a cell may carry an op of a class: P-DARTS' on
/// skip_connect, and the same rule on every parameter-free op (pooling and skip_connect).
#[derive(Debug, Clone, Copy)]
struct Limit {
    max: usize,
    /// Whether an op counts against the cap.
    counts: fn(Primitive) -> bool,
    /// The class, for the error.
    what: &'static str,
}

impl Limit {
    fn skip(max: usize) -> Limit {
        Limit { max, counts: |p| p == Primitive::SkipConnect, what: "skip_connect" }
    }

    fn param_free(max: usize) -> Limit {
        Limit {
            max,
            counts: |p| p != Primitive::None && !p.has_weights(),
            what: "parameter-free ops",
        }
    }
}

/// The cell under every option: caps on op classes (P-DARTS' skip limit and its extension to
/// every parameter-free op), and PC-DARTS' edge weights (`scale`, one per edge, the softmax of
/// β within each node), which multiply each edge's softmax(α) before the edges are ranked
/// (PC-DARTS `_parse`). While a cap is exceeded, the capped op of the lowest weight among the
/// kept edges is taken off its edge (ties to the later edge, so that the earlier keeps its op)
/// and the cell is derived again; each round takes one more (edge, op) pair away, so it ends.
fn derive_cell_with(
    alpha: &[Vec<f32>],
    primitives: &[Primitive],
    nodes: usize,
    k: usize,
    limits: &[Limit],
    scale: Option<&[f32]>,
) -> Result<Vec<Vec<Edge>>, GenotypeError> {
    if let Some(s) = scale
        && (s.len() != alpha.len() || s.iter().any(|v| !v.is_finite()))
    {
        return Err(GenotypeError::Weights(format!(
            "{} edge weights for {} edges, or a non-finite one",
            s.len(),
            alpha.len()
        )));
    }
    let mut excluded: Vec<(usize, Primitive)> = Vec::new();
    'derive: loop {
        let cell = derive_cell_excluding(alpha, primitives, nodes, k, &excluded, scale)?;
        for limit in limits {
            // (edge index, op, its weight) of the kept edges whose op the limit counts.
            let mut kept = Vec::new();
            let mut start = 0;
            for (i, edges) in cell.iter().enumerate() {
                for e in edges.iter().filter(|e| (limit.counts)(e.op)) {
                    let edge = start + e.input;
                    let op = primitives.iter().position(|p| *p == e.op).unwrap_or(0);
                    let w = softmax(&alpha[edge])[op] * scale.map_or(1.0, |s| s[edge]);
                    kept.push((edge, e.op, w));
                }
                start += i + 2;
            }
            if kept.len() > limit.max {
                let weakest = kept
                    .iter()
                    .min_by(|a, b| a.2.total_cmp(&b.2).then(b.0.cmp(&a.0)))
                    .map(|&(edge, op, _)| (edge, op));
                excluded.extend(weakest);
                continue 'derive;
            }
        }
        for (i, edges) in cell.iter().enumerate() {
            if edges.len() < k.min(i + 2) {
                let limit = limits.iter().map(|l| format!("at most {} {}", l.max, l.what));
                return Err(GenotypeError::Weights(format!(
                    "node {} cannot keep {k} edges with {}: the search space has no other op \
                     for its inputs",
                    i + 2,
                    limit.collect::<Vec<_>>().join(" and ")
                )));
            }
        }
        return Ok(cell);
    }
}

/// [`derive_cell`] where edge `e` may not take op `p` for every `(e, p)` in `excluded`.
fn derive_cell_excluding(
    alpha: &[Vec<f32>],
    primitives: &[Primitive],
    nodes: usize,
    k: usize,
    excluded: &[(usize, Primitive)],
    scale: Option<&[f32]>,
) -> Result<Vec<Vec<Edge>>, GenotypeError> {
    let want = edge_count(nodes);
    if alpha.len() != want {
        return Err(GenotypeError::Weights(format!(
            "{} edges given, a cell with {nodes} nodes has {want}",
            alpha.len()
        )));
    }
    if let Some(row) = alpha.iter().find(|r| r.len() != primitives.len()) {
        return Err(GenotypeError::Weights(format!(
            "an edge has {} weights for {} primitives",
            row.len(),
            primitives.len()
        )));
    }
    if alpha.iter().flatten().any(|v| !v.is_finite()) {
        return Err(GenotypeError::Weights("non-finite architecture weight".into()));
    }
    let candidates: Vec<usize> =
        (0..primitives.len()).filter(|&i| primitives[i] != Primitive::None).collect();
    if candidates.is_empty() {
        return Err(GenotypeError::Weights("no primitive other than `none`".into()));
    }
    let mut out = Vec::with_capacity(nodes);
    let mut start = 0;
    for i in 0..nodes {
        let inputs = i + 2;
        // (input, best op index, its weight)
        let mut best: Vec<(usize, usize, f32)> = (0..inputs)
            .filter_map(|j| {
                let e = scale.map_or(1.0, |s| s[start + j]);
                let w: Vec<f32> = softmax(&alpha[start + j]).into_iter().map(|v| v * e).collect();
                let allowed = |c: usize| !excluded.contains(&(start + j, primitives[c]));
                let mut kb: Option<usize> = None;
                for &c in candidates.iter().filter(|&&c| allowed(c)) {
                    if kb.is_none_or(|b| w[c] > w[b]) {
                        kb = Some(c);
                    }
                }
                kb.map(|kb| (j, kb, w[kb]))
            })
            .collect();
        best.sort_by(|a, b| b.2.total_cmp(&a.2)); // stable: ties keep the lower input first
        out.push(
            best.iter()
                .take(k.min(inputs))
                .map(|&(j, kb, _)| Edge { op: primitives[kb], input: j })
                .collect(),
        );
        start += inputs;
    }
    Ok(out)
}

/// How a genotype is derived beyond DARTS' rule.
#[derive(Debug, Clone, Copy, Default)]
pub struct DeriveOptions<'a> {
    /// P-DARTS: at most this many skip_connect edges in the normal cell.
    pub max_skip: Option<usize>,
    /// P-DARTS' rule on every parameter-free op (pooling, skip_connect): at most this many
    /// such edges in the normal cell.
    pub max_param_free: Option<usize>,
    /// PC-DARTS: edge weights of the normal cell (softmax of β within each node).
    pub edge_normal: Option<&'a [f32]>,
    /// PC-DARTS: edge weights of the reduction cell.
    pub edge_reduce: Option<&'a [f32]>,
}

impl Genotype {
    /// [`Genotype::derive`] under `opt`: P-DARTS' limit on the normal cell's skip_connect edges
    /// ([`derive_cell_limited`]), the same limit on its parameter-free edges, and PC-DARTS'
    /// edge weights in the ranking of edges.
    pub fn derive_with(
        alpha_normal: &[Vec<f32>],
        alpha_reduce: &[Vec<f32>],
        primitives: &[Primitive],
        nodes: usize,
        k: usize,
        opt: &DeriveOptions<'_>,
    ) -> Result<Genotype, GenotypeError> {
        let concat: Vec<usize> = (2..2 + nodes).collect();
        let limits: Vec<Limit> = (opt.max_skip.map(Limit::skip).into_iter())
            .chain(opt.max_param_free.map(Limit::param_free))
            .collect();
        Ok(Genotype {
            normal: derive_cell_with(alpha_normal, primitives, nodes, k, &limits, opt.edge_normal)?,
            normal_concat: concat.clone(),
            reduce: derive_cell_with(alpha_reduce, primitives, nodes, k, &[], opt.edge_reduce)?,
            reduce_concat: concat,
            normal_bits: None,
            reduce_bits: None,
        })
    }

    /// The genotype of raw α for the normal and the reduction cell (`[edges][ops]` each), keeping
    /// `k` edges per node and concatenating every intermediate node.
    pub fn derive(
        alpha_normal: &[Vec<f32>],
        alpha_reduce: &[Vec<f32>],
        primitives: &[Primitive],
        nodes: usize,
        k: usize,
    ) -> Result<Genotype, GenotypeError> {
        let concat: Vec<usize> = (2..2 + nodes).collect();
        Ok(Genotype {
            normal: derive_cell(alpha_normal, primitives, nodes, k)?,
            normal_concat: concat.clone(),
            reduce: derive_cell(alpha_reduce, primitives, nodes, k)?,
            reduce_concat: concat,
            normal_bits: None,
            reduce_bits: None,
        })
    }
}

#[cfg(test)]
mod edge_layout_tests {
    use super::*;

    #[test]
    fn edge_index_and_input_follow_the_node_by_node_order() {
        // Node 0 (state 2) reads states 0, 1: edges 0, 1; node 1 reads 0..2: edges 2..4;
        // node 2 reads 0..3: edges 5..8.
        let mut e = 0;
        for node in 0..4 {
            for input in 0..node + 2 {
                assert_eq!(edge_index(node, input), e);
                assert_eq!(edge_input(e), input);
                e += 1;
            }
        }
        assert_eq!(e, edge_count(4));
    }
}
