//! `QStdConv`: ReLU – Conv(k×k) – BN, fake-quantized (pt.darts `StdConv`; DARTS `ReLUConvBN`).
//! Also the cell preprocessing (1×1, affine BN in the evaluation network).

use burn::module::Module;

use super::bn::QBatchNorm;
use super::common::{Ctx, Pass, QTensor, QuantSites, quantize_opt, sites};
use super::conv::{ConvShape, QConv};
use crate::qconfig::Site;
use crate::quant::QuantPass;
use crate::quant::{FakeQuantizer, SpecError};

/// ReLU – Conv – BN, output fake-quantized.
#[derive(Module, Debug)]
pub struct QStdConv {
    /// The convolution (`<path>.conv`).
    pub conv: QConv,
    /// The BatchNorm (`<path>.bn`).
    pub bn: QBatchNorm,
    /// Output quantizer (`<path>.act`).
    pub act: Option<FakeQuantizer>,
}

impl QStdConv {
    /// `c_in → c_out`, kernel `k`, stride, padding.
    pub fn new(shape: ConvShape, affine: bool, ctx: &Ctx) -> Result<Self, SpecError> {
        Ok(QStdConv {
            conv: QConv::new(shape, &ctx.child("conv"))?,
            bn: QBatchNorm::new(shape.c_out, affine, &ctx.child("bn"))?,
            act: ctx.quantizer(Site::Act, "act", 1)?,
        })
    }

    /// # Shapes
    /// - x: `[N, c_in, H, W]`; output: `[N, c_out, H/s, W/s]` (with "same" padding).
    pub fn forward(&self, x: QTensor) -> QTensor {
        self.forward_in(x, QuantPass::OFF)
    }

    /// [`forward`](Self::forward) in the quantizer pass `qp`.
    pub fn forward_in(&self, x: QTensor, qp: QuantPass) -> QTensor {
        let (y, unit) = self.conv.forward_unit_relu(x.value, x.grid.as_ref(), Pass::quantizing(qp));
        let y = self.bn.forward_biased(y, unit, qp);
        quantize_opt(&self.act, y, qp)
    }
}

impl QuantSites for QStdConv {
    fn quantizers(&self) -> Vec<&FakeQuantizer> {
        let mut q = self.conv.quantizers();
        q.extend(self.bn.quantizers());
        q.extend(sites([&self.act]));
        q
    }
}
