//! Freeze: a pure function from a trained evaluation network (in inference mode) to an
//! integer-only [`FrozenModel`]. The network is only read: grids come from
//! `FakeQuantizer::current_grid` and `quantize` in inference mode, which update nothing.
//!
//! - BatchNorm folds into the preceding conv: with the conv's per-channel weight step `s_w,c`,
//!   the (fake-quantized) BN weight `γ_c/σ_c` and bias `β_c − μ_c·γ_c/σ_c`, the effective
//!   scale is `e_c = s_in·s_w,c·γ_c/σ_c`; a negative one flips the channel's integer weights.
//! - Biases are int32 at scale `|e_c|`, rescales `M_c = |e_c|/s_out` fixed-point multipliers.
//! - A BN after a pool becomes a 1×1 depthwise conv with weights ±1.
//! - Sums and concats rescale each operand by `s_i/s_out`; the classifier's int32 logits are
//!   on the scale `s_gap·min_c s_w,c`.

mod nodes;
mod ops;

use burn::tensor::{Device, Tensor};
use qdarts_frozen::fixed::{FixedMultiplier, Rounding};
use qdarts_frozen::qdf::QTensor as FTensor;
use qdarts_frozen::{ActGrid, FrozenModel, Graph, Node};
use qdarts_genotypes::Genotype;
use qdarts_ops::quant::{FakeQuantizer, RoundMode};
use thiserror::Error;

use crate::network::EvalNetwork;

/// Why a network cannot be frozen.
#[derive(Debug, Error)]
#[error("freeze: {0}")]
pub struct FreezeError(pub String);

fn err(m: impl Into<String>) -> FreezeError {
    FreezeError(m.into())
}

fn floats<const D: usize>(t: Tensor<D>, what: &str) -> Result<Vec<f32>, FreezeError> {
    t.try_to_vec_as::<f32>().map_err(|e| err(format!("{what}: reading values back: {e:?}")))
}

fn first(v: Vec<f32>, what: &str) -> Result<f32, FreezeError> {
    v.first().copied().ok_or_else(|| err(format!("{what}: an empty grid")))
}

/// What the input image looks like.
#[derive(Debug, Clone)]
pub struct InputSpec {
    /// `[C, H, W]`.
    pub shape: [usize; 3],
    /// Per-channel mean of the normalization.
    pub mean: Vec<f32>,
    /// Per-channel std.
    pub std: Vec<f32>,
    /// Classes.
    pub classes: usize,
}

/// The graph being built: nodes with the grid of each node's output, and the tensors.
struct Freezer<'a> {
    device: &'a Device,
    nodes: Vec<Node>,
    tensors: std::collections::BTreeMap<String, FTensor>,
    grids: Vec<ActGrid>,
    rounding: Option<RoundMode>,
}

/// Rescale `m` as a fixed-point multiplier, naming `what` on failure.
fn fixed(m: f64, what: &str) -> Result<FixedMultiplier, FreezeError> {
    FixedMultiplier::new(m).map_err(|e| err(format!("{what}: {e}")))
}

