//! A wave's node sums: each edge's weighted sum of its candidates, and the coefficients that
//! weight a wave's columns for the nodes it feeds.

use burn::tensor::{Int, Tensor, TensorData};
use qdarts_kernels::pick::pick;
use qdarts_kernels::split::split;

use super::super::waves::Wave;

/// Each edge's weighted sum `Σ_p w[edge, p] · y_p` of a wave, `[N, E, C·H'·W']`, added term
/// by term in the primitives' order from `columns` (laid out as `blocks` says). Each term is
/// a whole block times its edges' weights, `[N, E, C·H'·W']` (a block per source repeated for
/// the edges reading it), so that no column is cut out of its tensor one by one: the backward
/// of a cut allocates the whole tensor, per cut.
pub(super) fn edge_sums(
    wave: &Wave,
    blocks: &[(usize, Block)],
    columns: &[Tensor<3>],
    flat: &Tensor<1>,
    k: usize,
) -> Tensor<3> {
    let (edges, per) = (wave.edges.len(), wave.per_source());
    // Each block's columns: its tensor's, or its run of them.
    // Each columns tensor's blocks, in order, cut in one split.
    let mut widths: Vec<Vec<usize>> = vec![Vec::new(); columns.len()];
    let (mut t, mut at) = (0, 0);
    for &(_, block) in blocks {
        let width = match block {
            Block::Edges => edges,
            Block::Sources => wave.sources.len(),
        };
        if at == columns[t].dims()[1] {
            (t, at) = (t + 1, 0);
        }
        widths[t].push(width);
        at += width;
    }
    let cut = columns
        .iter()
        .zip(&widths)
        .filter(|(_, w)| !w.is_empty())
        .flat_map(|(cols, w)| split(cols.clone(), 1, w));
    let mut terms: Vec<(usize, Block, Tensor<3>)> =
        blocks.iter().zip(cut).map(|(&(p, block), y)| (p, block, y)).collect();
    terms.sort_by_key(|(p, _, _)| *p);
    let device = flat.device();
    let sum = terms.into_iter().fold(None, |sum: Option<Tensor<3>>, (p, block, t)| {
        let y = match block {
            Block::Edges => t,
            Block::Sources => {
                let [n, s, len] = t.dims();
                t.reshape([n, s, 1, len]).expand([n, s, per, len]).reshape([n, edges, len])
            }
        };
        let index: Vec<i64> = wave.edges.iter().map(|&edge| (edge * k + p) as i64).collect();
        let index = Tensor::<1, Int>::from_data(TensorData::new(index, [edges]), &device);
        let w = flat.clone().select(0, index).reshape([1, edges, 1]);
        let term = y.mul(w);
        Some(match sum {
            Some(acc) => acc.add(term),
            None => term,
        })
    });
    sum.expect("a wave has a candidate other than none")
}

/// What a candidate's columns of a wave's node sums are.
#[derive(Debug, Clone, Copy)]
pub(super) enum Block {
    /// One per edge, edge after edge.
    Edges,
    /// One per source state (a parameter-free candidate, run once per source).
    Sources,
}

/// Where a wave's coefficients come from: for each column of its terms and each node it
/// feeds, the index of the mixing weight in the cell's `[edges · K]` row, or none where that
/// column does not feed that node.
#[derive(Debug, Clone)]
pub(super) struct Mixing {
    /// `[fed, columns]`, row by row: `edge · K + primitive`, or none.
    index: Vec<Option<usize>>,
    columns: usize,
}

impl Mixing {
    /// The columns of `blocks` in order: a primitive's `E` (edge after edge) or one per
    /// source. The rows are the nodes the wave feeds, or (`per_edge`) its edges, each edge's
    /// own weighted sum.
    pub(super) fn new(wave: &Wave, blocks: &[(usize, Block)], k: usize, per_edge: bool) -> Self {
        let per = wave.per_source();
        let rows = if per_edge { wave.edges.len() } else { wave.fed.len() };
        // Each column: its primitive, and for each row the edge that reaches it there.
        let mut columns: Vec<(usize, Vec<Option<usize>>)> = Vec::new();
        for &(p, block) in blocks {
            match block {
                Block::Edges => {
                    for (j, &edge) in wave.edges.iter().enumerate() {
                        let to = (0..rows).map(|r| {
                            let row = if per_edge { j } else { wave.node_of[j] - wave.fed.start };
                            (row == r).then_some(edge)
                        });
                        columns.push((p, to.collect()));
                    }
                }
                Block::Sources => {
                    for s in 0..wave.sources.len() {
                        let to = (0..rows).map(|r| match per_edge {
                            true => (wave.source_of[r] == s).then_some(wave.edges[r]),
                            false => Some(wave.edges[s * per + r]),
                        });
                        columns.push((p, to.collect()));
                    }
                }
            }
        }
        let (fed, n) = (rows, columns.len());
        let mut index = vec![None; fed * n];
        for (c, (p, to)) in columns.iter().enumerate() {
            for (r, edge) in to.iter().enumerate() {
                if let Some(edge) = edge {
                    index[r * n + c] = Some(edge * k + p);
                }
            }
        }
        Mixing { index, columns: n }
    }

    /// The rows of this wave's coefficients.
    pub(super) fn rows(&self) -> usize {
        self.index.len() / self.columns
    }
}

/// The coefficients `[1, rows, columns]` of each of `mixings` from `weights`, the cell's
/// mixing weights `[edges · K]` followed by one zero ([`with_zero`]), the coefficient of a
/// column where it does not feed a row: every wave's in one [`pick`] (one launch each way on
/// the CubeCL runtimes).
pub(super) fn coefficients(mixings: &[Mixing], weights: &Tensor<1>) -> Vec<Tensor<3>> {
    let zero = weights.dims()[0] - 1;
    let index: Vec<Vec<usize>> =
        mixings.iter().map(|m| m.index.iter().map(|i| i.unwrap_or(zero)).collect()).collect();
    pick(weights.clone(), &index)
        .into_iter()
        .zip(mixings)
        .map(|(c, m)| c.reshape([1, m.rows(), m.columns]))
        .collect()
}

/// `flat` followed by one zero (written from the host, no launch): what
/// [`Mixing::coefficients`] gathers a zero coefficient from.
pub(super) fn with_zero(flat: Tensor<1>) -> Tensor<1> {
    let zero = Tensor::<1>::from_data(TensorData::new(vec![0.0f32], [1]), &flat.device());
    qdarts_kernels::cat::cat(vec![flat, zero], 0)
}
