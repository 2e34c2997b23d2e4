//! `BatchedCell`: a float search cell run wave by wave (docs/design/waves.md), each candidate
//! kind one chain of launches over the stacked edges of a wave instead of one per edge.
//!
//! Within a wave every edge's input is its source state after a ReLU, laid side by side,
//! `[N, E·C, H, W]` edge after edge (the first stage of every convolutional candidate starts
//! with that ReLU, so one stacked tensor serves them all). Over it:
//!
//! - the separable and dilated convolutions are one bank ([`ConvBank`]): per stage, a depthwise
//!   convolution of the stacked channels (each edge's filters), a 1×1 convolution in groups
//!   (each edge's `[C, C]`) and a BatchNorm whose per-channel statistics are each edge's own,
//!   every kind of the wave in one chain on the CubeCL runtimes; FactorizedReduce (skip_connect at stride 2) is its two strided 1×1
//!   convolutions in `E` groups and one BatchNorm;
//! - pooling with its affine-free BatchNorm runs once per wave over its source states side
//!   by side (`[N, S·C, H, W]`, each channel its own statistics): every edge that reads a state
//!   would compute the same tensor, and their BatchNorms' running statistics, fed the same
//!   batches from the same start, are the same;
//! - the sums of the nodes a wave feeds, `Σ_edges Σ_ops w[e, op] · op_e(x)`, are one matrix
//!   product: the coefficients `[fed, columns]` (each edge's weight where it feeds the node,
//!   zero elsewhere; picked from the cell's `[edges · K]` mixing weights in one gather) times
//!   every candidate's output laid side by side, `[N, columns, C·H'·W']` (a stacked kind's
//!   column per edge, a parameter-free kind's per source).
//!
//! The values are those of [`SearchCell`](super::SearchCell), but for the order of the sums (a
//! node's terms are one dot product over the wave's columns rather than added edge by edge); `tests/batched.rs` holds the two
//! together, forward and every gradient. This first form runs float cells without partial
//! channels; the per-edge cell stays the reference and runs everything else.

use burn::module::{Module, Param};
use burn::tensor::ops::ConvOptions;
use burn::tensor::{Int, Tensor, TensorData, s};
use qdarts_genotypes::Primitive;
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
    /// Convolutional kinds of one dilation whose filters do not line up once centred.
    #[error("the batched cell cannot stack {0}: its kinds of dilation {1} pad differently")]
    Padding(String, usize),
    /// Building a module failed.
    #[error(transparent)]
    Spec(#[from] SpecError),
}

/// What a candidate is in a wave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// `none`: nothing.
    Zero,
    /// A separable or dilated candidate: kind `i` of the wave's [`ConvBank`].
    Conv(usize),
    /// skip_connect at stride 2: the wave's `reduce`.
    Reduce,
    /// skip_connect at stride 1: the source state itself.
    Identity,
    /// Pooling: `pools[i]`, over the wave's sources side by side.
    Pool(usize),
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
    /// The separable and dilated candidates.
    pub bank: Option<ConvBank>,
    /// Pool – BN, one per pooling candidate, over the wave's source states side by side
    /// (`[N, S·C, H, W]`: each source's channels their own statistics).
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
    ///   weights: `[edges, K]`, a row per edge in the cell's order; output:
    ///   `[N, nodes·C, H', W']`.
    pub fn forward(&self, s0: QTensor, s1: QTensor, weights: Tensor<2>) -> QTensor {
        let mut states = vec![s0.value, s1.value];
        let plan = waves(self.nodes);
        let [edges, k] = weights.dims();
        // Every edge's mixing weights in one row: a wave picks its coefficients from it.
        let flat = weights.reshape([edges * k]);
        // The sums of the nodes not yet complete, `[N, nodes − w, C·H'·W']`: each wave adds its
        // terms (it feeds every node from its own on), and its first node is then complete.
        let mut partial: Option<Tensor<3>> = None;
        for (wave, ops) in plan.iter().zip(&self.waves) {
            let (t, shape) = ops.forward(wave, &states, &flat, k);
            let sum = match partial.take() {
                Some(p) => p.add(t),
                None => t,
            };
            let left = sum.dims()[1];
            states.push(sum.clone().narrow(1, 0, 1).reshape(shape));
            partial = (left > 1).then(|| sum.narrow(1, 1, left - 1));
        }
        QTensor::float(Tensor::cat(states.split_off(2), 1))
    }
}

/// What a candidate's columns of a wave's node sums are.
#[derive(Debug, Clone, Copy)]
enum Block {
    /// One per edge, edge after edge.
    Edges,
    /// One per source state (a parameter-free candidate, run once per source).
    Sources,
}

/// Where a wave's coefficients come from: for each column of its terms and each node it
/// feeds, the index of the mixing weight in the cell's `[edges · K]` row, or none where that
/// column does not feed that node.
struct Mixing {
    /// `[fed, columns]`, row by row: `edge · K + primitive`.
    index: Vec<i64>,
    /// 1 where the column feeds the node, 0 elsewhere.
    mask: Vec<f32>,
    columns: usize,
}