impl Freezer<'_> {
    /// Rounds as the model's quantizers do (biases are quantized at their derived scale with
    /// the same rounding in the fake-quant forward).
    fn round(&self, x: f64) -> f64 {
        match self.rounding {
            Some(RoundMode::TiesAwayFromZero) => x.round(),
            _ => x.round_ties_even(),
        }
    }

    fn round_of(&mut self, q: &FakeQuantizer) -> Result<(), FreezeError> {
        let r = q.spec().round();
        match self.rounding {
            None => self.rounding = Some(r),
            Some(prev) if prev != r => {
                return Err(err(format!(
                    "{} rounds {r:?} but earlier quantizers {prev:?}: an integer model has one rounding",
                    q.path()
                )));
            }
            _ => {}
        }
        Ok(())
    }

    /// The per-tensor grid of an activation quantizer.
    fn act(&mut self, q: &Option<FakeQuantizer>, what: &str) -> Result<ActGrid, FreezeError> {
        let q = q.as_ref().ok_or_else(|| {
            err(format!("{what} is not quantized: an integer model needs every activation quantized (quant.preset other than float)"))
        })?;
        self.round_of(q)?;
        if q.spec().granularity().axis().is_some() {
            return Err(err(format!("{}: per-channel activations are not supported", q.path())));
        }
        if q.spec().bits() > 8 {
            return Err(err(format!(
                "{}: {}-bit activations; the integer runtime holds 8 bits",
                q.path(),
                q.spec().bits()
            )));
        }
        let g = q.current_grid(self.device);
        let (qmin, qmax) = (g.qmin, g.qmax);
        let scale = first(floats(g.step, q.path())?, q.path())?;
        if !(scale.is_finite() && scale > 0.0) {
            return Err(err(format!(
                "{}: step {scale} (an LSQ quantizer that never saw data, or a broken observer)",
                q.path()
            )));
        }
        let zero_point = first(floats(g.zero_point, q.path())?, q.path())?.round() as i32;
        Ok(ActGrid { scale, zero_point, qmin, qmax })
    }

    fn push(&mut self, node: Node, grid: ActGrid) -> usize {
        self.nodes.push(node);
        self.grids.push(grid);
        self.nodes.len() - 1
    }

    /// Integer weights `[C_out, …]` (flattened) and their per-channel steps.
    fn weights(
        &mut self,
        w: Tensor<4>,
        q: &Option<FakeQuantizer>,
        what: &str,
    ) -> Result<(Vec<i32>, Vec<f32>), FreezeError> {
        let q = q.as_ref().ok_or_else(|| err(format!("{what}: weights are not quantized")))?;
        self.round_of(q)?;
        if !q.spec().is_symmetric() || q.spec().bits() > 8 {
            return Err(err(format!(
                "{}: the integer runtime needs symmetric weights of at most 8 bits",
                q.path()
            )));
        }
        let it = q.quantize(w).map_err(|e| err(format!("{}: {e}", q.path())))?;
        let vals: Vec<i32> =
            it.values.try_to_vec_as::<i32>().map_err(|e| err(format!("{what}: {e:?}")))?;
        let c = it.scale.dims()[0];
        let mut scales = floats(it.scale, q.path())?;
        if let Some(s) = scales.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
            return Err(err(format!("{}: weight step {s} is not a positive number", q.path())));
        }
        if scales.len() != c {
            return Err(err(format!("{}: no scales", q.path())));
        }
        if it.axis.is_none() {
            scales.truncate(1);
        }
        Ok((vals, scales))
    }

    /// Concat or add node over `inputs` onto `out`.
    fn merge(
        &mut self,
        inputs: &[usize],
        out: ActGrid,
        add: bool,
        what: &str,
    ) -> Result<usize, FreezeError> {
        let ins = inputs
            .iter()
            .map(|&v| Ok((v, fixed(f64::from(self.grids[v].scale) / f64::from(out.scale), what)?)))
            .collect::<Result<Vec<_>, FreezeError>>()?;
        let node =
            if add { Node::Add { inputs: ins, out } } else { Node::Concat { inputs: ins, out } };
        Ok(self.push(node, out))
    }
}

/// Freezes a trained evaluation network (call it on `net.valid()`, inference mode).
pub fn freeze(
    net: &EvalNetwork,
    genotype: &Genotype,
    input: &InputSpec,
    device: &Device,
) -> Result<FrozenModel, FreezeError> {
    let mut f = Freezer {
        device,
        nodes: Vec::new(),
        tensors: Default::default(),
        grids: Vec::new(),
        rounding: None,
    };
    let g_in = f.act(&net.input_act, "input")?;
    f.push(Node::Input { grid: g_in }, g_in);
    let stem_out = f.act(&net.stem_act, "stem")?;
    let c = net.stem.weight.val().dims()[0];
    let stem = f.conv("stem.conv", 0, false, &net.stem, Some((&net.stem_bn, 0..c)), 0, stem_out)?;
    let (mut s0, mut s1) = (stem, stem);
    let mut size = [input.shape[1], input.shape[2]];
    for (i, cell) in net.cells.iter().enumerate() {
        let out = f.cell(i, cell, s0, s1)?;
        if cell.reduction {
            size = [size[0] / 2, size[1] / 2];
        }
        (s0, s1) = (s1, out);
    }
    let gap = f.act(&net.gap_act, "gap")?;
    f.classifier(&net.classifier, s1, size[0] * size[1], gap)?;
    let rounding = match f.rounding {
        Some(RoundMode::TiesAwayFromZero) => Rounding::TiesAwayFromZero,
        _ => Rounding::TiesToEven,
    };
    let model = FrozenModel {
        genotype: genotype.clone(),
        graph: Graph {
            input_shape: input.shape,
            mean: input.mean.clone(),
            std: input.std.clone(),
            classes: input.classes,
            rounding,
            nodes: f.nodes,
        },
        tensors: f.tensors,
    };
    model.validate().map_err(|e| err(format!("the frozen graph is inconsistent: {e}")))?;
    Ok(model)
}
