//! `BatchedCell`: a float search cell run wave by wave (docs/design/waves.md), each candidate
//! kind one chain of launches over the stacked edges of a wave instead of one per edge.
//!
//! Within a wave every edge's input is its source state after a ReLU, laid side by side,
//! `[N, E·C, H, W]` edge after edge (the first stage of every convolutional candidate starts
//! with that ReLU, so one stacked tensor serves them all). Over it:
//!
//! - a separable or dilated convolution is a depthwise convolution of the stacked channels
//!   (each edge's filters, `[E·C, 1, k, k]`), a 1×1 convolution in `E` groups (each edge's
//!   `[C, C]`) and a BatchNorm of the `E·C` channels, whose per-channel statistics are each
//!   edge's own; FactorizedReduce (skip_connect at stride 2) is its two strided 1×1
//!   convolutions in `E` groups and one BatchNorm;
//! - pooling with its affine-free BatchNorm runs once per source state: every edge that reads
//!   the state would compute the same tensor, and their BatchNorms' running statistics, fed
//!   the same batches from the same start, are the same;
//! - a node's sum `Σ_edges Σ_ops w[e, op] · op_e(x)` is one matrix product per candidate kind
//!   and wave, `[nodes fed, E] × [E, C·H'·W']`, with the mixing weights masked to the edges
//!   that feed each node.
//!
//! The values are those of [`SearchCell`](super::SearchCell), but for the order of the sums (a
//! node's terms are added kind by kind rather than edge by edge); `tests/batched.rs` holds the two
//! together, forward and every gradient. This first form runs float cells without partial
//! channels; the per-edge cell stays the reference and runs everything else.

use burn::module::{Module, Param};
use burn::tensor::ops::ConvOptions;
use burn::tensor::{Tensor, TensorData, s};
use qdarts_genotypes::Primitive;
use qdarts_kernels::depthwise_conv::conv2d;
use qdarts_kernels::direct_conv::{conv2d as direct_conv2d, direct_available};
use qdarts_kernels::relu::relu;
use qdarts_ops::candidates::{QBatchNorm, QPoolBN, QTensor};
use qdarts_ops::quant::SpecError;

use super::waves::{Wave, waves};

/// Why a cell cannot run batched.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    /// The cell has quantizers.
    #[error("the batched cell runs float cells only; this one has {0} quantizers")]
    Quantized(usize),
    /// PC-DARTS partial channels.
    #[error("the batched cell does not run PC-DARTS partial channels (K = {0})")]
    Partial(usize),
    /// A candidate with no batched form.
    #[error("the batched cell has no batched form of {0}")]
    Primitive(Primitive),
    /// Building a module failed.
    #[error(transparent)]
    Spec(#[from] SpecError),
}

/// What a candidate is in a wave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// `none`: nothing.
    Zero,
    /// A convolutional candidate: `convs[i]`.
    Conv(usize),
    /// skip_connect at stride 2: the wave's `reduce`.
    Reduce,
    /// skip_connect at stride 1: the source state itself.
    Identity,
    /// Pooling: `pools[i · sources + s]` for source `s`.
    Pool(usize),
}

/// (ReLU –) depthwise conv – 1×1 conv in `E` groups – BN over the stacked edges of a wave.
#[derive(Module, Debug)]
pub struct StackedStage {
    /// Depthwise weights `[E·C, 1, k, k]`, edge after edge.
    pub dw: Param<Tensor<4>>,
    /// Pointwise weights `[E·C, C, 1, 1]`, edge after edge.
    pub pw: Param<Tensor<4>>,
    /// BatchNorm of the `E·C` channels.
    pub bn: QBatchNorm,
    /// Stride, padding and dilation of the depthwise convolution.
    pub geometry: [usize; 3],
    /// Edges `E`.
    pub edges: usize,
}

/// A separable (two stages) or dilated (one) convolution over the stacked edges.
#[derive(Module, Debug)]
pub struct StackedConv {
    /// The stages; every one but the first starts with a ReLU.
    pub stages: Vec<StackedStage>,
}

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
    /// Edges `E`.
    pub edges: usize,
}

