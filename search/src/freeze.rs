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

use burn::tensor::{Device, Tensor};
use qdarts_frozen::fixed::{FixedMultiplier, Rounding};
use qdarts_frozen::qdf::{DType, QTensor as FTensor};
use qdarts_frozen::{ActGrid, ConvNode, FrozenModel, Graph, Node, PoolKind};
use qdarts_genotypes::Genotype;
use qdarts_ops::candidates::{
    CandidateOp, PoolKind as OpPool, QBatchNorm, QConv, QDilConv, QFactorizedReduce, QStdConv,
};
use qdarts_ops::quant::{FakeQuantizer, RoundMode};
use thiserror::Error;

use crate::augment::{EvalCell, EvalNetwork};
use crate::supernet::{Preprocess, QLinear};

/// Why a network cannot be frozen.
#[derive(Debug, Error)]
#[error("freeze: {0}")]
pub struct FreezeError(pub String);

fn err(m: impl Into<String>) -> FreezeError {
    FreezeError(m.into())
}

fn floats<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap_or_default()
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
        let scale = floats(g.step)[0];
        let zero_point = floats(g.zero_point)[0].round() as i32;
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
            it.values.into_data().convert::<i32>().try_to_vec::<i32>().unwrap_or_default();
        let c = it.scale.dims()[0];
        let mut scales = floats(it.scale);
        if scales.len() != c {
            return Err(err(format!("{}: no scales", q.path())));
        }
        if it.axis.is_none() {
            scales.truncate(1);
        }
        Ok((vals, scales))
    }

    /// A conv (and the BN after it, if any) from value `input` onto `out`.
    #[allow(clippy::too_many_arguments)]
    fn conv(
        &mut self,
        name: &str,
        input: usize,
        relu: bool,
        conv: &QConv,
        bn: Option<(&QBatchNorm, std::ops::Range<usize>)>,
        offset: usize,
        out: ActGrid,
    ) -> Result<usize, FreezeError> {
        let w = conv.weight.val();
        let [co, cig, kh, kw] = w.dims();
        let (q, steps) = self.weights(w, &conv.wq, name)?;
        let step = |c: usize| f64::from(if steps.len() == 1 { steps[0] } else { steps[c] });
        let (bw, bb) = match bn {
            Some((bn, range)) => {
                let (w, b) = bn.folded(&Tensor::<4>::zeros([1, 1, 1, 1], self.device));
                let (w, b) = (floats(w), floats(b));
                (w[range.clone()].to_vec(), b[range].to_vec())
            }
            None => (vec![1.0; co], vec![0.0; co]),
        };
        let opts = conv.options();
        self.conv_node(
            name,
            input,
            relu,
            [co, cig, kh, kw],
            q,
            &|c| step(c),
            &bw,
            &bb,
            (
                opts.stride,
                [opts.padding[0].0, opts.padding[1].0],
                opts.dilation[0],
                opts.groups,
                offset,
            ),
            out,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn conv_node(
        &mut self,
        name: &str,
        input: usize,
        relu: bool,
        dims: [usize; 4],
        mut q: Vec<i32>,
        step: &dyn Fn(usize) -> f64,
        bn_w: &[f32],
        bn_b: &[f32],
        (stride, padding, dilation, groups, offset): ([usize; 2], [usize; 2], usize, usize, usize),
        out: ActGrid,
    ) -> Result<usize, FreezeError> {
        let [co, cig, kh, kw] = dims;
        let per = cig * kh * kw;
        let s_in = f64::from(self.grids[input].scale);
        let s_out = f64::from(out.scale);
        let mut bias = Vec::with_capacity(co);
        let mut mults = Vec::with_capacity(co);
        let mut wscale = Vec::with_capacity(co);
        let mut bscale = Vec::with_capacity(co);
        for c in 0..co {
            let e = s_in * step(c) * f64::from(bn_w[c]);
            let b = f64::from(bn_b[c]);
            let row = &mut q[c * per..(c + 1) * per];
            // A channel whose scale vanished outputs its bias alone: zero weights, and a tiny
            // accumulator unit so that the int32 bias still carries it.
            let unit = if e.abs() < s_out * 1e-6 {
                row.fill(0);
                s_out * 2f64.powi(-20)
            } else {
                if e < 0.0 {
                    row.iter_mut().for_each(|v| *v = -*v);
                }
                e.abs()
            };
            let bi = self.round(b / unit);
            if bi.is_nan() || bi.abs() >= 2f64.powi(31) {
                return Err(err(format!(
                    "{name}: channel {c}'s bias {b} does not fit int32 at scale {unit:e}"
                )));
            }
            bias.push(bi as i32);
            mults.push(fixed(unit / s_out, &format!("{name} channel {c}"))?);
            wscale.push((unit / s_in) as f32);
            bscale.push(unit as f32);
        }
        if q.iter().any(|v| !(-128..=127).contains(v)) {
            return Err(err(format!("{name}: weights do not fit int8")));
        }
        self.tensors.insert(
            format!("{name}.weight"),
            FTensor {
                name: format!("{name}.weight"),
                dtype: DType::I8,
                dims: [co, cig, kh, kw].iter().map(|&d| d as u32).collect(),
                axis: Some(0),
                scale: wscale,
                zero_point: vec![0; co],
                data: q.iter().map(|&v| v as i8 as u8).collect(),
            },
        );
        self.tensors.insert(
            format!("{name}.bias"),
            FTensor {
                name: format!("{name}.bias"),
                dtype: DType::I32,
                dims: vec![co as u32],
                axis: Some(0),
                scale: bscale,
                zero_point: vec![0; co],
                data: bias.iter().flat_map(|v| v.to_le_bytes()).collect(),
            },
        );
        let node = Node::Conv(ConvNode {
            name: name.to_string(),
            input,
            relu,
            kernel: [kh, kw],
            stride,
            padding,
            dilation,
            groups,
            offset,
            multipliers: mults,
            out,
        });
        Ok(self.push(node, out))
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

    fn std_conv(&mut self, path: &str, op: &QStdConv, input: usize) -> Result<usize, FreezeError> {
        let out = self.act(&op.act, path)?;
        let c = op.conv.weight.val().dims()[0];
        self.conv(&format!("{path}.conv"), input, true, &op.conv, Some((&op.bn, 0..c)), 0, out)
    }

    fn reduce(
        &mut self,
        path: &str,
        op: &QFactorizedReduce,
        input: usize,
    ) -> Result<usize, FreezeError> {
        let out = self.act(&op.act, path)?;
        let c1 = op.conv1.weight.val().dims()[0];
        let c2 = op.conv2.weight.val().dims()[0];
        let a = self.conv(
            &format!("{path}.conv1"),
            input,
            true,
            &op.conv1,
            Some((&op.bn, 0..c1)),
            0,
            out,
        )?;
        let b = self.conv(
            &format!("{path}.conv2"),
            input,
            true,
            &op.conv2,
            Some((&op.bn, c1..c1 + c2)),
            1,
            out,
        )?;
        self.merge(&[a, b], out, false, path)
    }

    fn dil(&mut self, path: &str, op: &QDilConv, input: usize) -> Result<usize, FreezeError> {
        let mid = self.act(&op.dw_act, &format!("{path}.dw"))?;
        let dw = self.conv(&format!("{path}.dw"), input, true, &op.dw, None, 0, mid)?;
        let out = self.act(&op.act, path)?;
        let c = op.pw.weight.val().dims()[0];
        self.conv(&format!("{path}.pw"), dw, false, &op.pw, Some((&op.bn, 0..c)), 0, out)
    }

    fn op(&mut self, path: &str, op: &CandidateOp, input: usize) -> Result<usize, FreezeError> {
        match op {
            CandidateOp::Identity(_) => Ok(input),
            CandidateOp::Zero(z) => {
                let out = self.act(&z.act, path)?;
                Ok(self.push(Node::Zero { input, stride: z.stride(), out }, out))
            }
            CandidateOp::Pool(p) => {
                let kind = match p.kind {
                    OpPool::Max => PoolKind::Max,
                    OpPool::Avg => PoolKind::Avg,
                };
                let g = self.grids[input];
                let pooled = self
                    .push(Node::Pool { input, kind, kernel: 3, stride: p.stride(), padding: 1 }, g);
                let out = self.act(&p.act, path)?;
                let (w, b) = p.bn.folded(&Tensor::<4>::zeros([1, 1, 1, 1], self.device));
                let (w, b) = (floats(w), floats(b));
                let c = w.len();
                let name = format!("{path}.bn");
                self.conv_node(
                    &name,
                    pooled,
                    false,
                    [c, 1, 1, 1],
                    vec![1; c],
                    &|_| 1.0,
                    &w,
                    &b,
                    ([1, 1], [0, 0], 1, c, 0),
                    out,
                )
            }
            CandidateOp::Reduce(r) => self.reduce(path, r, input),
            CandidateOp::Sep(s) => {
                let a = self.dil(&format!("{path}.op1"), &s.op1, input)?;
                self.dil(&format!("{path}.op2"), &s.op2, a)
            }
            CandidateOp::Dil(d) => self.dil(path, d, input),
            CandidateOp::Fac(f) => {
                let mid = self.act(&f.mid, &format!("{path}.conv1"))?;
                let a = self.conv(&format!("{path}.conv1"), input, true, &f.conv1, None, 0, mid)?;
                let out = self.act(&f.act, path)?;
                let c = f.conv2.weight.val().dims()[0];
                self.conv(&format!("{path}.conv2"), a, false, &f.conv2, Some((&f.bn, 0..c)), 0, out)
            }
        }
    }

    fn cell(
        &mut self,
        i: usize,
        cell: &EvalCell,
        s0: usize,
        s1: usize,
    ) -> Result<usize, FreezeError> {
        let path = format!("cells.{i}");
        let p0 = match &cell.preproc0 {
            Preprocess::Reduce(r) => self.reduce(&format!("{path}.preproc0"), r, s0)?,
            Preprocess::Conv(c) => self.std_conv(&format!("{path}.preproc0"), c, s0)?,
        };
        let p1 = self.std_conv(&format!("{path}.preproc1"), &cell.preproc1, s1)?;
        let mut states = vec![p0, p1];
        let mut k = 0;
        for (n, (add, &count)) in cell.adds.iter().zip(&cell.per_node).enumerate() {
            let mut terms = Vec::new();
            for _ in 0..count {
                let v =
                    self.op(&format!("{path}.ops.{k}"), &cell.ops[k], states[cell.inputs[k]])?;
                terms.push(v);
                k += 1;
            }
            let what = format!("{path}.nodes.{}", n + 2);
            let out = self.act(&add.act, &what)?;
            states.push(self.merge(&terms, out, true, &what)?);
        }
        let out = self.act(&cell.concat.act, &format!("{path}.concat"))?;
        let ins: Vec<usize> = cell.concat_idx.iter().map(|&j| states[j]).collect();
        self.merge(&ins, out, false, &format!("{path}.concat"))
    }

    fn classifier(
        &mut self,
        lin: &QLinear,
        last: usize,
        h_w: usize,
        gap: ActGrid,
    ) -> Result<(), FreezeError> {
        let s_last = f64::from(self.grids[last].scale);
        let m = fixed(s_last / (h_w as f64 * f64::from(gap.scale)), "gap")?;
        let pooled = self.push(Node::GlobalAvgPool { input: last, multiplier: m, out: gap }, gap);
        let w = lin.weight.val();
        let [classes, k] = w.dims();
        let w4 = w.reshape([classes, k, 1, 1]);
        let (q, steps) = self.weights(w4, &lin.wq, "classifier")?;
        let step = |c: usize| f64::from(if steps.len() == 1 { steps[0] } else { steps[c] });
        let s_in = f64::from(gap.scale);
        let logit_scale = (0..classes).map(|c| s_in * step(c)).fold(f64::INFINITY, f64::min);
        let b = floats(lin.bias.val());
        let mut bias = Vec::new();
        let mut mults = Vec::new();
        for (c, &bc) in b.iter().enumerate().take(classes) {
            let unit = s_in * step(c);
            bias.push(
                self.round(f64::from(bc) / unit).clamp(-2f64.powi(31), 2f64.powi(31) - 1.0) as i32
            );
            mults.push(fixed(unit / logit_scale, "classifier")?);
        }
        let t = |name: &str, dtype, dims: Vec<u32>, scale: Vec<f32>, data: Vec<u8>| FTensor {
            name: name.to_string(),
            dtype,
            dims,
            axis: Some(0),
            zero_point: vec![0; scale.len()],
            scale,
            data,
        };
        let wscale: Vec<f32> = (0..classes).map(|c| step(c) as f32).collect();
        let bscale: Vec<f32> = (0..classes).map(|c| (s_in * step(c)) as f32).collect();
        self.tensors.insert(
            "classifier.weight".into(),
            t(
                "classifier.weight",
                DType::I8,
                vec![classes as u32, k as u32],
                wscale,
                q.iter().map(|&v| v as i8 as u8).collect(),
            ),
        );
        self.tensors.insert(
            "classifier.bias".into(),
            t(
                "classifier.bias",
                DType::I32,
                vec![classes as u32],
                bscale,
                bias.iter().flat_map(|v| v.to_le_bytes()).collect(),
            ),
        );
        let node = Node::Linear {
            name: "classifier".into(),
            input: pooled,
            multipliers: mults,
            logit_scale: logit_scale as f32,
        };
        self.push(node, gap);
        Ok(())
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
