//! `QMixedOp`: the DARTS mixed op, `Σ_i w_i · op_i(x)` with `w = softmax(α)` given by the
//! search controller (which owns α).
//!
//! The mixing weights are fake-quantized on the fixed `[0, 1]` grid (8-bit by default) and the
//! sum is requantized to the mixed op's output grid, which is what the integer form computes:
//! `q3 = Z3 + Σ_i (Sw·S_i/S3)(qw_i − Zw)(q_i − Z_i)`.
//!
//! Partial channels (PC-DARTS, Xu et al. 2020): with `K > 1` the candidates see only the first
//! `C/K` channels; the other channels bypass the edge (max-pooled 2×2 on a reduction edge), are
//! concatenated after the weighted sum, and the result is channel-shuffled with `K` groups so
//! that the next edge samples other channels. Activation memory and compute of the edge fall by
//! about `K`. The output quantizer requantizes the whole concatenation onto one grid.

use burn::module::Module;
use burn::tensor::ops::MaxPoolOptions;
use burn::tensor::{Device, Tensor};
use qdarts_genotypes::Primitive;

use super::CandidateOp;
use super::common::{BitProbs, Ctx, OpBits, Pass, QTensor, QuantSites, quantize_opt, sites};
use crate::qconfig::{QuantConfig, Site};
use crate::quant::hold::{max_pool2d_held, narrow_channels};
use crate::quant::{FakeQuantizer, SpecError};
use qdarts_kernels::cat::cat;

