//! `SearchNetwork`: stem – search cells (reductions at 1/3 and 2/3 depth) – global average pool
//! – linear classifier, all fake-quantized (pt.darts `SearchCNN`). It holds only weights: the
//! architecture parameters are [`super::Alphas`], owned by the search controller.

use burn::module::Module;
use burn::tensor::{Device, Tensor};
use qdarts_genotypes::Primitive;
use qdarts_ops::candidates::{
    ConvShape, Ctx, OpBits, Pass, QBatchNorm, QConv, QTensor, QuantSites, quantize_opt,
};
use qdarts_ops::network::{QLinear, is_reduction};
use qdarts_ops::qconfig::{QuantConfig, Site};
use qdarts_ops::quant::{FakeQuantizer, QuantPass, SpecError};

use super::alphas::ArchWeights;
use super::batched::{BatchError, BatchedCell, CellBits};
use super::cell::{CellShape, SearchCell};

/// The shape of a search network.
#[derive(Debug, Clone, PartialEq)]
pub struct NetShape {
    /// Input channels (1 for Fashion-MNIST, 3 for CIFAR-10).
    pub c_in: usize,
    /// Classes.
    pub classes: usize,
    /// Channels of the first cell (`C`).
    pub channels: usize,
    /// Cells.
    pub layers: usize,
    /// Intermediate nodes per cell.
    pub nodes: usize,
    /// The stem has `stem_multiplier · C` channels.
    pub stem_multiplier: usize,
    /// Candidate ops on every edge.
    pub primitives: Vec<Primitive>,
    /// PC-DARTS partial channels `K` of every mixed op (1: plain DARTS).
    pub partial_channels: usize,
    /// Candidate `(weight, activation)` widths of a bit-width search (`None`: the config's).
    pub bits: Option<(Vec<u32>, Vec<u32>)>,
}

/// The supernet's weights (the alphas live in [`Alphas`](super::Alphas)).
#[derive(Module, Debug)]
pub struct SearchNetwork {
    /// Stem convolution 3×3 (`stem.conv`).
    pub stem: QConv,
    /// Stem BatchNorm, affine (`stem.bn`).
    pub stem_bn: QBatchNorm,
    /// Stem output quantizer (`stem.act`).
    pub stem_act: Option<FakeQuantizer>,
    /// The cells (`cells.<i>`).
    pub cells: Vec<SearchCell>,
    /// With `model.batched_cells`, each cell's edges in waves (`batched.<i>`), which the
    /// forward pass runs in place of the cells' edges (their preprocessing still runs);
    /// otherwise empty.
    pub batched: Vec<BatchedCell>,
    /// Quantizer of the pooled features (`gap.act`).
    pub gap_act: Option<FakeQuantizer>,
    /// Classifier (`classifier`).
    pub classifier: QLinear,
    /// DARTS-' β of the auxiliary skip connections at the current step (0: none); set by the
    /// search loop, not a weight (not saved: the loop sets it again from the step).
    pub aux_skip: f32,
}

impl SearchNetwork {
    /// A search network.
    pub fn new(s: &NetShape, cfg: &QuantConfig, device: &Device) -> Result<Self, SpecError> {
        let ctx = |path: &str, op: &'static str| Ctx::new(cfg, op, path, device);
        let c_stem = s.stem_multiplier * s.channels;
        let stem =
            QConv::new(ConvShape::square(s.c_in, c_stem, 3, 1, 1), &ctx("stem.conv", "stem"))?;
        let stem_bn = QBatchNorm::new(c_stem, true, &ctx("stem.bn", "stem"))?;
        let stem_act = ctx("stem", "stem").quantizer(Site::Act, "act", 1)?;
        let (mut c_pp, mut c_p, mut c) = (c_stem, c_stem, s.channels);
        let mut reduction_prev = false;
        let mut cells = Vec::with_capacity(s.layers);
        for i in 0..s.layers {
            let reduction = is_reduction(i, s.layers);
            if reduction {
                c *= 2;
            }
            let shape = CellShape {
                c_pp,
                c_p,
                c,
                reduction,
                reduction_prev,
                nodes: s.nodes,
                partial: s.partial_channels,
            };
            let bits = match &s.bits {
                Some((weight, act)) => OpBits::Search { weight, act },
                None => OpBits::Config,
            };
            let path = format!("cells.{i}");
            cells.push(SearchCell::with_bits(shape, &s.primitives, cfg, &path, device, bits)?);
            reduction_prev = reduction;
            (c_pp, c_p) = (c_p, c * s.nodes);
        }
        Ok(SearchNetwork {
            stem,
            stem_bn,
            stem_act,
            cells,
            batched: Vec::new(),
            gap_act: ctx("gap", "classifier").quantizer(Site::Act, "act", 1)?,
            classifier: QLinear::new(c_p, s.classes, &ctx("classifier", "classifier"))?,
            aux_skip: 0.0,
        })
    }

    /// Runs every cell's edges in waves from now on ([`BatchedCell`], built from the cells'
    /// current weights; `model.batched_cells`).
    ///
    /// # Errors
    /// Where a cell cannot run batched ([`BatchError`]).
    pub fn batch_cells(&mut self, primitives: &[Primitive]) -> Result<(), BatchError> {
        self.batched = self
            .cells
            .iter()
            .map(|c| BatchedCell::from_cell(c, primitives))
            .collect::<Result<_, _>>()?;
        Ok(())
    }

