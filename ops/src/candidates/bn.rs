//! `QBatchNorm`: BatchNorm2d as DARTS search uses it (no affine parameters by default), with its
//! folded weight fake-quantized per tensor.
//!
//! Burn's `BatchNorm` has no `affine = False`, so this one is ours. In training mode (the
//! module's `training` flag, on until `valid()`) it normalizes with the batch statistics and
//! updates the running statistics on every forward, with PyTorch's update rule
//! (`running = (1 − momentum)·running + momentum·batch`, unbiased batch variance). That includes
//! the architecture step's forward on validation data, exactly as pt.darts' network in train mode
//! does; `valid()` freezes them.
//!
//! Quantization: `y = (x − μ)·w + β` with the folded weight `w = γ/sqrt(σ² + ε)` (γ = 1 without
//! affine) fake-quantized per tensor. Freeze folds `w` and `β − μ·w` into the preceding conv or
//! into a per-channel integer scale and bias.

use burn::module::{Flag, Module, Param};
use burn::tensor::Tensor;

use super::common::{Ctx, QuantSites};
use super::conv::Bias;
use crate::buffer::Buffer;
use crate::quant::QuantPass;
use crate::quant::{FakeQuantizer, SpecError};
use crate::quant::{RoundMode, round_with};
use qdarts_kernels::batch_norm::{
    affine, fold, fold_available, fold_normalize, fold_rounded_available, normalize, rstd, running,
    shift, statistics,
};
use qdarts_kernels::bias::{int32_residual, residual_available};
use qdarts_kernels::cat::cat;

/// PyTorch's BatchNorm2d defaults.
const MOMENTUM: f64 = 0.1;
const EPSILON: f64 = 1e-5;

/// BatchNorm2d with optional affine parameters and a fake-quantized folded weight.
#[derive(Module, Debug)]
pub struct QBatchNorm {
    /// γ, `[C]` (affine only).
    pub gamma: Option<Param<Tensor<1>>>,
    /// β, `[C]` (affine only).
    pub beta: Option<Param<Tensor<1>>>,
    /// Running mean, `[C]`.
    pub running_mean: Buffer<1>,
    /// Running (unbiased) variance, `[C]`.
    pub running_var: Buffer<1>,
    /// Training mode: batch statistics and running-statistics updates.
    pub training: Param<Flag>,
    /// Quantizer of the folded weight (`<path>.weight`; per tensor, or stacked: a row per
    /// BatchNorm of a stack of them).
    pub wq: Option<FakeQuantizer>,
}

impl QBatchNorm {
    /// A BatchNorm over `channels` at `ctx.path`.
    pub fn new(channels: usize, affine: bool, ctx: &Ctx) -> Result<Self, SpecError> {
        let d = ctx.device;
        Ok(QBatchNorm {
            gamma: affine.then(|| Param::from_tensor(Tensor::ones([channels], d))),
            beta: affine.then(|| Param::from_tensor(Tensor::zeros([channels], d))),
            running_mean: Buffer::new(Tensor::zeros([channels], d)),
            running_var: Buffer::new(Tensor::ones([channels], d)),
            training: Param::from_bool(true),
            wq: ctx.bn_quantizer("weight")?,
        })
    }

    /// The statistics to normalize with, `[mean, biased variance]` `[2, C]`: the batch's
    /// (updating the running ones) in training mode, the running ones otherwise.
    fn statistics(&self, x: &Tensor<4>) -> Tensor<2> {
        let [n, _, h, w] = x.dims();
        let (rm, rv) = self.running_on(&x.device());
        if !self.training.is_enabled() {
            // `x` may be a stand-in here (freeze folds with the running statistics alone).
            let c = rm.dims()[0];
            return cat(vec![rm.reshape([1, c]), rv.reshape([1, c])], 0);
        }
        let m = statistics(x.clone());
        let (rm, rv) = running(rm, rv, m.clone(), MOMENTUM, n * h * w);
        self.running_mean.set(rm);
        self.running_var.set(rv);
        m
    }

    /// The running mean and variance on `device`, detached.
    fn running_on(&self, device: &burn::tensor::Device) -> (Tensor<1>, Tensor<1>) {
        let rm = self.running_mean.value().to_device(device).detach();
        let rv = self.running_var.value().to_device(device).detach();
        (rm, rv)
    }

    /// The per-channel weight `γ/sqrt(σ² + ε)` and bias `β − μ·w` that the BN applies,
    /// with the weight fake-quantized.
    pub fn folded(&self, x: &Tensor<4>) -> (Tensor<1>, Tensor<1>) {
        self.folded_held(x, QuantPass::OFF)
    }

