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
//!   column per edge, a parameter-free kind's per source); on the CubeCL runtimes one launch
//!   each way that reads the outputs where they lie ([`qdarts_kernels::mix`]), elsewhere their
//!   concatenation and a matmul.
//!
//! The values are those of [`SearchCell`](super::SearchCell), but for the order of the sums (a
//! node's terms are one dot product over the wave's columns rather than added edge by edge);
//! `tests/batched.rs` holds the two together, forward and every gradient. It runs float and
//! quantized cells (a quantized BatchNorm multiplier and a bit-width search's mixes included,
//! [`bits`]), with PC-DARTS' edge weights or without, DARTS-' auxiliary skip, and partial
//! channels ([`partial`]); the per-edge cell stays the reference and runs everything else
//! (LSQ).

use burn::module::Module;
use burn::tensor::{Tensor, TensorData};
use qdarts_genotypes::Primitive;
use qdarts_kernels::direct_conv::direct_available;
use qdarts_kernels::fan_out::fan_out;
use qdarts_ops::candidates::{Pass, QPoolBN, QTensor, QuantSites};
use qdarts_ops::quant::hold::relu_held;
use qdarts_ops::quant::{FakeQuantizer, QuantPass, SpecError};

use super::cell::SearchCell;
use super::waves::{Wave, waves};
use nodes::{auxiliary, first_and_rest, flat_rows};
use qdarts_kernels::cat::cat;
use sums::{Block, Mixing, edge_sums};

/// Why a cell cannot run batched.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    /// A candidate with no batched form.
    #[error("the batched cell has no batched form of {0}")]
    Primitive(Primitive),
    /// Convolutional kinds of one dilation whose filters do not line up once centred.
    #[error("the batched cell cannot stack {0}: its kinds of dilation {1} pad differently")]
    Padding(String, usize),
    /// Quantizers that do not batch.
    #[error(
        "the batched cell cannot stack the quantizers of {0}: every edge's must be alike, none LSQ"
    )]
    Quantizers(String),
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
    /// The output quantizer of each pool, a row per source (standing for every edge that
    /// reads it); none in a float cell.
    pub pool_acts: Vec<Option<FakeQuantizer>>,
    /// The output quantizer of each edge's mixed op, a row per edge; none in a float cell.
    pub edge_act: Option<FakeQuantizer>,
    /// The output quantizer of each edge's `none`, a row per edge: it sees zeros, and its
    /// observer moves as the per-edge cell's does (none in a float cell or without `none`).
    pub zero_act: Option<FakeQuantizer>,
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
    /// The quantizer of every edge's mixing weights, a row per edge; none in a float cell.
    pub mix: Option<FakeQuantizer>,
    /// Intermediate nodes.
    pub nodes: usize,
    /// PC-DARTS' `K`: the candidates see `C/K` channels (1: all).
    pub partial: usize,
}