/// The candidates of one wave.
#[derive(Module, Debug)]
pub struct WaveOps {
    /// Convolutional candidates.
    pub convs: Vec<StackedConv>,
    /// Pool – BN, one per pooling candidate and source state.
    pub pools: Vec<QPoolBN>,
    /// skip_connect at stride 2.
    pub reduce: Option<StackedReduce>,
    /// Each candidate, in the primitives' order.
    #[module(skip)]
    pub slots: Vec<Slot>,
}

/// A float search cell's edges run wave by wave (its input preprocessing stays the per-edge
/// cell's).
#[derive(Module, Debug)]
pub struct BatchedCell {
    /// The candidates of each wave.
    pub waves: Vec<WaveOps>,
    /// Intermediate nodes.
    pub nodes: usize,
}

impl StackedStage {
    fn forward(&self, x: Tensor<4>) -> Tensor<4> {
        let [stride, padding, dilation] = self.geometry;
        let c = x.dims()[1];
        let opts = ConvOptions::new([stride; 2], [padding; 2], [dilation; 2], c);
        let y = conv2d(x, self.dw.val(), opts);
        self.bn.forward(grouped_pointwise(y, self.pw.val(), self.edges))
    }
}

impl StackedConv {
    fn forward(&self, x: Tensor<4>) -> Tensor<4> {
        let mut y = self.stages[0].forward(x);
        for stage in &self.stages[1..] {
            y = stage.forward(relu(y));
        }
        y
    }
}

impl StackedReduce {
    fn forward(&self, x: Tensor<4>) -> Tensor<4> {
        let [n, _, h, w] = x.dims();
        let shifted = x.clone().narrow(2, 1, h - 1).narrow(3, 1, w - 1);
        let half = |x: Tensor<4>, wt: &Param<Tensor<4>>| {
            let x = x.slice(s![.., .., 0..;2, 0..;2]);
            grouped_pointwise(x, wt.val(), self.edges)
        };
        let (y1, y2) = (half(x, &self.conv1), half(shifted, &self.conv2));
        let [_, c2, oh, ow] = y1.dims();
        let e = self.edges;
        let y1 = y1.reshape([n, e, c2 / e, oh * ow]);
        let y2 = y2.reshape([n, e, c2 / e, oh * ow]);
        let y = Tensor::cat(vec![y1, y2], 2).reshape([n, 2 * c2, oh, ow]);
        self.bn.forward(y)
    }
}

