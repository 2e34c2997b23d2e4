//! `QPoolBN`: Pool(3×3, max or avg with `count_include_pad = False`) – BN (pt.darts `PoolBN`).
//!
//! The pool shares its input's quantization grid: max pooling picks input values, so its output
//! is already on that grid; average pooling is requantized onto it. The BN's folded weight is
//! fake-quantized per tensor, then the output.

use burn::module::Module;
use burn::tensor::Tensor;
use burn::tensor::ops::{AvgPoolOptions, MaxPoolOptions};

use super::bn::QBatchNorm;
use super::common::{Ctx, QTensor, QuantSites, quantize_opt, sites};
use super::conv::Bias;
use crate::qconfig::Site;
use crate::quant::QuantPass;
use crate::quant::fake_quant::broadcast_param;
use crate::quant::hold::max_pool2d_held;
use crate::quant::{FakeQuantizer, RoundMode, SpecError, round_with};
use qdarts_kernels::pool2d::{avg_pool2d, avg_pool2d_rounded};

/// Which pooling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolKind {
    /// Max pooling (padding counts as −∞).
    Max,
    /// Average pooling; padded positions are not counted.
    Avg,
}

/// Pool – BN, output fake-quantized.
#[derive(Module, Debug)]
pub struct QPoolBN {
    /// Max or average.
    #[module(skip)]
    pub kind: PoolKind,
    /// BatchNorm (`<path>.bn`).
    pub bn: QBatchNorm,
    /// Output quantizer (`<path>.act`).
    pub act: Option<FakeQuantizer>,
    stride: usize,
}

impl QPoolBN {
    /// A 3×3 pool with padding 1 and the given stride, then BN over `c` channels.
    pub fn new(
        kind: PoolKind,
        c: usize,
        stride: usize,
        affine: bool,
        ctx: &Ctx,
    ) -> Result<Self, SpecError> {
        Ok(QPoolBN {
            kind,
            bn: QBatchNorm::new(c, affine, &ctx.child("bn"))?,
            act: ctx.quantizer(Site::Act, "act", 1)?,
            stride,
        })
    }

    /// The stride.
    pub fn stride(&self) -> usize {
        self.stride
    }

    /// # Shapes
    /// - x: `[N, C, H, W]`; output: `[N, C, ⌈H/s⌉, ⌈W/s⌉]`.
    pub fn forward(&self, x: QTensor) -> QTensor {
        self.forward_in(x, QuantPass::OFF)
    }

    /// [`forward`](Self::forward) in the quantizer pass `qp`.
    pub fn forward_in(&self, x: QTensor, qp: QuantPass) -> QTensor {
        quantize_opt(&self.act, self.pool_bn(x, qp), qp)
    }

    /// [`forward_in`](Self::forward_in) but for the output quantizer: the pool and the BN
    /// (whose bias is rounded on the input's grid), for a caller that quantizes the output
    /// itself.
    pub fn pool_bn(&self, x: QTensor, qp: QuantPass) -> Tensor<4> {
        let s = [self.stride; 2];
        // The pooled values stay on the input's grid: one accumulator unit is its step.
        let unit = x
            .grid
            .as_ref()
            .filter(|g| !g.is_held())
            .map(|g| Bias { factors: vec![g.step.clone().detach()], round: g.round });
        let pooled = match self.kind {
            PoolKind::Max => {
                let opts = MaxPoolOptions::new([3, 3]).with_stride(s).with_padding([1, 1]);
                max_pool2d_held(x.value, x.grid.as_ref(), opts)
            }
            PoolKind::Avg => {
                let mut opts = AvgPoolOptions::new([3, 3]).with_stride(s).with_padding([1, 1]);
                opts.count_include_pad = false;
                match &x.grid {
                    // On the input's grid: average the integers exactly (sums of small integers
                    // and their halves are exact in f32) and round once, as the integer pool
                    // does; a float average of the dequantized values would break its ties at
                    // random. Straight-through gradient of the float average.
                    Some(grid) if !grid.is_held() => {
                        let ties_away = grid.round == RoundMode::TiesAwayFromZero;
                        // One pass where the pool kernels run, per tensor or per channel.
                        let pass = matches!(grid.axis, None | Some(1))
                            .then(|| {
                                avg_pool2d_rounded(
                                    x.value.clone(),
                                    grid.mult.clone(),
                                    grid.step.clone(),
                                    ties_away,
                                    opts.clone(),
                                )
                            })
                            .flatten();
                        if let Some(y) = pass {
                            return self.bn.forward_biased(y, unit, qp);
                        }
                        let mult = broadcast_param::<4>(grid.mult.clone().detach(), grid.axis);
                        let step = broadcast_param::<4>(grid.step.clone().detach(), grid.axis);
                        let q = round_with(x.value.clone().detach().mul(mult), grid.round);
                        let qa = round_with(avg_pool2d(q, opts.clone()), grid.round);
                        let avg = avg_pool2d(x.value, opts);
                        avg.clone().add(qa.mul(step).sub(avg.detach()))
                    }
                    _ => avg_pool2d(x.value, opts),
                }
            }
        };
        self.bn.forward_biased(pooled, unit, qp)
    }
}

impl QuantSites for QPoolBN {
    fn quantizers(&self) -> Vec<&FakeQuantizer> {
        let mut q = self.bn.quantizers();
        q.extend(sites([&self.act]));
        q
    }
}
