//! The nodes of a cell in waves: the quantized cell's node adds (each edge's output on its
//! grid an operand, in the per-edge cell's order), DARTS-' auxiliary terms, and the nodes' sums
//! as each wave completes one.

use burn::tensor::Tensor;
use qdarts_kernels::pick::pick;
use qdarts_kernels::split::split;
use qdarts_ops::candidates::{Pass, QTensor};

use super::super::cell::SearchCell;
use super::super::waves::{Wave, waves};
use super::{BatchedCell, CellBits, partial};

impl BatchedCell {
    /// [`forward`](Self::forward) of a quantized cell: each wave gives every edge's output on
    /// its grid, and a node is `cell`'s quantized add of its edges' outputs, in the cell's
    /// order, once the wave before its own has run.
    ///
    /// A quantized add reads its operands' values and sends its gradient through their float
    /// sum, so the operands are cut out of their wave's tensor detached, and the float sums
    /// are kept for all the nodes a wave feeds at once, as in the float cell: no edge's output
    /// is cut out of the tracked graph (each cut's backward allocates the whole tensor).
    pub(super) fn forward_quantized(
        &self,
        mut states: Vec<QTensor>,
        flat: &Tensor<1>,
        k: usize,
        (edge, aux_skip): (Option<Tensor<1>>, f32),
        cell: &SearchCell,
        pass: Pass<CellBits>,
    ) -> QTensor {
        let qp = pass.quant;
        // Each node's operands by (edge, 0) for the edge's output on its grid and (edge, 1)
        // for DARTS-' auxiliary term of its source: the per-edge cell's order.
        let mut operands: Vec<Vec<((usize, u8), Tensor<4>)>> = vec![Vec::new(); self.nodes];
        // The float sums of the nodes not yet complete, `[N, nodes − w, C·H'·W']`.
        let mut partial: Option<Tensor<3>> = None;
        let plan = waves(self.nodes);
        let coefficients = self.coefficients(&plan, flat, k);
        // PC-DARTS' edge weights of each wave's edges, `[1, E, 1]`: each edge's output on
        // its grid times its weight, off the grid (the node's add requantizes), as the
        // per-edge cell scales it.
        let mut scales = edge.map(|e| {
            let index: Vec<Vec<usize>> = plan.iter().map(|w| w.edges.clone()).collect();
            pick(e, &index).into_iter().map(|s| s.reshape([1, -1, 1]))
        });
        for (w, ((wave, ops), c)) in plan.iter().zip(&self.waves).zip(coefficients).enumerate() {
            let (out, shape) = match self.partial {
                1 => ops.forward(wave, &states, (flat, c), k, pass),
                // The candidates on the first C/K channels; each edge's output their sum and
                // the source's bypassed channels, shuffled, before its output quantizer.
                kp => {
                    let (mixed, shape) =
                        ops.forward(wave, &partial::heads(&states, kp), (flat, c), k, pass);
                    partial::edge_outputs(mixed, shape, &states, wave, cell.reduction, kp)
                }
            };
            let out = match &ops.edge_act {
                Some(q) => q.forward_in(out, qp).0,
                None => out,
            };
            let out = match scales.as_mut().and_then(Iterator::next) {
                Some(scale) => out.mul(scale),
                None => out,
            };
            // Each edge's output as a view `[N, C, H', W']` of the wave's channels (the
            // quantized adds read views through their strides; no copy per edge).
            let [n, c, h, wd] = shape;
            let values = out.clone().detach().reshape([n, wave.edges.len() * c, h, wd]);
            let aux = auxiliary(&states, wave, aux_skip, cell.reduction);
            for (j, &edge) in wave.edges.iter().enumerate() {
                let value = values.clone().narrow(1, j * c, c);
                operands[wave.node_of[j]].push(((edge, 0), value));
                if let Some(a) = &aux[wave.source_of[j]] {
                    operands[wave.node_of[j]].push(((edge, 1), a.clone().detach()));
                }
            }
            // The wave's edges are source by source, each source's by node: its terms added
            // source after source (each followed by its auxiliary term) onto the sums so far
            // are each node's operands added in the cell's edge order.
            let fed = wave.per_source();
            let parts = split(out, 1, &vec![fed; wave.sources.len()]);
            let mut sum = partial.take();
            for (part, a) in parts.into_iter().zip(aux) {
                let t = match sum {
                    Some(p) => p.add(part),
                    None => part,
                };
                sum = Some(match a {
                    Some(a) => t.add(flat_rows(a)),
                    None => t,
                });
            }
            let sum = sum.expect("a wave reads a source");
            let (node_sum, rest) = first_and_rest(sum);
            let node_sum = node_sum.reshape(shape);
            partial = rest;
            let mut node = std::mem::take(&mut operands[w]);
            node.sort_by_key(|(edge, _)| *edge);
            let values: Vec<Tensor<4>> = node.into_iter().map(|(_, t)| t).collect();
            states.push(cell.adds[w].forward_summed(&values, node_sum, qp));
        }
        cell.concat.forward_in(states.split_off(2), qp)
    }
}

/// DARTS-' auxiliary term of each of `wave`'s sources, `β·state` (the per-edge cell adds it to
/// every node the source feeds through a stride-1 edge): none where β is 0 or the source is a
/// reduction cell's input (its edges stride).
pub(super) fn auxiliary(
    states: &[QTensor],
    wave: &Wave,
    beta: f32,
    reduction: bool,
) -> Vec<Option<Tensor<4>>> {
    let stride1 = |s: usize| !(reduction && s < 2);
    let term =
        |s: usize| (beta > 0.0 && stride1(s)).then(|| states[s].value.clone().mul_scalar(beta));
    wave.sources.iter().map(|&s| term(s)).collect()
}

/// `[N, C, H, W]` as `[N, 1, C·H·W]`: one row, added to each node's sum of `[N, nodes, C·H·W]`.
pub(super) fn flat_rows(t: Tensor<4>) -> Tensor<3> {
    let [n, c, h, w] = t.dims();
    t.reshape([n, 1, c * h * w])
}

/// The sums `[N, nodes − w, L]` of the nodes a wave fed: the first node's (complete) as
/// `[N, L]`, and the rest's, if any, cut in one [`split`] of the rows laid flat, so that each
/// part is a view its next shape can take without a copy (a cut along the middle axis of
/// `[N, nodes − w, L]` would be copied by the reshape to the node's shape).
pub(super) fn first_and_rest(sum: Tensor<3>) -> (Tensor<2>, Option<Tensor<3>>) {
    let [n, left, l] = sum.dims();
    let flat = sum.reshape([n, left * l]);
    if left == 1 {
        return (flat, None);
    }
    let mut parts = split(flat, 1, &[l, (left - 1) * l]).into_iter();
    match (parts.next(), parts.next()) {
        (Some(first), Some(rest)) => (first, Some(rest.reshape([n, left - 1, l]))),
        _ => unreachable!("a split into two parts gives two"),
    }
}