    /// Writes the batched cells' weights and BatchNorm statistics back into the per-edge cells
    /// and runs them edge by edge again: the inverse of [`Self::batch_cells`].
    pub fn unbatch_cells(&mut self) {
        *self = self.with_cells_synced();
        self.batched.clear();
    }

    /// A copy whose per-edge cells hold the batched cells' current weights and statistics, the
    /// batched cells kept: what a checkpoint saves, so that every tensor in it is current.
    pub fn with_cells_synced(&self) -> Self {
        let mut net = self.clone();
        for (cell, b) in net.cells.iter_mut().zip(&self.batched) {
            b.write_into(cell);
        }
        net
    }

    /// Logits for a batch, with the softmax of each cell type's α given per edge.
    ///
    /// # Shapes
    /// - x: `[N, c_in, H, W]`; w_normal, w_reduce: `[edges, K]`; output: `[N, classes]`.
    pub fn forward(&self, x: Tensor<4>, w_normal: Tensor<2>, w_reduce: Tensor<2>) -> Tensor<2> {
        self.forward_arch(x, ArchWeights::plain(w_normal, w_reduce))
    }

    /// Logits for a batch under the architecture weights `a` (α, and PC-DARTS' edge weights
    /// when present).
    pub fn forward_arch(&self, x: Tensor<4>, a: ArchWeights) -> Tensor<2> {
        self.forward_in(x, a, QuantPass::OFF)
    }

    /// [`forward_arch`](Self::forward_arch) in the quantizer pass `qp` (held rounding in the
    /// second-order step's passes at `w` and `w±`, error statistics, the kernel).
    pub fn forward_in(&self, x: Tensor<4>, a: ArchWeights, qp: QuantPass) -> Tensor<2> {
        let rows = |w: Tensor<2>| -> Vec<Tensor<1>> {
            let [e, k] = w.dims();
            (0..e).map(|i| w.clone().slice(i..i + 1).reshape([k])).collect()
        };
        let scalars = |w: Option<Tensor<1>>| -> Option<Vec<Tensor<1>>> {
            w.map(|w| (0..w.dims()[0]).map(|i| w.clone().slice(i..i + 1)).collect())
        };
        let (w_normal, w_reduce) = (a.normal.clone(), a.reduce.clone());
        let (e_normal, e_reduce) = (a.edge_normal.clone(), a.edge_reduce.clone());
        let (normal, reduce) = (rows(a.normal), rows(a.reduce));
        let (edge_n, edge_r) = (scalars(a.edge_normal), scalars(a.edge_reduce));
        let stem = self.stem.forward_mixed(x, Pass::quantizing(qp));
        let s = quantize_opt(&self.stem_act, self.stem_bn.forward_biased(stem, None, qp), qp);
        let (mut s0, mut s1): (QTensor, QTensor) = (s.clone(), s);
        // Each cell type's bit-width softmaxes as the cells in waves take them (views).
        let cell_bits = |r| a.bits.as_ref().map(|b| CellBits::of(b, r));
        let (bits_n, bits_r) = (cell_bits(false), cell_bits(true));
        for (i, cell) in self.cells.iter().enumerate() {
            if let Some(b) = self.batched.get(i) {
                let (w, e) =
                    if cell.reduction { (&w_reduce, &e_reduce) } else { (&w_normal, &e_normal) };
                let p0 = cell.preproc0.forward_in(s0, qp);
                let p1 = cell.preproc1.forward_in(s1.clone(), qp);
                let bits = if cell.reduction { &bits_r } else { &bits_n };
                let pass = Pass { quant: qp, bits: bits.as_ref() };
                let out = b.forward((p0, p1), w.clone(), e.clone(), self.aux_skip, cell, pass);
                (s0, s1) = (s1, out);
                continue;
            }
            let (w, e) = if cell.reduction { (&reduce, &edge_r) } else { (&normal, &edge_n) };
            let pass = Pass { quant: qp, bits: a.bits.as_ref() };
            let out = cell.forward(s0, s1.clone(), w, e.as_deref(), self.aux_skip, pass);
            (s0, s1) = (s1, out);
        }
        let [n, c, _, _] = s1.dims();
        let pooled = s1.value.mean_dim(3).mean_dim(2).reshape([n, c]);
        let pooled = match &self.gap_act {
            Some(q) => q.forward_in(pooled, qp).0,
            None => pooled,
        };
        self.classifier.forward_q(pooled, None, qp)
    }
}

impl QuantSites for SearchNetwork {
    fn quantizers(&self) -> Vec<&FakeQuantizer> {
        let mut q = self.stem.quantizers();
        q.extend(self.stem_bn.quantizers());
        q.extend(self.stem_act.iter());
        for c in &self.cells {
            q.extend(c.quantizers());
        }
        for b in &self.batched {
            q.extend(b.quantizers());
        }
        q.extend(self.gap_act.iter());
        q.extend(self.classifier.wq.iter());
        q
    }
}