/// A 1×1 convolution of `x` `[N, G·Ci, H, W]` in `groups` groups, `w` `[G·Co, Ci, 1, 1]`:
/// one launch on the CubeCL runtimes, a batched matrix product elsewhere.
fn grouped_pointwise(x: Tensor<4>, w: Tensor<4>, groups: usize) -> Tensor<4> {
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

impl BatchedCell {
    /// [`SearchCell::forward`](super::SearchCell::forward) after the input preprocessing,
    /// without partial channels, edge weights or β: `s0`, `s1` are the cell's preprocessed
    /// inputs.
    ///
    /// # Shapes
    /// - s0, s1: `[N, C, H, W]` (s0 at twice the resolution in a reduction cell, as s1);
    ///   weights: one `[K]` row per edge, in the cell's order; output: `[N, nodes·C, H', W']`.
    pub fn forward(&self, s0: QTensor, s1: QTensor, weights: &[Tensor<1>]) -> QTensor {
        let mut states = vec![s0.value, s1.value];
        let plan = waves(self.nodes);
        // Each wave's terms of the nodes it feeds, `[N, fed, C·H'·W']`, from its first node.
        let mut terms: Vec<(usize, Tensor<3>)> = Vec::with_capacity(plan.len());
        let mut shape = [0; 4];
        for (w, (wave, ops)) in plan.iter().zip(&self.waves).enumerate() {
            if w > 0 {
                states.push(node(w - 1, &terms, shape));
            }
            let (t, out) = ops.forward(wave, &states, weights);
            shape = out;
            terms.push((wave.fed.start, t));
        }
        states.push(node(self.nodes - 1, &terms, shape));
        QTensor::float(Tensor::cat(states.split_off(2), 1))
    }
}

/// Node `i`: the sum of its terms from every wave that feeds it.
fn node(i: usize, terms: &[(usize, Tensor<3>)], [n, c, h, w]: [usize; 4]) -> Tensor<4> {
    let mut sum: Option<Tensor<3>> = None;
    for (start, t) in terms.iter().filter(|(start, t)| i >= *start && i < start + t.dims()[1]) {
        let part = t.clone().narrow(1, i - start, 1);
        sum = Some(match sum {
            Some(s) => s.add(part),
            None => part,
        });
    }
    sum.expect("every node is fed by wave 0").reshape([n, c, h, w])
}

impl WaveOps {
    /// The wave's terms of the nodes it feeds, `[N, fed, C·H'·W']`, and the shape of a node.
    fn forward(
        &self,
        wave: &Wave,
        states: &[Tensor<4>],
        weights: &[Tensor<1>],
    ) -> (Tensor<3>, [usize; 4]) {
        let (fed, e, per) = (wave.fed.len(), wave.edges.len(), wave.per_source());
        let device = states[0].device();
        let rows = wave.edges.iter().map(|&k| weights[k].clone()).collect();
        let w: Tensor<2> = Tensor::stack(rows, 0);
        let k = w.dims()[1];
        // The mixing weights of the edges that feed each node, `[fed, E, K]`.
        let mut feeds = vec![0.0f32; fed * e];
        for (j, &node) in wave.node_of.iter().enumerate() {
            feeds[(node - wave.fed.start) * e + j] = 1.0;
        }
        let feeds = Tensor::<3>::from_data(TensorData::new(feeds, [fed, e, 1]), &device);
        let masked = feeds.mul(w.reshape([1, e, k]));
        let input = || {
            let parts = wave.sources.iter().map(|&s| {
                let [n, c, h, wd] = states[s].dims();
                let r = relu(states[s].clone()).unsqueeze_dim::<5>(1);
                r.expand([n, per, c, h, wd]).reshape([n, per * c, h, wd])
            });
            Tensor::cat(parts.collect(), 1)
        };
        let stacked_input = self.slots.iter().any(|s| matches!(s, Slot::Conv(_) | Slot::Reduce));
        let input = stacked_input.then(input);
        let mut sum: Option<Tensor<3>> = None;
        let mut shape = [0; 4];
        let mut add = |t: Tensor<3>| {
            sum = Some(match sum.take() {
                Some(s) => s.add(t),
                None => t,
            })
        };
        for (p, slot) in self.slots.iter().enumerate() {
            let m = || masked.clone().narrow(2, p, 1).reshape([fed, e]);
            let per_edge = match slot {
                Slot::Zero => continue,
                Slot::Conv(i) => self.convs[*i].forward(input.clone().expect("built above")),
                Slot::Reduce => {
                    let reduce = self.reduce.as_ref().expect("a Reduce slot has its op");
                    reduce.forward(input.clone().expect("built above"))
                }
                Slot::Identity | Slot::Pool(_) => {
                    for (s, &state) in wave.sources.iter().enumerate() {
                        let t = match slot {
                            Slot::Pool(i) => {
                                self.pools[i * wave.sources.len() + s]
                                    .forward(QTensor::float(states[state].clone()))
                                    .value
                            }
                            _ => states[state].clone(),
                        };
                        let [n, c, h, wd] = t.dims();
                        shape = [n, c, h, wd];
                        // One edge from this source into each node: its weight.
                        let v = m().narrow(1, s * per, per).sum_dim(1).reshape([1, fed, 1]);
                        add(v.mul(t.reshape([n, 1, c * h * wd])));
                    }
                    continue;
                }
            };
            let [n, ec, h, wd] = per_edge.dims();
            shape = [n, ec / e, h, wd];
            add(m().unsqueeze_dim::<3>(0).matmul(per_edge.reshape([n, e, ec / e * h * wd])));
        }
        (sum.expect("a cell has a candidate other than none"), shape)
    }
}

mod stack;
