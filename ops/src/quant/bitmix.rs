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

    /// The mixes of `sites` (alike: the same widths) as one: at each width the stacked
    /// quantizer of the sites' ([`FakeQuantizer::stacked`], a row per site, in order), under
    /// `path` with the width's suffix.
    ///
    /// # Errors
    /// If `sites` is empty, their widths differ, or their quantizers do not stack.
    pub fn stacked(sites: &[&BitMix], path: &str) -> Result<Self, SpecError> {
        let first = sites.first().ok_or_else(|| SpecError::Stacked(format!("{path}: no sites")))?;
        if sites.iter().any(|m| m.bits != first.bits) {
            return Err(SpecError::Stacked(format!("{path}: the sites' bit widths differ")));
        }
        let quantizers = (0..first.bits.len())
            .map(|i| {
                let tag = if first.quantizers[i].role() == TensorRole::Weight { "w" } else { "a" };
                let at: Vec<&FakeQuantizer> = sites.iter().map(|m| &m.quantizers[i]).collect();
                FakeQuantizer::stacked(&at, format!("{path}.{tag}{}", first.bits[i]))
            })
            .collect::<Result<_, _>>()?;
        Ok(BitMix { quantizers, bits: first.bits.clone() })
    }

    /// Row `r` of a stacked mix ([`stacked`](Self::stacked)) into `site`, one of the mixes it
    /// stacks (or one like it): each width's observer state.
    pub fn row_into(&self, r: usize, site: &BitMix) {
        for (all, to) in self.quantizers.iter().zip(&site.quantizers) {
            all.row_into(r, to);
        }
    }

    /// A stacked mix's [`forward`](Self::forward): `Σ_i probs[i][r] · Q_{b_i}(x)` with each
    /// row `r`'s own probabilities. `view` `[A, R, B]` is `x` seen with its rows on the middle
    /// axis (the quantizers see `x` as it is).
    ///
    /// # Shapes
    /// - x: any, `A·R·B` values; probs: one `[R]` per width, each row's softmax over the
    ///   widths across them; output: as x.
    pub fn forward_rows<const D: usize>(
        &self,
        x: Tensor<D>,
        probs: Vec<Tensor<1>>,
        view: [usize; 3],
        qp: QuantPass,
    ) -> Tensor<D> {
        let ys = self.quantizers.iter().map(|q| q.forward_in(x.clone(), qp).0).collect();
        Self::mix_rows(ys, probs, view)
    }

    /// `Σ_i probs[i][r] · ys[i]` row by row: `ys` a stacked mix's quantized tensors, one per
    /// width, each seen as `view` `[A, R, B]`, in the order [`forward`](Self::forward) adds them.
    ///
    /// # Panics
    /// If `ys` is empty.
    pub fn mix_rows<const D: usize>(
        ys: Vec<Tensor<D>>,
        probs: Vec<Tensor<1>>,
        view: [usize; 3],
    ) -> Tensor<D> {
        let dims = ys.first().expect("a mix has a width").dims();
        let terms =
            ys.into_iter().zip(probs).map(|(y, p)| y.reshape(view).mul(p.reshape([1, view[1], 1])));
        terms.reduce(|acc, y| acc.add(y)).expect("a mix has a width").reshape(dims)
    }

    /// The expected bit width `Σ_i probs_i · b_i`, `[1]`.
    pub fn expected_bits(&self, probs: Tensor<1>) -> Tensor<1> {
        let bits: Vec<f32> = self.bits.iter().map(|&b| b as f32).collect();
        probs.clone().mul(Tensor::<1>::from_floats(bits.as_slice(), &probs.device())).sum()
    }
}