impl BatchedCell {
    /// [`SearchCell::forward`](super::SearchCell::forward) after the input preprocessing:
    /// `s0`, `s1` are `cell`'s preprocessed inputs, `edge` PC-DARTS'
    /// edge weights where edges are normalized, `aux_skip` DARTS-' β (each stride-1 edge adds
    /// its source times β to its node; 0: none), `cell` the cell this one batches (its node
    /// adds and output concatenation run as they are), `pass` what the quantizers do besides
    /// quantizing and, under a bit-width search, the cell type's softmaxes over the widths.
    ///
    /// # Shapes
    /// - s0, s1: `[N, C, H, W]` (s0 at twice the resolution in a reduction cell, as s1);
    ///   weights: `[edges, K]`, a row per edge in the cell's order; edge: `[edges]`; output:
    ///   `[N, nodes·C, H', W']`.
    pub fn forward(
        &self,
        (s0, s1): (QTensor, QTensor),
        weights: Tensor<2>,
        edge: Option<Tensor<1>>,
        aux_skip: f32,
        cell: &SearchCell,
        pass: Pass<CellBits>,
    ) -> QTensor {
        let qp = pass.quant;
        let mut states = vec![s0, s1];
        let plan = waves(self.nodes);
        let [edges, k] = weights.dims();
        if self.waves.iter().any(|w| w.edge_act.is_some()) {
            let flat = match &self.mix {
                Some(q) => q.forward_in(weights.reshape([1, edges, k]), qp).0.reshape([edges * k]),
                None => weights.reshape([edges * k]),
            };
            let extras = (edge, aux_skip);
            return self.forward_quantized(states, &sums::with_zero(flat), k, extras, cell, pass);
        }
        // PC-DARTS' edge weights scale each edge's mixing weights (the per-edge cell scales
        // the edge's sum: the same value but for rounding).
        let weights = match &edge {
            Some(e) => weights.mul(e.clone().reshape([edges, 1])),
            None => weights,
        };
        // Every edge's mixing weights in one row, and a zero after them: a wave picks its
        // coefficients from it.
        let flat = sums::with_zero(weights.reshape([edges * k]));
        // The sums of the nodes not yet complete, `[N, nodes − w, C·H'·W']`: each wave adds its
        // terms (it feeds every node from its own on), and its first node is then complete.
        let mut partial: Option<Tensor<3>> = None;
        let coefficients = self.coefficients(&plan, &flat, k);
        for (w, ((wave, ops), c)) in plan.iter().zip(&self.waves).zip(coefficients).enumerate() {
            if self.partial > 1 {
                // The candidates on the first C/K channels; the node completed below.
                let heads = partial::heads(&states, self.partial);
                let (t, shape) = ops.forward(wave, &heads, (&flat, c), k, pass);
                let sum = match partial.take() {
                    Some(p) => p.add(t),
                    None => t,
                };
                let (head, rest) = first_and_rest(sum);
                let extras = (edge.as_ref(), aux_skip);
                let node = partial::complete(
                    head.reshape(shape),
                    &states,
                    w,
                    extras,
                    cell.reduction,
                    self.partial,
                );
                states.push(QTensor::float(node));
                partial = rest;
                continue;
            }
            let (mut t, shape) = ops.forward(wave, &states, (&flat, c), k, pass);
            // DARTS-' auxiliary skip: the sources' sum times β, added to every node fed.
            let aux = auxiliary(&states, wave, aux_skip, cell.reduction);
            if let Some(a) = aux.into_iter().flatten().reduce(|a, b| a.add(b)) {
                t = t.add(flat_rows(a));
            }
            let sum = match partial.take() {
                Some(p) => p.add(t),
                None => t,
            };
            let (node, rest) = first_and_rest(sum);
            states.push(QTensor::float(node.reshape(shape)));
            partial = rest;
        }
        cell.concat.forward_in(states.split_off(2), qp)
    }

    /// Each wave's coefficients where its terms are one product ([`WaveOps::by_product`]),
    /// from the cell's mixing weights and a zero (`flat`): every wave's in one pick.
    fn coefficients(&self, plan: &[Wave], flat: &Tensor<1>, k: usize) -> Vec<Option<Tensor<3>>> {
        let (device, dtype) = (flat.device(), flat.dtype());
        let mixings: Vec<Option<Mixing>> = plan
            .iter()
            .zip(&self.waves)
            .map(|(wave, ops)| {
                let per_edge = ops.edge_act.is_some();
                ops.by_product(&device, dtype)
                    .then(|| Mixing::new(wave, &ops.blocks(), k, per_edge))
            })
            .collect();
        let present: Vec<Mixing> = mixings.iter().flatten().cloned().collect();
        let mut picked = sums::coefficients(&present, flat).into_iter();
        mixings.iter().map(|m| m.as_ref().and_then(|_| picked.next())).collect()
    }
}