    /// [`folded`](Self::folded) in the quantizer pass `qp`.
    fn folded_held(&self, x: &Tensor<4>, qp: QuantPass) -> (Tensor<1>, Tensor<1>) {
        let m = self.statistics(x);
        let mut w = rstd(m.clone(), EPSILON);
        if let Some(g) = &self.gamma {
            w = w.mul(g.val());
        }
        let w = match &self.wq {
            // A stacked quantizer ([`FakeQuantizer::stacked`]) of the multipliers of several
            // BatchNorms side by side: a row each, `[1, rows, C/rows]`.
            Some(q) if !q.rows().is_empty() => {
                let (rows, c) = (q.rows().len(), w.dims()[0]);
                q.forward_in(w.reshape([1, rows, c / rows]), qp).0.reshape([c])
            }
            Some(q) => q.forward_in(w, qp).0,
            None => w,
        };
        let mut b = shift(m, w.clone());
        if let Some(beta) = &self.beta {
            b = b.add(beta.val());
        }
        (w, b)
    }

    /// # Shapes
    /// - x: `[N, C, H, W]`; output: the same.
    pub fn forward(&self, x: Tensor<4>) -> Tensor<4> {
        self.forward_biased(x, None, QuantPass::OFF)
    }

    /// [`forward`](Self::forward) on an integer accumulator whose unit is `bias.unit`: the folded
    /// bias is fake-quantized at the derived scale `unit·w` (int32, straight-through), as the
    /// frozen model stores it, so that freeze changes no value. `qp`: the weight quantizer's
    /// pass.
    pub fn forward_biased(&self, x: Tensor<4>, bias: Option<Bias>, qp: QuantPass) -> Tensor<4> {
        if self.training.is_enabled()
            && self.wq.is_none()
            && self.gamma.is_none()
            && self.beta.is_none()
            && fold_available(&x.device(), x.dtype())
        {
            // The same values as below, folded and normalized in one launch forward
            // (`fold_normalize`) and differentiated as one step (`normalize`): on a GPU, a
            // handful of launches fewer per BatchNorm forward and backward.
            let (rm, rv) = self.running_on(&x.device());
            let rounded = bias.as_ref().filter(|b| fold_rounded_available(&x, &b.factors));
            if bias.is_none() || rounded.is_some() {
                let ties = |b: &Bias| b.round == RoundMode::TiesAwayFromZero;
                let rounded = rounded.map(|b| (b.factors.as_slice(), ties(b)));
                let (folded, y) = fold_normalize(x, [rm, rv], EPSILON, MOMENTUM, rounded);
                self.running_mean.set(folded.mean);
                self.running_var.set(folded.var);
                return y;
            }
            // A unit that `fold_rounded` does not take (more factors) is rounded apart.
            let folded = fold(x.clone(), rm, rv, EPSILON, MOMENTUM);
            self.running_mean.set(folded.mean);
            self.running_var.set(folded.var);
            let (m, w, b) = (folded.statistics, folded.weight, folded.shift);
            let b = match bias {
                Some(bias) => {
                    let c = b.dims()[0];
                    quantize_bias(b, bias.unit(c).mul(w.clone()), bias.round)
                }
                None => b,
            };
            return normalize(x, m, w, b);
        }
        let (w, b) = self.folded_held(&x, qp);
        let b = match bias {
            Some(bias) => {
                let unit = bias.unit(b.dims()[0]);
                quantize_bias(b, unit.mul(w.clone().detach()), bias.round)
            }
            None => b,
        };
        affine(x, w, b)
    }
}

impl QuantSites for QBatchNorm {
    fn quantizers(&self) -> Vec<&FakeQuantizer> {
        self.wq.iter().collect()
    }
}

/// Fake-quantizes a bias to int32 at the per-channel scale `unit` (any sign; a vanishing unit
/// leaves the bias as it is), with a straight-through gradient.
///
/// On the CubeCL backends the rounded bias's difference from `b` is one kernel
/// ([`qdarts_kernels::bias`]), the same arithmetic ([`quantize_bias_with`] chooses).
pub fn quantize_bias(b: Tensor<1>, unit: Tensor<1>, round: RoundMode) -> Tensor<1> {
    quantize_bias_with(b, unit, round, true)
}

/// [`quantize_bias`] with the kernel (`kernel`, where it is available) or the tensor
/// expressions.
pub fn quantize_bias_with(
    b: Tensor<1>,
    unit: Tensor<1>,
    round: RoundMode,
    kernel: bool,
) -> Tensor<1> {
    if kernel && residual_available(&b, &unit) {
        let ties_away = round == RoundMode::TiesAwayFromZero;
        let residual = int32_residual(b.clone().detach(), unit.detach(), ties_away);
        return b.add(residual);
    }
    let step = unit.abs().detach();
    let tiny = step.clone().lower_elem(1e-30);
    let safe = step.clone().mask_fill(tiny.clone(), 1.0);
    let q =
        round_with(b.clone().detach().div(safe.clone()), round).clamp(-2147483648.0, 2147483647.0);
    let bq = q.mul(safe).mask_where(tiny, b.clone().detach());
    b.clone().add(bq.sub(b.detach()))
}
