//! The pieces both DARTS networks are built from, the search supernet and the evaluation
//! network of a genotype (pt.darts `SearchCNN` and `AugmentCNN`): the cells' input
//! preprocessing, the quantized classifier and the reduction schedule.

use burn::module::{Module, Param};
use burn::tensor::{Device, Distribution, Tensor};
use qdarts_kernels::devices::random;

use crate::candidates::{
    ConvShape, Ctx, Pass, QFactorizedReduce, QStdConv, QTensor, QuantSites, quantize_bias,
};
use crate::qconfig::{QuantConfig, Site};
use crate::quant::{FakeQuantizer, Grid, QuantPass, SpecError};

/// Whether cell `i` of `layers` reduces: at 1/3 and 2/3 depth (pt.darts, DARTS).
pub fn is_reduction(i: usize, layers: usize) -> bool {
    i == layers / 3 || i == 2 * layers / 3
}

/// The first preprocessing op of a cell.
// Built once per cell; boxing would only add an indirection to every forward.
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum Preprocess {
    /// After a reduction cell: halve the resolution.
    Reduce(QFactorizedReduce),
    /// Otherwise: ReLU – Conv1×1 – BN.
    Conv(QStdConv),
}

impl Preprocess {
    /// The two input preprocessings of a cell at `path` (pt.darts): the first input through a
    /// FactorizedReduce after a reduction cell, else ReLU-conv1×1-BN; the second through
    /// ReLU-conv1×1-BN. `[c_pp, c_p, c]`: the inputs' channels and the cell's.
    pub fn pair(
        reduction_prev: bool,
        [c_pp, c_p, c]: [usize; 3],
        affine: bool,
        cfg: &QuantConfig,
        path: &str,
        device: &Device,
    ) -> Result<(Preprocess, QStdConv), SpecError> {
        let ctx = |name: &str| Ctx::new(cfg, "preprocess", format!("{path}.{name}"), device);
        let p0 = if reduction_prev {
            Preprocess::Reduce(QFactorizedReduce::new(c_pp, c, affine, &ctx("preproc0"))?)
        } else {
            let shape = ConvShape::square(c_pp, c, 1, 1, 0);
            Preprocess::Conv(QStdConv::new(shape, affine, &ctx("preproc0"))?)
        };
        let p1 = QStdConv::new(ConvShape::square(c_p, c, 1, 1, 0), affine, &ctx("preproc1"))?;
        Ok((p0, p1))
    }

    /// # Shapes
    /// - x: `[N, C_pp, H, W]`; output `[N, C, H/r, W/r]` (r = 2 after a reduction cell).
    pub fn forward(&self, x: QTensor) -> QTensor {
        self.forward_in(x, QuantPass::OFF)
    }

    /// [`forward`](Self::forward) in the quantizer pass `qp`.
    pub fn forward_in(&self, x: QTensor, qp: QuantPass) -> QTensor {
        match self {
            Preprocess::Reduce(op) => op.forward_in(x, Pass::quantizing(qp)),
            Preprocess::Conv(op) => op.forward_in(x, qp),
        }
    }
}

impl QuantSites for Preprocess {
    fn quantizers(&self) -> Vec<&FakeQuantizer> {
        match self {
            Preprocess::Reduce(op) => op.quantizers(),
            Preprocess::Conv(op) => op.quantizers(),
        }
    }
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
        // Drawn now (not lazily at the first forward), in construction order, on the host
        // (the same numbers on every backend).
        let u = Distribution::Uniform(-b, b);
        Ok(QLinear {
            weight: Param::from_tensor(random([c_out, c_in], u, ctx.device)),
            bias: Param::from_tensor(random([c_out], u, ctx.device)),
            wq: ctx.quantizer(Site::Weight, "weight", c_out)?,
        })
    }

    /// # Shapes
    /// - x: `[N, in]`; output: `[N, out]`.
    pub fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        self.forward_q(x, None, QuantPass::OFF)
    }

    /// [`forward`](Self::forward) of an input on the grid `input`: with a quantized weight the
    /// bias is fake-quantized to int32 at the derived scale `s_in·s_w,c`. `qp`: the weight
    /// quantizer's pass.
    pub fn forward_q(&self, x: Tensor<2>, input: Option<&Grid>, qp: QuantPass) -> Tensor<2> {
        let c = self.bias.val().dims()[0];
        let (w, bias) = match (&self.wq, input) {
            (Some(q), Some(ig)) => {
                let (w, g) = q.forward_in(self.weight.val(), qp);
                let unit = Tensor::<1>::ones([c], &w.device())
                    .mul(g.step.detach())
                    .mul(ig.step.clone().detach());
                (w, quantize_bias(self.bias.val(), unit, q.spec().round()))
            }
            (Some(q), None) => (q.forward_in(self.weight.val(), qp).0, self.bias.val()),
            (None, _) => (self.weight.val(), self.bias.val()),
        };
        x.matmul(w.transpose()).add(bias.reshape([1, c]))
    }
}
