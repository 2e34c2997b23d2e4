//! PC-DARTS' partial channels in waves: each edge's candidates see the first
//! `C/K` channels of its source, the other channels bypass the edge (max-pooled 2×2 where the
//! edge strides), and the edge's output is the two concatenated and channel-shuffled with `K`
//! groups ([`QMixedOp`](qdarts_ops::candidates::QMixedOp)).
//!
//! The waves run the candidates on the sources' first `C/K` channels (views, no copy) and sum
//! each node's mixed outputs as they do without partial channels. Since the concatenation and
//! the shuffle are linear, a node's sum of its edges' outputs is the shuffle of the
//! concatenation of its edges' summed mixed outputs and its edges' summed bypasses: each node
//! is completed once, from the states it reads. A quantized cell's edge outputs are each
//! rounded by the edge's output quantizer, so there each edge's output is made whole first
//! ([`edge_outputs`]) and the nodes add them as without partial channels.

use burn::tensor::Tensor;
use burn::tensor::ops::MaxPoolOptions;
use qdarts_kernels::cat::cat;
use qdarts_ops::candidates::{QTensor, channel_shuffle};
use qdarts_ops::quant::hold::{max_pool2d_held, narrow_channels};

use super::super::waves::{Wave, edge_index};

/// Each state's first `C/k` channels, as views on their grids.
pub(super) fn heads(states: &[QTensor], k: usize) -> Vec<QTensor> {
    states
        .iter()
        .map(|s| {
            let dims = s.dims();
            let part = dims[1] / k;
            QTensor {
                value: s.value.clone().narrow(1, 0, part),
                grid: narrow_channels(s.grid.as_ref(), dims, 0, part),
            }
        })
        .collect()
}

/// Node `node` of a float cell from the sum of its edges' mixed outputs, `head`
/// (`[N, C/k, H', W']`): its edges' bypassed channels summed (each edge's times its PC-DARTS
/// weight in `edge`), concatenated after `head` and shuffled with `k` groups, plus DARTS-'
/// auxiliary terms (`β`, each stride-1 source times β).
pub(super) fn complete(
    head: Tensor<4>,
    states: &[QTensor],
    node: usize,
    (edge, beta): (Option<&Tensor<1>>, f32),
    reduction: bool,
    k: usize,
) -> Tensor<4> {
    let part = head.dims()[1];
    let mut bypass: Option<Tensor<4>> = None;
    let mut aux: Option<Tensor<4>> = None;
    for (j, s) in states.iter().enumerate().take(node + 2) {
        let strided = reduction && j < 2;
        let mut rest = bypassed(s, part, strided);
        if !strided && beta > 0.0 {
            let term = s.value.clone().mul_scalar(beta);
            aux = Some(aux.map_or(term.clone(), |a| a.add(term)));
        }
        if let Some(e) = edge {
            let i = edge_index(node, j);
            rest = rest.mul(e.clone().slice(i..i + 1).reshape([1, 1, 1, 1]));
        }
        bypass = Some(bypass.map_or(rest.clone(), |b| b.add(rest)));
    }
    let bypass = bypass.expect("a node reads two states or more");
    let out = channel_shuffle(cat(vec![head, bypass], 1), k);
    match aux {
        Some(a) => out.add(a),
        None => out,
    }
}

/// A state's channels from `part` on, which bypass an edge's candidates: max-pooled 2×2 where
/// the edge strides (on the state's grid held at `w`, as the per-edge cell pools them).
fn bypassed(state: &QTensor, part: usize, strided: bool) -> Tensor<4> {
    let dims = state.dims();
    let rest = state.value.clone().narrow(1, part, dims[1] - part);
    if !strided {
        return rest;
    }
    let opts = MaxPoolOptions::new([2, 2]).with_stride([2, 2]);
    let grid = narrow_channels(state.grid.as_ref(), dims, part, dims[1] - part);
    max_pool2d_held(rest, grid.as_ref(), opts)
}

/// Each edge's output of a quantized wave before its output quantizer, `[N, E, C·H'·W']`, from
/// its candidates' sum on the first `C/k` channels, `mixed` (`[N, E, (C/k)·H'·W']`, of node
/// shape `shape`): the sum and the edge's source's bypassed channels concatenated and shuffled
/// with `k` groups, as the per-edge cell's mixed op computes them; and the node's shape.
pub(super) fn edge_outputs(
    mixed: Tensor<3>,
    shape: [usize; 4],
    states: &[QTensor],
    wave: &Wave,
    reduction: bool,
    k: usize,
) -> (Tensor<3>, [usize; 4]) {
    let [n, part, h, w] = shape;
    let (sources, per) = (wave.sources.len(), wave.per_source());
    let rests: Vec<Tensor<4>> =
        wave.sources.iter().map(|&s| bypassed(&states[s], part, reduction && s < 2)).collect();
    let r = rests[0].dims()[1];
    let flat = |t: Tensor<4>| t.reshape([n, 1, r * h * w]);
    let rest = match rests.len() {
        1 => flat(rests.into_iter().next().expect("one")),
        _ => cat(rests.into_iter().map(flat).collect(), 1),
    };
    // Each source's bypass for each of its edges (a wave's edges are source by source).
    let edges = sources * per;
    let rest = rest.reshape([n, sources, 1, r * h * w]).expand([n, sources, per, r * h * w]);
    let both = cat(vec![mixed, rest.reshape([n, edges, r * h * w])], 2);
    let c = part + r;
    let shuffled = channel_shuffle(both.reshape([n * edges, c, h, w]), k);
    (shuffled.reshape([n, edges, c * h * w]), [n, c, h, w])
}