impl WaveOps {
    /// Each candidate's columns as [`forward`](Self::forward) lays them side by side: the
    /// bank's kinds, then skip_connect and the pools in the primitives' order.
    fn blocks(&self) -> Vec<(usize, Block)> {
        let bank = self.bank.iter().flat_map(|b| b.primitives()).map(|p| (p, Block::Edges));
        let rest = self.slots.iter().enumerate().filter_map(|(p, slot)| match slot {
            Slot::Zero | Slot::Conv(_) => None,
            Slot::Reduce => Some((p, Block::Edges)),
            Slot::Identity | Slot::Pool(_) => Some((p, Block::Sources)),
        });
        bank.chain(rest).collect()
    }

    /// Whether the wave's terms are one product of coefficients and columns; otherwise (a
    /// quantized cell off the CubeCL runtimes) each edge's sum is added term by term.
    fn by_product(&self, device: &burn::tensor::Device, dtype: burn::tensor::DType) -> bool {
        self.edge_act.is_none() || direct_available(device, dtype)
    }

    /// The wave's terms of the nodes it feeds, `[N, fed, C·H'·W']` (a quantized cell: each
    /// edge's sum, `[N, E, C·H'·W']`, which the edge's output quantizer then rounds), and the
    /// shape of a node: every
    /// candidate's output laid side by side, `[N, columns, C·H'·W']`, times the coefficients
    /// `[fed, columns]` (or `[E, columns]`) in one product.
    fn forward(
        &self,
        wave: &Wave,
        states: &[QTensor],
        (flat, coefficients): (&Tensor<1>, Option<Tensor<3>>),
        k: usize,
        pass: Pass<CellBits>,
    ) -> (Tensor<3>, [usize; 4]) {
        let qp = pass.quant;
        let (sources, per, edges) = (wave.sources.len(), wave.per_source(), wave.edges.len());
        let input = side_by_side(wave, states);
        // The sources after the ReLU that every convolutional candidate starts with, and
        // (FactorizedReduce) each edge's, edge after edge, `[N, E·C, H, W]`.
        // The bank's convolutions take the ReLU as they read the sources where the kernels
        // can (the CubeCL runtimes, a grid not held at `w`): no ReLU of their own then.
        let held = input.grid.as_ref().is_some_and(|g| g.is_held());
        let on_read = !held && direct_available(&input.value.device(), input.value.dtype());
        let convs = (self.bank.is_some() && !on_read) || self.reduce.is_some();
        // The sources' readers (the ReLU or the bank, the identity, the pools) as uses of one
        // step, whose gradients are summed in one launch where the kernels run.
        let readers = |s: &Slot| matches!(s, Slot::Identity | Slot::Pool(_));
        let read_by = usize::from(convs)
            + usize::from(self.bank.is_some() && on_read)
            + self.slots.iter().filter(|s| readers(s)).count();
        let mut uses = fan_out(input.value.clone(), read_by).into_iter();
        let mut value = move || uses.next().expect("a use per reader of the sources");
        let relu_sources = convs.then(|| relu_held(value(), input.grid.as_ref()));
        // Each candidate's outputs and what their columns are: one per edge, or per source.
        let mut columns = Vec::new();
        let mut blocks = Vec::new();
        let mut shape = [0; 4];
        if let Some(bank) = &self.bank {
            let x = match on_read {
                true => Sources::BeforeRelu(value()),
                false => Sources::AfterRelu(relu_sources.clone().expect("built above")),
            };
            let (outs, node) = bank.forward(x, per, pass);
            shape = node;
            columns.extend(outs);
            blocks.extend(bank.primitives().into_iter().map(|p| (p, Block::Edges)));
        }
        for (p, slot) in self.slots.iter().enumerate() {
            let (out, block) = match slot {
                Slot::Zero | Slot::Conv(_) => continue,
                Slot::Reduce => {
                    let reduce = self.reduce.as_ref().expect("a Reduce slot has its op");
                    let r = relu_sources.as_ref().expect("built above");
                    let grid = input
                        .grid
                        .as_ref()
                        .map(|g| grids::stacked_grid(g, input.dims(), sources, per, 1));
                    let x = stack_sources(r, sources, per, 1);
                    (reduce.forward(x, grid.as_ref(), pass), Block::Edges)
                }
                Slot::Identity => (value(), Block::Sources),
                Slot::Pool(i) => {
                    let x = QTensor { value: value(), grid: input.grid.clone() };
                    let pooled = self.pools[*i].pool_bn(x, qp);
                    (bank::quantize_rows(&self.pool_acts[*i], pooled, qp).0, Block::Sources)
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
        self.quantize_zeros(edges, &flat.device(), qp);
        debug_assert_eq!(blocks.len(), self.blocks().len(), "the columns `blocks` names");
        let terms = match coefficients {
            // One launch on the CubeCL runtimes, reading the columns where they lie; elsewhere
            // their concatenation times the coefficients.
            Some(c) => qdarts_kernels::mix::mix(c, columns),
            // Each edge's sum term by term in the primitives' order, as the per-edge cell adds
            // them (on flex, where a launch costs nothing): its values bit for bit, so that
            // the quantizer after it rounds them alike.
            None => edge_sums(wave, &blocks, &columns, flat, k),
        };
        (terms, shape)
    }

    /// The `none` candidates' output quantizers, which see only zeros whatever their number:
    /// one zero per edge gives every row the same extrema (0, 0), so the same observer update,
    /// and the same error rows (zero signal, noise and clipping), as the whole output would.
    /// Written from the host, it is no launch.
    fn quantize_zeros(&self, edges: usize, device: &burn::tensor::Device, qp: QuantPass) {
        if let Some(q) = &self.zero_act {
            let zeros = TensorData::new(vec![0.0f32; edges], [1, edges, 1]);
            q.forward_in(Tensor::<3>::from_data(zeros, device), qp);
        }
    }
}

/// The wave's sources side by side, `[N, S·C, H, W]`, on their grids side by side:
/// parameter-free candidates run on all of them at once (each channel its own statistics), the
/// identity is this tensor.
fn side_by_side(wave: &Wave, states: &[QTensor]) -> QTensor {
    match &wave.sources[..] {
        [s] => states[*s].clone(),
        many => {
            let parts: Vec<&QTensor> = many.iter().map(|&s| &states[s]).collect();
            let grids: Vec<_> = parts.iter().map(|q| (q.grid.as_ref(), q.dims())).collect();
            let value = cat(parts.iter().map(|q| q.value.clone()).collect(), 1);
            QTensor { value, grid: grids::side_by_side(&grids) }
        }
    }
}

impl QuantSites for BatchedCell {
    fn quantizers(&self) -> Vec<&FakeQuantizer> {
        let mut q: Vec<&FakeQuantizer> = self.mix.iter().collect();
        for w in &self.waves {
            if let Some(bank) = &w.bank {
                for stage in std::iter::once(&bank.first).chain(&bank.second) {
                    let StageQuant { dw, dw_act, pw, act } = &stage.quant;
                    q.extend(dw);
                    q.extend([dw_act, pw, act].into_iter().flatten());
                    q.extend(&stage.bn.wq);
                    let StageMixes { dw, dw_act, pw, act } = &stage.mixes;
                    let mixes = dw.iter().chain([dw_act, pw, act].into_iter().flatten());
                    q.extend(mixes.flat_map(|m| &m.mix.quantizers));
                }
            }
            q.extend(w.pools.iter().flat_map(|p| p.quantizers()));
            q.extend(w.pool_acts.iter().flatten());
            if let Some(r) = &w.reduce {
                q.extend(r.quant.iter().flatten().chain(&r.bn.wq));
                q.extend(r.mixes.iter().flatten().flat_map(|m| &m.mix.quantizers));
            }
            q.extend(w.edge_act.iter().chain(&w.zero_act));
        }
        q
    }
}

mod bank;
mod bits;
mod grids;
mod nodes;
mod partial;
mod reduce;
mod stack;
mod sums;

pub use bank::{
    BankKind, BankStage, ConvBank, DwGroup, Sources, StageMixes, StageQuant, stack_sources,
};
pub use bits::{CellBits, RowMix};
pub use reduce::StackedReduce;