impl Mixing {
    /// The columns of `blocks` in order: a primitive's `E` (edge after edge) or one per
    /// source.
    fn new(wave: &Wave, blocks: &[(usize, Block)], k: usize) -> Self {
        let per = wave.per_source();
        // Each column: its primitive, and for each node fed the edge that reaches it there.
        let mut columns: Vec<(usize, Vec<Option<usize>>)> = Vec::new();
        for &(p, block) in blocks {
            match block {
                Block::Edges => {
                    for (j, &edge) in wave.edges.iter().enumerate() {
                        let to = wave.fed.clone().map(|r| (wave.node_of[j] == r).then_some(edge));
                        columns.push((p, to.collect()));
                    }
                }
                Block::Sources => {
                    for s in 0..wave.sources.len() {
                        let to = (0..per).map(|r| Some(wave.edges[s * per + r]));
                        columns.push((p, to.collect()));
                    }
                }
            }
        }
        let (fed, n) = (wave.fed.len(), columns.len());
        let (mut index, mut mask) = (vec![0i64; fed * n], vec![0.0f32; fed * n]);
        for (c, (p, to)) in columns.iter().enumerate() {
            for (r, edge) in to.iter().enumerate() {
                if let Some(edge) = edge {
                    index[r * n + c] = (edge * k + p) as i64;
                    mask[r * n + c] = 1.0;
                }
            }
        }
        Mixing { index, mask, columns: n }
    }

    /// The coefficients `[1, fed, columns]` from the cell's mixing weights `flat`.
    fn coefficients(&self, flat: &Tensor<1>, fed: usize) -> Tensor<3> {
        let device = flat.device();
        let n = self.index.len();
        let index = Tensor::<1, Int>::from_data(TensorData::new(self.index.clone(), [n]), &device);
        let mask = Tensor::<1>::from_data(TensorData::new(self.mask.clone(), [n]), &device);
        flat.clone().select(0, index).mul(mask).reshape([1, fed, self.columns])
    }
}

impl WaveOps {
    /// The wave's terms of the nodes it feeds, `[N, fed, C·H'·W']`, and the shape of a node:
    /// every candidate's output laid side by side, `[N, columns, C·H'·W']`, times the
    /// coefficients `[fed, columns]` in one product.
    fn forward(
        &self,
        wave: &Wave,
        states: &[Tensor<4>],
        flat: &Tensor<1>,
        k: usize,
    ) -> (Tensor<3>, [usize; 4]) {
        let (sources, per, edges) = (wave.sources.len(), wave.per_source(), wave.edges.len());
        // The sources side by side, `[N, S·C, H, W]`: parameter-free candidates run on all of
        // them at once (each channel its own statistics), the identity is this tensor.
        let input = match &wave.sources[..] {
            [s] => states[*s].clone(),
            many => Tensor::cat(many.iter().map(|&s| states[s].clone()).collect(), 1),
        };
        // The sources after the ReLU that every convolutional candidate starts with, and
        // (FactorizedReduce) each edge's, edge after edge, `[N, E·C, H, W]`.
        let convs = self.bank.is_some() || self.reduce.is_some();
        let relu_sources = convs.then(|| relu(input.clone()));
        let stacked = || {
            let r = relu_sources.as_ref().expect("built above");
            stack_sources(r, sources, per, 1)
        };
        // Each candidate's outputs and what their columns are: one per edge, or per source.
        let mut columns = Vec::new();
        let mut blocks = Vec::new();
        let mut shape = [0; 4];
        if let Some(bank) = &self.bank {
            let (outs, node) = bank.forward(relu_sources.clone().expect("built above"), per);
            shape = node;
            columns.extend(outs);
            blocks.extend(bank.primitives().into_iter().map(|p| (p, Block::Edges)));
        }
        for (p, slot) in self.slots.iter().enumerate() {
            let (out, block) = match slot {
                Slot::Zero | Slot::Conv(_) => continue,
                Slot::Reduce => {
                    let reduce = self.reduce.as_ref().expect("a Reduce slot has its op");
                    (reduce.forward(stacked()), Block::Edges)
                }
                Slot::Identity => (input.clone(), Block::Sources),
                Slot::Pool(i) => {
                    let pooled = self.pools[*i].forward(QTensor::float(input.clone()));
                    (pooled.value, Block::Sources)
                }
            };
            let cols = match block {
                Block::Edges => edges,
                Block::Sources => sources,
            };
            let [n, ch, h, w] = out.dims();
            shape = [n, ch / cols, h, w];
            columns.push(out.reshape([n, cols, ch / cols * h * w]));
            blocks.push((p, block));
        }
        let mixing = Mixing::new(wave, &blocks, k);
        let x = match columns.len() {
            1 => columns.pop().expect("one"),
            _ => Tensor::cat(columns, 1),
        };
        (mixing.coefficients(flat, wave.fed.len()).matmul(x), shape)
    }
}

mod bank;
mod stack;

pub use bank::{BankKind, BankStage, ConvBank, DwGroup, stack_sources};