/// A weighted sum of candidate ops.
#[derive(Module, Debug)]
pub struct QMixedOp {
    /// The candidates, in the order of the primitives.
    pub ops: Vec<CandidateOp>,
    /// Mixing-weight quantizer (`<path>.mix`).
    pub mix: Option<FakeQuantizer>,
    /// Output quantizer (`<path>.act`).
    pub act: Option<FakeQuantizer>,
    /// PC-DARTS `K`: the candidates see `C/K` channels (1: all, plain DARTS).
    pub partial: usize,
    /// Stride of the edge.
    pub stride: usize,
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
        Self::partial(primitives, c, stride, 1, cfg, path, device)
    }

    /// A PC-DARTS mixed op whose candidates see `c / k` of the `c` channels.
    ///
    /// # Errors
    /// If `k` is 0 or does not divide `c`.
    pub fn partial(
        primitives: &[Primitive],
        c: usize,
        stride: usize,
        k: usize,
        cfg: &QuantConfig,
        path: &str,
        device: &Device,
    ) -> Result<Self, SpecError> {
        Self::with_bits(primitives, c, stride, k, cfg, path, device, OpBits::Config)
    }

    /// [`partial`](Self::partial) with the candidates' weight and activation widths given
    /// (a bit-width search: [`OpBits::Search`]; ops without convolutions keep the config's).
    #[allow(clippy::too_many_arguments)]
    pub fn with_bits(
        primitives: &[Primitive],
        c: usize,
        stride: usize,
        k: usize,
        cfg: &QuantConfig,
        path: &str,
        device: &Device,
        bits: OpBits,
    ) -> Result<Self, SpecError> {
        if k == 0 || !c.is_multiple_of(k) {
            return Err(SpecError::PartialChannels { k, channels: c });
        }
        let ops = primitives
            .iter()
            .map(|p| {
                let path = format!("{path}.{p}");
                CandidateOp::with_bits(*p, c / k, stride, false, cfg, &path, device, bits)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let ctx = Ctx::new(cfg, "mixed", path, device);
        Ok(QMixedOp {
            ops,
            mix: ctx.quantizer(Site::Mix, "mix", 1)?,
            act: ctx.quantizer(Site::Act, "act", 1)?,
            partial: k,
            stride,
        })
    }

    /// # Shapes
    /// - x: `[N, C, H, W]`; weights: `[K]` (one per candidate, e.g. softmax(α));
    ///   output: `[N, C, H/s, W/s]`.
    pub fn forward(&self, x: QTensor, weights: Tensor<1>) -> QTensor {
        self.forward_in(x, weights, Pass::default())
    }

    /// [`forward`](Self::forward) in the pass `pass`: its held rounding, and under a bit-width
    /// search each candidate mixing its widths.
    ///
    /// # Shapes
    /// - the pass's widths: `weight` `[K, Bw]`, `act` `[K, Ba]`, one softmax row per candidate.
    pub fn forward_in(&self, x: QTensor, weights: Tensor<1>, pass: Pass<EdgeBits>) -> QTensor {
        if self.partial <= 1 {
            return match self.weighted_sum(x.clone(), weights, pass) {
                Some(s) => quantize_opt(&self.act, s, pass.quant),
                None => x,
            };
        }
        let [n, c, _, _] = x.dims();
        let part = c / self.partial;
        let dims = x.dims();
        let head = QTensor {
            value: x.value.clone().slice([0..n, 0..part]),
            grid: narrow_channels(x.grid.as_ref(), dims, 0, part),
        };
        let mut rest = x.value.slice([0..n, part..c]);
        if self.stride > 1 {
            // Max pooling picks input values: the bypass stays on the input grid.
            let opts = MaxPoolOptions::new([2, 2]).with_stride([2, 2]);
            let grid = narrow_channels(x.grid.as_ref(), dims, part, c - part);
            rest = max_pool2d_held(rest, grid.as_ref(), opts);
        }
        let cat = match self.weighted_sum(head, weights, pass) {
            Some(y) => cat(vec![y, rest], 1),
            None => return QTensor::float(rest),
        };
        quantize_opt(&self.act, channel_shuffle(cat, self.partial), pass.quant)
    }

    /// `Σ_i w_i · op_i(x)` with the mixing weights fake-quantized (`None` without candidates);
    /// the candidates that start with a ReLU share one ([`CandidateOp::forward_shared`]).
    fn weighted_sum(
        &self,
        x: QTensor,
        weights: Tensor<1>,
        pass: Pass<EdgeBits>,
    ) -> Option<Tensor<4>> {
        let w = match &self.mix {
            Some(q) => q.forward_in(weights, pass.quant).0,
            None => weights,
        };
        let mut sum: Option<Tensor<4>> = None;
        let mut relued = None;
        for (i, op) in self.ops.iter().enumerate() {
            let probs = pass.bits.map(|b| b.op(i));
            let y = op.forward_shared(&x, &mut relued, pass.with_bits(probs.as_ref())).value;
            // `sum + y · w[i]`: one launch on the CubeCL backends, no slice of `w`.
            sum = Some(qdarts_kernels::scale::add_scaled(sum, y, w.clone(), i));
        }
        sum
    }
}

/// The softmaxes over the candidate widths of every op on an edge.
#[derive(Debug, Clone)]
pub struct EdgeBits {
    /// Over the weight widths, `[K, Bw]`.
    pub weight: Tensor<2>,
    /// Over the activation widths, `[K, Ba]`.
    pub act: Tensor<2>,
}

impl EdgeBits {
    /// Op `i`'s rows.
    pub fn op(&self, i: usize) -> BitProbs {
        let row = |t: &Tensor<2>| {
            let [_, b] = t.dims();
            t.clone().slice([i..i + 1, 0..b]).reshape([b])
        };
        BitProbs { weight: row(&self.weight), act: row(&self.act) }
    }
}

/// PC-DARTS' channel shuffle: `[N, C, H, W]` viewed as `[N, g, C/g, H, W]`, the two channel
/// axes swapped, and flattened back.
pub fn channel_shuffle(x: Tensor<4>, groups: usize) -> Tensor<4> {
    let [n, c, h, w] = x.dims();
    x.reshape([n, groups, c / groups, h * w]).swap_dims(1, 2).reshape([n, c, h, w])
}

impl QuantSites for QMixedOp {
    fn quantizers(&self) -> Vec<&FakeQuantizer> {
        let mut q: Vec<&FakeQuantizer> = self.ops.iter().flat_map(|o| o.quantizers()).collect();
        q.extend(sites([&self.mix, &self.act]));
        q
    }
}
