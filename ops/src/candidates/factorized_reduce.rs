//! `QFactorizedReduce`: ReLU – [Conv1×1/2 on x, Conv1×1/2 on x[:, :, 1:, 1:]] – concat – BN
//! (pt.darts `FactorizedReduce`: halves H and W; `skip_connect` at stride 2).

use burn::module::Module;

use super::bn::QBatchNorm;
use super::common::{Ctx, Pass, QTensor, QuantSites, mixes, quantize_site, sites};
use super::conv::{Bias, ConvShape, QConv};
use crate::qconfig::Site;
use crate::quant::{BitMix, FakeQuantizer, SpecError};
use qdarts_kernels::cat::cat;

/// Two offset strided 1×1 convs, concatenated, then BN.
#[derive(Module, Debug)]
pub struct QFactorizedReduce {
    /// 1×1 stride-2 conv on x (`<path>.conv1`).
    pub conv1: QConv,
    /// 1×1 stride-2 conv on x shifted by one pixel (`<path>.conv2`).
    pub conv2: QConv,
    /// BatchNorm (`<path>.bn`).
    pub bn: QBatchNorm,
    /// Output quantizer (`<path>.act`).
    pub act: Option<FakeQuantizer>,
    /// Under a bit-width search, its quantizers per width.
    pub act_mix: Option<BitMix>,
}

impl QFactorizedReduce {
    /// `c_in → c_out` (`c_out` even).
    pub fn new(c_in: usize, c_out: usize, affine: bool, ctx: &Ctx) -> Result<Self, SpecError> {
        let half = ConvShape::square(c_in, c_out / 2, 1, 2, 0);
        let other = ConvShape { c_out: c_out - c_out / 2, ..half };
        Ok(QFactorizedReduce {
            conv1: QConv::new(half, &ctx.child("conv1"))?,
            conv2: QConv::new(other, &ctx.child("conv2"))?,
            bn: QBatchNorm::new(c_out, affine, &ctx.child("bn"))?,
            act: ctx.quantizer(Site::Act, "act", 1)?,
            act_mix: ctx.bit_mix(Site::Act, "act", 1)?,
        })
    }

    /// # Shapes
    /// - x: `[N, c_in, H, W]`, H and W even; output: `[N, c_out, H/2, W/2]`.
    pub fn forward(&self, x: QTensor) -> QTensor {
        self.forward_in(x, Pass::default())
    }

    /// Multiply-accumulates per image on an `h×w` input, and the output's `(h, w)`.
    pub fn macs(&self, h: usize, w: usize) -> (u64, (usize, usize)) {
        let (m1, out) = self.conv1.macs(h, w);
        let (m2, _) = self.conv2.macs(h - 1, w - 1);
        (m1 + m2, out)
    }

    /// Number of conv weights.
    pub fn params(&self) -> u64 {
        self.conv1.params() + self.conv2.params()
    }

    /// [`forward`](Self::forward) in the pass `pass` (held rounding, the candidate widths of a
    /// bit-width search).
    pub fn forward_in(&self, x: QTensor, pass: Pass) -> QTensor {
        self.forward_relued(x.relu(), pass)
    }

    /// [`forward_in`](Self::forward_in) from the ReLU of its input ([`QTensor::relu`]).
    pub fn forward_relued(&self, x: QTensor, pass: Pass) -> QTensor {
        let (wp, ap) = (pass.weight(), pass.act());
        let grid = x.grid.as_ref();
        let x = x.value;
        let [_, _, h, w] = x.dims();
        let shifted = x.clone().narrow(2, 1, h - 1).narrow(3, 1, w - 1);
        let (y1, u1) = self.conv1.forward_unit(x, grid, wp);
        let (y2, u2) = self.conv2.forward_unit(shifted, grid, wp);
        let unit = match (u1, u2) {
            (Some(a), Some(b)) => {
                let (c1, c2) = (y1.dims()[1], y2.dims()[1]);
                Some(Bias { factors: vec![cat(vec![a.unit(c1), b.unit(c2)], 0)], round: a.round })
            }
            _ => None,
        };
        let y = self.bn.forward_biased(cat(vec![y1, y2], 1), unit, pass.quant);
        quantize_site(&self.act, &self.act_mix, y, ap)
    }
}

impl QuantSites for QFactorizedReduce {
    fn quantizers(&self) -> Vec<&FakeQuantizer> {
        let mut q = self.conv1.quantizers();
        q.extend(self.conv2.quantizers());
        q.extend(self.bn.quantizers());
        q.extend(sites([&self.act]));
        q.extend(mixes([&self.act_mix]));
        q
    }
}
