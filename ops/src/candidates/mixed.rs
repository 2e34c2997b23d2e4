//! `QMixedOp`: the DARTS mixed op, `Σ_i w_i · op_i(x)` with `w = softmax(α)` given by the
//! search controller (which owns α).
//!
//! The mixing weights are fake-quantized on the fixed `[0, 1]` grid (8-bit by default) and the
//! sum is requantized to the mixed op's output grid, which is what the integer form computes:
//! `q3 = Z3 + Σ_i (Sw·S_i/S3)(qw_i − Zw)(q_i − Z_i)`.

use burn::module::Module;
use burn::tensor::{Device, Tensor};
use qdarts_genotypes::Primitive;

use super::CandidateOp;
use super::common::{Ctx, QTensor, QuantSites, quantize_opt, sites};
use crate::qconfig::{QuantConfig, Site};
use crate::quant::{FakeQuantizer, SpecError};

/// A weighted sum of candidate ops.
#[derive(Module, Debug)]
pub struct QMixedOp {
    /// The candidates, in the order of the primitives.
    pub ops: Vec<CandidateOp>,
    /// Mixing-weight quantizer (`<path>.mix`).
    pub mix: Option<FakeQuantizer>,
    /// Output quantizer (`<path>.act`).
    pub act: Option<FakeQuantizer>,
}

impl QMixedOp {
    /// One candidate per primitive, each at `<path>.<primitive>`.
    pub fn new(
        primitives: &[Primitive],
        c: usize,
        stride: usize,
        cfg: &QuantConfig,
        path: &str,
        device: &Device,
    ) -> Result<Self, SpecError> {
        let ops = primitives
            .iter()
            .map(|p| CandidateOp::new(*p, c, stride, false, cfg, &format!("{path}.{p}"), device))
            .collect::<Result<Vec<_>, _>>()?;
        let ctx = Ctx { cfg, op: "mixed", path: path.to_string(), device };
        Ok(QMixedOp {
            ops,
            mix: ctx.quantizer(Site::Mix, "mix", 1)?,
            act: ctx.quantizer(Site::Act, "act", 1)?,
        })
    }

    /// # Shapes
    /// - x: `[N, C, H, W]`; weights: `[K]` (one per candidate, e.g. softmax(α));
    ///   output: `[N, C, H/s, W/s]`.
    pub fn forward(&self, x: QTensor, weights: Tensor<1>) -> QTensor {
        let w = match &self.mix {
            Some(q) => q.forward(weights),
            None => weights,
        };
        let mut sum: Option<Tensor<4>> = None;
        for (i, op) in self.ops.iter().enumerate() {
            let y = op.forward(x.clone()).value;
            let term = y.mul(w.clone().slice(i..i + 1).reshape([1, 1, 1, 1]));
            sum = Some(match sum {
                Some(s) => s.add(term),
                None => term,
            });
        }
        match sum {
            Some(s) => quantize_opt(&self.act, s),
            None => x,
        }
    }
}

impl QuantSites for QMixedOp {
    fn quantizers(&self) -> Vec<&FakeQuantizer> {
        let mut q: Vec<&FakeQuantizer> = self.ops.iter().flat_map(|o| o.quantizers()).collect();
        q.extend(sites([&self.mix, &self.act]));
        q
    }
}
