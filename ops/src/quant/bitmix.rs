//! EdMIPS' composite quantization (Cai & Vasconcelos, "Rethinking Differentiable Search for
//! Mixed-Precision Neural Networks", CVPR 2020): one tensor fake-quantized at each candidate
//! bit width, the results mixed by the softmax of that tensor's bit-width parameters.
//!
//! For weights this is EdMIPS' composite convolution: a convolution is linear in its weights,
//! so mixing the quantized weights and running one convolution equals the weighted sum of the
//! convolutions of each quantized weight, at the cost of one. For activations the quantized
//! activations are mixed. The expected bit width `Σ_i p_i·b_i` is what a BitOPs or size cost
//! charges ([`crate::cost`]).

use burn::module::Module;
use burn::tensor::{Device, Tensor};

use super::SpecError;
use super::pass::QuantPass;
use super::quantizer::FakeQuantizer;
use super::spec::QuantSpec;
use super::stats::TensorRole;

/// One quantizer per candidate bit width, sharing the base spec's observer, granularity,
/// signedness and rounding.
#[derive(Module, Debug)]
pub struct BitMix {
    /// The quantizers, in the order of `bits` (paths `<path>.w<b>`/`<path>.a<b>`).
    pub quantizers: Vec<FakeQuantizer>,
    /// The candidate bit widths.
    pub bits: Vec<usize>,
}

impl BitMix {
    /// Quantizers at each of `bits` (2 to 8, no repeats) for a tensor of `channels` channels.
    pub fn new(
        base: QuantSpec,
        bits: &[u32],
        path: &str,
        role: TensorRole,
        channels: usize,
        device: &Device,
    ) -> Result<Self, SpecError> {
        let mut seen = bits.to_vec();
        seen.sort_unstable();
        seen.dedup();
        if bits.is_empty() || seen.len() != bits.len() {
            return Err(SpecError::BitChoices(format!(
                "{path}: bit widths {bits:?}: give one or more, each once"
            )));
        }
        let tag = if role == TensorRole::Weight { "w" } else { "a" };
        let quantizers = bits
            .iter()
            .map(|&b| {
                let spec = base.at_bits(b)?;
                FakeQuantizer::new(spec, format!("{path}.{tag}{b}"), role, channels, device)
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(BitMix { quantizers, bits: bits.iter().map(|&b| b as usize).collect() })
    }

    /// `Σ_i probs_i · Q_{b_i}(x)`, each quantizer in the pass `qp`.
    ///
    /// # Shapes
    /// - x: any; probs: `[B]`, one per bit width (a softmax); output: as x.
    pub fn forward<const D: usize>(
        &self,
        x: Tensor<D>,
        probs: Tensor<1>,
        qp: QuantPass,
    ) -> Tensor<D> {
        let mut out: Option<Tensor<D>> = None;
        for (i, q) in self.quantizers.iter().enumerate() {
            let p = probs.clone().slice(i..i + 1).reshape([1usize; D]);
            let y = q.forward_in(x.clone(), qp).0.mul(p);
            out = Some(match out {
                Some(acc) => acc.add(y),
                None => y,
            });
        }
        out.unwrap_or(x)
    }

    /// The expected bit width `Σ_i probs_i · b_i`, `[1]`.
    pub fn expected_bits(&self, probs: Tensor<1>) -> Tensor<1> {
        let bits: Vec<f32> = self.bits.iter().map(|&b| b as f32).collect();
        probs.clone().mul(Tensor::<1>::from_floats(bits.as_slice(), &probs.device())).sum()
    }
}
