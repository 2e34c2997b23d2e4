//! skip_connect at stride 2 (FactorizedReduce) over a wave's stacked edges.

use burn::module::{Module, Param};
use burn::tensor::ops::ConvOptions;
use burn::tensor::{Tensor, s};
use qdarts_kernels::direct_conv::{conv2d as direct_conv2d, direct_available};
use qdarts_ops::candidates::{Bias, Pass, QBatchNorm};
use qdarts_ops::quant::{FakeQuantizer, Grid};

use super::bank;
use super::bits::{CellBits, RowMix};
use qdarts_kernels::cat::cat;

/// FactorizedReduce over the stacked edges: two strided 1×1 convolutions in `E` groups, each
/// edge's halves side by side, and one BN.
#[derive(Module, Debug)]
pub struct StackedReduce {
    /// First half's weights `[E·C/2, C, 1, 1]`.
    pub conv1: Param<Tensor<4>>,
    /// Second half's (on the input shifted by a pixel).
    pub conv2: Param<Tensor<4>>,
    /// BatchNorm of the `E·C` channels.
    pub bn: QBatchNorm,
    /// The halves' weight quantizers (per output channel of each edge) and the output's
    /// (per tensor of each edge); none in a float cell.
    pub quant: [Option<FakeQuantizer>; 3],
    /// Their mixes under a bit-width search, a row per edge.
    pub mixes: [Option<RowMix>; 3],
    /// Edges `E`.
    pub edges: usize,
}

impl StackedReduce {
    /// On `x`, every edge's input side by side after the ReLU, on `grid` (per channel), in
    /// the pass `pass` (the quantizers' held rounding, a bit-width search's softmaxes).
    pub(super) fn forward(
        &self,
        x: Tensor<4>,
        grid: Option<&Grid>,
        pass: Pass<CellBits>,
    ) -> Tensor<4> {
        let qp = pass.quant;
        let [n, _, h, w] = x.dims();
        let shifted = x.clone().narrow(2, 1, h - 1).narrow(3, 1, w - 1);
        let e = self.edges;
        let half = |x: Tensor<4>, wt: &Param<Tensor<4>>, i: usize| {
            let x = x.slice(s![.., .., 0..;2, 0..;2]);
            let (wt, g) = match (&self.quant[i], &self.mixes[i], pass.bits) {
                // EdMIPS' composite convolution: no single grid, no bias unit.
                (_, Some(m), Some(bits)) => {
                    let w = wt.val();
                    let view = [1, e, w.shape().num_elements() / e];
                    (m.forward(w, &bits.weight, view, qp), None)
                }
                (Some(q), _, _) => {
                    let (w, g) = q.forward_in(wt.val(), qp);
                    (w, Some(g))
                }
                (None, _, _) => (wt.val(), None),
            };
            (grouped_pointwise(x, wt, e), g)
        };
        let [q1, _, act] = &self.quant;
        let ((y1, g1), (y2, g2)) = (half(x, &self.conv1, 0), half(shifted, &self.conv2, 1));
        let [_, c2, oh, ow] = y1.dims();
        // Each edge's halves side by side.
        let side = |a: Tensor<4>, b: Tensor<4>| {
            let a = a.reshape([n, e, c2 / e, oh * ow]);
            let b = b.reshape([n, e, c2 / e, oh * ow]);
            cat(vec![a, b], 2).reshape([n, 2 * c2, oh, ow])
        };
        let y = side(y1, y2);
        // The bias's unit: each half's `s_w` times its edge's input step, as the edges'.
        let bias = match (g1, g2, grid, q1) {
            (Some(g1), Some(g2), Some(gi), Some(q)) if !(g1.is_held() || gi.is_held()) => {
                // Every input channel of an edge has its source's step: the first of each.
                let c = gi.step.dims()[0] / e;
                let step_in = gi.step.clone().reshape([e, c]).narrow(1, 0, 1).expand([e, c2 / e]);
                let unit = |g: Grid| {
                    g.step.detach().mul(step_in.clone().reshape([c2]).detach()).reshape([e, c2 / e])
                };
                let both = cat(vec![unit(g1), unit(g2)], 1).reshape([2 * c2]);
                Some(Bias { factors: vec![both], round: q.spec().round() })
            }
            _ => None,
        };
        let y = self.bn.forward_biased(y, bias, qp);
        bank::quantize_or_mix((act, &self.mixes[2]), y, pass).0
    }
}

/// A 1×1 convolution of `x` `[N, G·Ci, H, W]` in `groups` groups, `w` `[G·Co, Ci, 1, 1]`:
/// one launch on the CubeCL runtimes, a batched matrix product elsewhere.
pub(super) fn grouped_pointwise(x: Tensor<4>, w: Tensor<4>, groups: usize) -> Tensor<4> {
    if direct_available(&x.device(), x.dtype()) {
        let opts = ConvOptions::new([1, 1], [0, 0], [1, 1], groups);
        return direct_conv2d(x, w, opts);
    }
    let [n, c, h, wd] = x.dims();
    let [co, ci, _, _] = w.dims();
    let x = x.reshape([n, groups, c / groups, h * wd]);
    let w = w.reshape([1, groups, co / groups, ci]);
    w.matmul(x).reshape([n, co, h, wd])
}
