//! `QZero`: the `none` op (pt.darts `Zero`: `x[:, :, ::s, ::s] * 0`).
//!
//! Its output is exact zeros, and its output quantizer sees only zeros: the observers floor the
//! scale at `MIN_SCALE`, so the scale stays finite (a Python prototype got `scale = inf` here).

use burn::module::Module;
use burn::tensor::Tensor;

use super::common::{Ctx, QTensor, QuantSites, quantize_opt, sites};
use crate::qconfig::Site;
use crate::quant::QuantPass;
use crate::quant::{FakeQuantizer, SpecError};

/// Zeros at the op's output resolution.
#[derive(Module, Debug)]
pub struct QZero {
    /// Output quantizer (`<path>.act`).
    pub act: Option<FakeQuantizer>,
    stride: usize,
}

impl QZero {
    /// The zero op with the given stride.
    pub fn new(stride: usize, ctx: &Ctx) -> Result<Self, SpecError> {
        Ok(QZero { act: ctx.quantizer(Site::Act, "act", 1)?, stride })
    }

    /// The stride.
    pub fn stride(&self) -> usize {
        self.stride
    }

    /// # Shapes
    /// - x: `[N, C, H, W]`; output: zeros `[N, C, ⌈H/s⌉, ⌈W/s⌉]`.
    pub fn forward(&self, x: QTensor) -> QTensor {
        self.forward_in(x, QuantPass::OFF)
    }

    /// [`forward`](Self::forward) in the quantizer pass `qp`.
    pub fn forward_in(&self, x: QTensor, qp: QuantPass) -> QTensor {
        let [n, c, h, w] = x.dims();
        let s = self.stride;
        let zeros = Tensor::<4>::zeros([n, c, h.div_ceil(s), w.div_ceil(s)], &x.value.device());
        quantize_opt(&self.act, zeros, qp)
    }
}

impl QuantSites for QZero {
    fn quantizers(&self) -> Vec<&FakeQuantizer> {
        sites([&self.act])
    }
}
