//! `QDilConv`: ReLU – depthwise (dilated) Conv(k×k) – Conv(1×1) – BN, fake-quantized
//! (pt.darts `DilConv`; `dil_conv_3x3` has dilation 2, padding 2: a 5×5 receptive field).

use burn::module::Module;

use super::bn::QBatchNorm;
use super::common::{Ctx, Pass, QTensor, QuantSites, mixes, quantize_site, sites};
use super::conv::{ConvChain, ConvShape, QConv};
use crate::qconfig::Site;
use crate::quant::{BitMix, FakeQuantizer, SpecError};

/// ReLU – depthwise dilated conv – pointwise conv – BN.
#[derive(Module, Debug)]
pub struct QDilConv {
    /// Depthwise conv, `c_in` groups (`<path>.dw`).
    pub dw: QConv,
    /// Quantizer of the depthwise output (`<path>.dw.act`).
    pub dw_act: Option<FakeQuantizer>,
    /// Under a bit-width search, its quantizers per width (`<path>.dw.act.a<b>`).
    pub dw_act_mix: Option<BitMix>,
    /// Pointwise conv `c_in → c_out` (`<path>.pw`).
    pub pw: QConv,
    /// BatchNorm (`<path>.bn`).
    pub bn: QBatchNorm,
    /// Output quantizer (`<path>.act`).
    pub act: Option<FakeQuantizer>,
    /// Under a bit-width search, its quantizers per width (`<path>.act.a<b>`).
    pub act_mix: Option<BitMix>,
}

/// The geometry of a dilated depthwise-separable conv.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DilShape {
    /// Input channels.
    pub c_in: usize,
    /// Output channels.
    pub c_out: usize,
    /// Kernel size.
    pub k: usize,
    /// Stride of the depthwise conv.
    pub stride: usize,
    /// Padding of the depthwise conv.
    pub padding: usize,
    /// Dilation of the depthwise conv.
    pub dilation: usize,
}

impl QDilConv {
    /// A dilated separable conv at `ctx.path`.
    pub fn new(s: DilShape, affine: bool, ctx: &Ctx) -> Result<Self, SpecError> {
        let dw = ConvShape {
            c_in: s.c_in,
            c_out: s.c_in,
            kernel: [s.k, s.k],
            stride: [s.stride; 2],
            padding: [s.padding; 2],
            dilation: s.dilation,
            groups: s.c_in,
        };
        let dw_ctx = ctx.child("dw");
        Ok(QDilConv {
            dw: QConv::new(dw, &dw_ctx)?,
            dw_act: dw_ctx.quantizer(Site::Act, "act", 1)?,
            dw_act_mix: dw_ctx.bit_mix(Site::Act, "act", 1)?,
            pw: QConv::new(ConvShape::square(s.c_in, s.c_out, 1, 1, 0), &ctx.child("pw"))?,
            bn: QBatchNorm::new(s.c_out, affine, &ctx.child("bn"))?,
            act: ctx.quantizer(Site::Act, "act", 1)?,
            act_mix: ctx.bit_mix(Site::Act, "act", 1)?,
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
        let (wp, ap) = (pass.weight(), pass.act());
        let y = self.dw.forward_mixed(x.value, wp);
        let y = quantize_site(&self.dw_act, &self.dw_act_mix, y, ap);
        let (y, unit) = self.pw.forward_unit(y.value, y.grid.as_ref(), wp);
        let y = self.bn.forward_biased(y, unit, pass.quant);
        quantize_site(&self.act, &self.act_mix, y, ap)
    }
}

impl ConvChain for QDilConv {
    fn chain(&self) -> Vec<&QConv> {
        vec![&self.dw, &self.pw]
    }
}

impl QuantSites for QDilConv {
    fn quantizers(&self) -> Vec<&FakeQuantizer> {
        let mut q = self.dw.quantizers();
        q.extend(sites([&self.dw_act]));
        q.extend(mixes([&self.dw_act_mix]));
        q.extend(self.pw.quantizers());
        q.extend(self.bn.quantizers());
        q.extend(sites([&self.act]));
        q.extend(mixes([&self.act_mix]));
        q
    }
}
