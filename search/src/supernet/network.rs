//! `SearchNetwork`: stem – search cells (reductions at 1/3 and 2/3 depth) – global average pool
//! – linear classifier, all fake-quantized (pt.darts `SearchCNN`), and `Alphas`, the
//! architecture parameters the search controller owns.

use burn::module::{Module, Param};
use burn::tensor::activation::softmax;
use burn::tensor::{Device, Distribution, Tensor};
use qdarts_genotypes::{Primitive, edge_count};
use qdarts_ops::candidates::{
    ConvShape, Ctx, QBatchNorm, QConv, QTensor, QuantSites, quantize_bias, quantize_opt,
};
use qdarts_ops::qconfig::{QuantConfig, Site};
use qdarts_ops::quant::{FakeQuantizer, Grid, SpecError};

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
}

/// A linear layer with a fake-quantized weight (per output row) and a float bias.
#[derive(Module, Debug)]
pub struct QLinear {
    /// Weight `[out, in]`.
    pub weight: Param<Tensor<2>>,
    /// Bias `[out]`; freeze stores it as int32 on the scale `s_in·s_w`.
    pub bias: Param<Tensor<1>>,
    /// Weight quantizer (`<path>.weight`).
    pub wq: Option<FakeQuantizer>,
}

impl QLinear {
    /// PyTorch's Linear initialisation (uniform ±1/sqrt(in)).
    pub fn new(c_in: usize, c_out: usize, ctx: &Ctx) -> Result<Self, SpecError> {
        let b = 1.0 / (c_in as f64).sqrt();
        // Drawn now (not lazily at the first forward), in construction order.
        let u = Distribution::Uniform(-b, b);
        Ok(QLinear {
            weight: Param::from_tensor(Tensor::random([c_out, c_in], u, ctx.device)),
            bias: Param::from_tensor(Tensor::random([c_out], u, ctx.device)),
            wq: ctx.quantizer(Site::Weight, "weight", c_out)?,
        })
    }

    /// # Shapes
    /// - x: `[N, in]`; output: `[N, out]`.
    pub fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        self.forward_q(x, None)
    }

    /// [`forward`](Self::forward) of an input on the grid `input`: with a quantized weight the
    /// bias is fake-quantized to int32 at the derived scale `s_in·s_w,c`.
    pub fn forward_q(&self, x: Tensor<2>, input: Option<&Grid>) -> Tensor<2> {
        let c = self.bias.val().dims()[0];
        let (w, bias) = match (&self.wq, input) {
            (Some(q), Some(ig)) => {
                let (w, g) = q.forward_with_grid(self.weight.val());
                let unit = Tensor::<1>::ones([c], &w.device())
                    .mul(g.step.detach())
                    .mul(ig.step.clone().detach());
                (w, quantize_bias(self.bias.val(), unit, q.spec().round()))
            }
            (Some(q), None) => (q.forward(self.weight.val()), self.bias.val()),
            (None, _) => (self.weight.val(), self.bias.val()),
        };
        x.matmul(w.transpose()).add(bias.reshape([1, c]))
    }
}

/// The supernet's weights (the alphas live in [`Alphas`]).
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
    /// Quantizer of the pooled features (`gap.act`).
    pub gap_act: Option<FakeQuantizer>,
    /// Classifier (`classifier`).
    pub classifier: QLinear,
}

/// Whether cell `i` of `layers` reduces: at 1/3 and 2/3 depth (pt.darts, DARTS).
pub fn is_reduction(i: usize, layers: usize) -> bool {
    i == layers / 3 || i == 2 * layers / 3
}

impl SearchNetwork {
    /// A search network.
    pub fn new(s: &NetShape, cfg: &QuantConfig, device: &Device) -> Result<Self, SpecError> {
        let ctx = |path: &str, op: &'static str| Ctx { cfg, op, path: path.to_string(), device };
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
            cells.push(SearchCell::new(shape, &s.primitives, cfg, &format!("cells.{i}"), device)?);
            reduction_prev = reduction;
            (c_pp, c_p) = (c_p, c * s.nodes);
        }
        Ok(SearchNetwork {
            stem,
            stem_bn,
            stem_act,
            cells,
            gap_act: ctx("gap", "classifier").quantizer(Site::Act, "act", 1)?,
            classifier: QLinear::new(c_p, s.classes, &ctx("classifier", "classifier"))?,
        })
    }

    /// Logits for a batch, with the softmax of each cell type's α given per edge.
    ///
    /// # Shapes
    /// - x: `[N, c_in, H, W]`; w_normal, w_reduce: `[edges, K]`; output: `[N, classes]`.
    pub fn forward(&self, x: Tensor<4>, w_normal: Tensor<2>, w_reduce: Tensor<2>) -> Tensor<2> {
        let rows = |w: Tensor<2>| -> Vec<Tensor<1>> {
            let [e, k] = w.dims();
            (0..e).map(|i| w.clone().slice(i..i + 1).reshape([k])).collect()
        };
        let (normal, reduce) = (rows(w_normal), rows(w_reduce));
        let s = quantize_opt(&self.stem_act, self.stem_bn.forward(self.stem.forward(x)));
        let (mut s0, mut s1): (QTensor, QTensor) = (s.clone(), s);
        for cell in &self.cells {
            let w = if cell.reduction { &reduce } else { &normal };
            let out = cell.forward(s0, s1.clone(), w);
            (s0, s1) = (s1, out);
        }
        let [n, c, _, _] = s1.dims();
        let pooled = s1.value.mean_dim(3).mean_dim(2).reshape([n, c]);
        let pooled = match &self.gap_act {
            Some(q) => q.forward(pooled),
            None => pooled,
        };
        self.classifier.forward(pooled)
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
        q.extend(self.gap_act.iter());
        q.extend(self.classifier.wq.iter());
        q
    }
}

/// The architecture parameters: one row of α per edge and op, for each cell type.
#[derive(Module, Debug)]
pub struct Alphas {
    /// α of the normal cell, `[edges, K]`.
    pub normal: Param<Tensor<2>>,
    /// α of the reduction cell, `[edges, K]`.
    pub reduce: Param<Tensor<2>>,
}

impl Alphas {
    /// `1e-3 · N(0, 1)`, as pt.darts and DARTS initialise them.
    pub fn new(nodes: usize, ops: usize, device: &Device) -> Self {
        let init = || {
            Param::from_tensor(
                Tensor::<2>::random(
                    [edge_count(nodes), ops],
                    Distribution::Normal(0.0, 1.0),
                    device,
                )
                .mul_scalar(1e-3),
            )
        };
        Alphas { normal: init(), reduce: init() }
    }

    /// Softmax over the ops of each edge: `(normal, reduce)`.
    pub fn weights(&self) -> (Tensor<2>, Tensor<2>) {
        (softmax(self.normal.val(), 1), softmax(self.reduce.val(), 1))
    }

    /// Raw α as host rows: `(normal, reduce)`.
    pub fn to_rows(&self) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
        let rows = |t: Tensor<2>| {
            let [_, k] = t.dims();
            let v: Vec<f32> =
                t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap_or_default();
            v.chunks(k).map(<[f32]>::to_vec).collect()
        };
        (rows(self.normal.val()), rows(self.reduce.val()))
    }
}
