//! PC-DARTS' partial channels in waves (float cells): each edge's candidates see the first
//! `C/K` channels of its source, the other channels bypass the edge (max-pooled 2×2 where the
//! edge strides), and the edge's output is the two concatenated and channel-shuffled with `K`
//! groups ([`QMixedOp`](qdarts_ops::candidates::QMixedOp)).
//!
//! The waves run the candidates on the sources' first `C/K` channels (views, no copy) and sum
//! each node's mixed outputs as they do without partial channels. Since the concatenation and
//! the shuffle are linear, a node's sum of its edges' outputs is the shuffle of the
//! concatenation of its edges' summed mixed outputs and its edges' summed bypasses: each node
//! is completed once, from the states it reads.

use burn::tensor::Tensor;
use burn::tensor::ops::MaxPoolOptions;
use qdarts_kernels::cat::cat;
use qdarts_ops::candidates::{QTensor, channel_shuffle};
use qdarts_ops::quant::hold::{max_pool2d_held, narrow_channels};

use super::super::waves::edge_index;

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
        let dims = s.dims();
        let mut rest = s.value.clone().narrow(1, part, dims[1] - part);
        let strided = reduction && j < 2;
        if strided {
            let opts = MaxPoolOptions::new([2, 2]).with_stride([2, 2]);
            let grid = narrow_channels(s.grid.as_ref(), dims, part, dims[1] - part);
            rest = max_pool2d_held(rest, grid.as_ref(), opts);
        } else if beta > 0.0 {
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
