//! `QFacConv`: ReLU – Conv(k×1) – Conv(1×k) – BN, fake-quantized (pt.darts `FacConv`).
//!
//! pt.darts pads `(p, p)` on both factor convs and strides both, so at stride 1 its output grows
//! by `2p` in each axis. Here the k×1 conv pads and strides only the height and the 1×k conv only
//! the width, so the output is `H/s × W/s` as for every other op.

use burn::module::Module;

use super::bn::QBatchNorm;
use super::common::{Ctx, Pass, QTensor, QuantSites, mixes, quantize_site, sites};
use super::conv::{ConvChain, ConvShape, QConv};
use crate::qconfig::Site;
use crate::quant::{BitMix, FakeQuantizer, SpecError};

/// ReLU – Conv(k×1) – Conv(1×k) – BN.
#[derive(Module, Debug)]
pub struct QFacConv {
    /// k×1 conv, `c_in → c_in` (`<path>.conv1`).
    pub conv1: QConv,
    /// Quantizer between the two convs (`<path>.conv1.act`).
    pub mid: Option<FakeQuantizer>,
    /// Under a bit-width search, its quantizers per width.
    pub mid_mix: Option<BitMix>,
    /// 1×k conv, `c_in → c_out` (`<path>.conv2`).
    pub conv2: QConv,
    /// BatchNorm (`<path>.bn`).
    pub bn: QBatchNorm,
    /// Output quantizer (`<path>.act`).
    pub act: Option<FakeQuantizer>,
    /// Under a bit-width search, its quantizers per width.
    pub act_mix: Option<BitMix>,
}

impl QFacConv {
    /// `c_in → c_out`, kernel length `k`, stride `s`, padding `p`.
    pub fn new(
        c_in: usize,
        c_out: usize,
        k: usize,
        stride: usize,
        padding: usize,
        affine: bool,
        ctx: &Ctx,
    ) -> Result<Self, SpecError> {
        let c1 = ConvShape {
            c_in,
            c_out: c_in,
            kernel: [k, 1],
            stride: [stride, 1],
            padding: [padding, 0],
            dilation: 1,
            groups: 1,
        };
        let c2 = ConvShape {
            c_in,
            c_out,
            kernel: [1, k],
            stride: [1, stride],
            padding: [0, padding],
            dilation: 1,
            groups: 1,
        };
        let conv1 = ctx.child("conv1");
        Ok(QFacConv {
            conv1: QConv::new(c1, &conv1)?,
            mid: conv1.quantizer(Site::Act, "act", 1)?,
            mid_mix: conv1.bit_mix(Site::Act, "act", 1)?,
            conv2: QConv::new(c2, &ctx.child("conv2"))?,
            bn: QBatchNorm::new(c_out, affine, &ctx.child("bn"))?,
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
        let y = self.conv1.forward_mixed(x.value, wp);
        let y = quantize_site(&self.mid, &self.mid_mix, y, ap);
        let (y, unit) = self.conv2.forward_unit(y.value, y.grid.as_ref(), wp);
        let y = self.bn.forward_biased(y, unit, pass.quant);
        quantize_site(&self.act, &self.act_mix, y, ap)
    }
}

impl ConvChain for QFacConv {
    fn chain(&self) -> Vec<&QConv> {
        vec![&self.conv1, &self.conv2]
    }
}

impl QuantSites for QFacConv {
    fn quantizers(&self) -> Vec<&FakeQuantizer> {
        let mut q = self.conv1.quantizers();
        q.extend(sites([&self.mid]));
        q.extend(mixes([&self.mid_mix]));
        q.extend(self.conv2.quantizers());
        q.extend(self.bn.quantizers());
        q.extend(sites([&self.act]));
        q.extend(mixes([&self.act_mix]));
        q
    }
}
