//! `QSepConv`: QDilConv(stride s, dilation 1) – QDilConv(stride 1, dilation 1), i.e.
//! (ReLU – depthwise conv – 1×1 conv – BN) twice (pt.darts `SepConv`).

use burn::module::Module;

use super::common::{Ctx, Pass, QTensor, QuantSites};
use super::conv::{ConvChain, QConv};
use super::dil_conv::{DilShape, QDilConv};
use crate::quant::{FakeQuantizer, SpecError};

/// Two stacked separable convolutions.
#[derive(Module, Debug)]
pub struct QSepConv {
    /// First, `c_in → c_in`, strided (`<path>.op1`).
    pub op1: QDilConv,
    /// Second, `c_in → c_out` (`<path>.op2`).
    pub op2: QDilConv,
}

impl QSepConv {
    /// `c_in → c_out`, kernel `k`, stride, padding `k/2`.
    pub fn new(
        c_in: usize,
        c_out: usize,
        k: usize,
        stride: usize,
        affine: bool,
        ctx: &Ctx,
    ) -> Result<Self, SpecError> {
        let padding = k / 2;
        let first = DilShape { c_in, c_out: c_in, k, stride, padding, dilation: 1 };
        let second = DilShape { c_in, c_out, k, stride: 1, padding, dilation: 1 };
        Ok(QSepConv {
            op1: QDilConv::new(first, affine, &ctx.child("op1"))?,
            op2: QDilConv::new(second, affine, &ctx.child("op2"))?,
        })
    }

    /// # Shapes
    /// - x: `[N, c_in, H, W]`; output: `[N, c_out, H/s, W/s]`.
    pub fn forward(&self, x: QTensor) -> QTensor {
        self.forward_in(x, Pass::default())
    }

    /// [`forward`](Self::forward) in the pass `pass` (held rounding, the candidate widths of a
    /// bit-width search).
    pub fn forward_in(&self, x: QTensor, pass: Pass) -> QTensor {
        self.forward_relued(x.relu(), pass)
    }

    /// [`forward_in`](Self::forward_in) from the ReLU of its input ([`QTensor::relu`]).
    pub fn forward_relued(&self, x: QTensor, pass: Pass) -> QTensor {
        self.op2.forward_in(self.op1.forward_relued(x, pass), pass)
    }
}

impl ConvChain for QSepConv {
    fn chain(&self) -> Vec<&QConv> {
        let mut c = self.op1.chain();
        c.extend(self.op2.chain());
        c
    }
}

impl QuantSites for QSepConv {
    fn quantizers(&self) -> Vec<&FakeQuantizer> {
        let mut q = self.op1.quantizers();
        q.extend(self.op2.quantizers());
        q
    }
}
