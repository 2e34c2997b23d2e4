//! The checks a frozen graph must pass before it runs: every node reads values that exist and
//! have the shape it needs, every grid and multiplier is in range, every tensor has its dtype
//! and shape, and the graph ends on the classifier.

use crate::fixed::FixedMultiplier;
use crate::model::{ActGrid, ConvNode, FrozenModel, ModelError, Node, Shape};
use crate::qdf::{DType, QTensor};

fn bad(i: usize, msg: impl std::fmt::Display) -> ModelError {
    ModelError::Invalid(format!("node {i}: {msg}"))
}

/// Per output channel the number of input channels per group and the output size.
pub(crate) fn conv_out(c: &ConvNode, s: Shape) -> Option<(usize, usize)> {
    let hin = s[1].checked_sub(c.offset)? + 2 * c.padding[0];
    let win = s[2].checked_sub(c.offset)? + 2 * c.padding[1];
    let kh = c.dilation * (c.kernel[0].checked_sub(1)?) + 1;
    let kw = c.dilation * (c.kernel[1].checked_sub(1)?) + 1;
    if hin < kh || win < kw || c.stride[0] == 0 || c.stride[1] == 0 {
        return None;
    }
    Some(((hin - kh) / c.stride[0] + 1, (win - kw) / c.stride[1] + 1))
}

/// A rescale multiplier must be the ratio of the scales it joins (`want`): a multiplier that
/// disagrees with the model's own scales (a damaged or edited file) would run with a wrong
/// rescale and no error. The scales are stored as f32: 1e-5 relative covers their rounding.
fn consistent(m: &FixedMultiplier, want: f64) -> Result<(), String> {
    if !(want.is_finite() && want >= 0.0) {
        return Err(format!("the scales give a rescale of {want}"));
    }
    let got = m.value();
    let tiny = 2f64.powi(-30);
    if (want < tiny && got < tiny) || (got - want).abs() <= 1e-5 * want {
        Ok(())
    } else {
        Err(format!("multiplier {m:?} is {got:e}, but the scales it joins give {want:e}"))
    }
}

impl FrozenModel {
    /// The tensor `name`, checked for dtype and shape.
    fn tensor(&self, name: &str, dtype: DType, dims: &[usize]) -> Result<&QTensor, String> {
        let t = self.tensors.get(name).ok_or_else(|| format!("tensor `{name}` is missing"))?;
        let got: Vec<usize> = t.dims.iter().map(|&d| d as usize).collect();
        if t.dtype != dtype || got != dims {
            return Err(format!(
                "tensor `{name}` is {:?} {got:?}, expected {dtype:?} {dims:?}",
                t.dtype
            ));
        }
        if t.zero_point.iter().any(|&z| z != 0) {
            return Err(format!(
                "tensor `{name}` has a non-zero zero point (weights are symmetric)"
            ));
        }
        Ok(t)
    }

    /// Checks every node against the values it reads and the tensors it names, and returns the
    /// shape of every value. Whatever passes this runs without a panic.
    pub fn validate(&self) -> Result<Vec<Shape>, ModelError> {
        let g = &self.graph;
        let [c0, h0, w0] = g.input_shape;
        if c0 == 0 || h0 == 0 || w0 == 0 || c0 > 64 || h0 > 4096 || w0 > 4096 {
            return Err(ModelError::Invalid(format!(
                "input shape {:?} is out of range",
                g.input_shape
            )));
        }
        if g.mean.len() != c0
            || g.std.len() != c0
            || g.std.iter().any(|s| !(s.is_finite() && *s > 0.0))
        {
            return Err(ModelError::Invalid(
                "mean/std need one positive value per input channel".into(),
            ));
        }
        if g.classes == 0 || g.nodes.is_empty() {
            return Err(ModelError::Invalid("no classes or no nodes".into()));
        }
        let mut shapes: Vec<Shape> = Vec::with_capacity(g.nodes.len());
        for (i, node) in g.nodes.iter().enumerate() {
            let get = |v: usize| -> Result<Shape, ModelError> {
                if v >= i {
                    return Err(bad(
                        i,
                        format!("reads value {v}, which is not computed before it"),
                    ));
                }
                Ok(shapes[v])
            };
            let image = |v: usize| -> Result<Shape, ModelError> {
                let s = get(v)?;
                if s[1] == 0 {
                    return Err(bad(i, format!("value {v} is a vector, not an image")));
                }
                Ok(s)
            };
            let check_grid =
                |gr: &ActGrid| gr.check().map_err(|m| bad(i, format!("output grid: {m}")));
            let check_mult = |m: &FixedMultiplier| {
                if (m.m0 != 0 && m.m0 < 1 << 30) || m.m0 < 0 || m.n < -30 || m.n > 62 {
                    return Err(bad(i, format!("multiplier {m:?} out of range")));
                }
                Ok(())
            };
            let shape = match node {
                Node::Input { grid } => {
                    if i != 0 {
                        return Err(bad(i, "only node 0 may be the input"));
                    }
                    check_grid(grid)?;
                    g.input_shape
                }
                _ if i == 0 => return Err(bad(0, "node 0 must be the input")),
                Node::Conv(c) => {
                    let s = image(c.input)?;
                    check_grid(&c.out)?;
                    let co = c.multipliers.len();
                    if c.groups == 0 || s[0] % c.groups != 0 || co % c.groups != 0 || co == 0 {
                        return Err(bad(
                            i,
                            format!(
                                "{} input and {co} output channels do not split into {} groups",
                                s[0], c.groups
                            ),
                        ));
                    }
                    if c.kernel[0] > 64
                        || c.kernel[1] > 64
                        || c.dilation > 64
                        || c.padding[0] > 64
                        || c.padding[1] > 64
                    {
                        return Err(bad(i, "kernel, dilation or padding out of range"));
                    }
                    let (oh, ow) = conv_out(c, s)
                        .ok_or_else(|| bad(i, format!("conv does not fit input {s:?}")))?;
                    c.multipliers.iter().try_for_each(check_mult)?;
                    let wd = [co, s[0] / c.groups, c.kernel[0], c.kernel[1]];
                    let w = self
                        .tensor(&format!("{}.weight", c.name), DType::I8, &wd)
                        .map_err(|m| bad(i, m))?;
                    if !(2..=8).contains(&c.weight_bits) {
                        return Err(bad(i, format!("{} weight bits: 2 to 8", c.weight_bits)));
                    }
                    let half = 1i32 << (c.weight_bits - 1);
                    if let Some(v) = w
                        .data
                        .iter()
                        .map(|&b| i32::from(b as i8))
                        .find(|v| !(-half..half).contains(v))
                    {
                        return Err(bad(
                            i,
                            format!("weight {v} does not fit {} bits", c.weight_bits),
                        ));
                    }
                    let bias = self
                        .tensor(&format!("{}.bias", c.name), DType::I32, &[co])
                        .map_err(|m| bad(i, m))?;
                    for (ch, (m, unit)) in c.multipliers.iter().zip(&bias.scale).enumerate() {
                        let want = f64::from(*unit) / f64::from(c.out.scale);
                        consistent(m, want).map_err(|e| bad(i, format!("channel {ch}: {e}")))?;
                    }
                    [co, oh, ow]
                }
                Node::Pool { input, kernel, stride, padding, .. } => {
                    let s = image(*input)?;
                    if *kernel == 0 || *stride == 0 || *kernel > 16 || 2 * padding > *kernel {
                        return Err(bad(i, "pool window out of range"));
                    }
                    let (hp, wp) = (s[1] + 2 * padding, s[2] + 2 * padding);
                    if hp < *kernel || wp < *kernel {
                        return Err(bad(i, format!("pool does not fit input {s:?}")));
                    }
                    [s[0], (hp - kernel) / stride + 1, (wp - kernel) / stride + 1]
                }
                Node::Add { inputs, out } | Node::Concat { inputs, out } => {
                    check_grid(out)?;
                    if inputs.is_empty() {
                        return Err(bad(i, "no operands"));
                    }
                    let first = image(inputs[0].0)?;
                    let mut c = 0;
                    for (v, m) in inputs {
                        let s = image(*v)?;
                        check_mult(m)?;
                        if let Some(gv) = self.grid_of(*v) {
                            let want = f64::from(gv.scale) / f64::from(out.scale);
                            consistent(m, want).map_err(|e| bad(i, format!("operand {v}: {e}")))?;
                        }
                        if s[1..] != first[1..]
                            || (matches!(node, Node::Add { .. }) && s[0] != first[0])
                        {
                            return Err(bad(
                                i,
                                format!("operand shapes {first:?} and {s:?} differ"),
                            ));
                        }
                        c += s[0];
                    }
                    if matches!(node, Node::Add { .. }) { first } else { [c, first[1], first[2]] }
                }
                Node::Zero { input, stride, out } => {
                    check_grid(out)?;
                    let s = image(*input)?;
                    if *stride == 0 {
                        return Err(bad(i, "stride 0"));
                    }
                    [s[0], s[1].div_ceil(*stride), s[2].div_ceil(*stride)]
                }
                Node::GlobalAvgPool { input, multiplier, out } => {
                    check_grid(out)?;
                    check_mult(multiplier)?;
                    let s = image(*input)?;
                    if let Some(gv) = self.grid_of(*input) {
                        let hw = (s[1] * s[2]) as f64;
                        let want = f64::from(gv.scale) / (hw * f64::from(out.scale));
                        consistent(multiplier, want).map_err(|e| bad(i, e))?;
                    }
                    [s[0], 0, 0]
                }
                Node::Linear { name, input, multipliers, logit_scale } => {
                    let s = get(*input)?;
                    if s[1] != 0 {
                        return Err(bad(i, "the classifier reads a vector"));
                    }
                    if multipliers.len() != g.classes
                        || !(logit_scale.is_finite() && *logit_scale > 0.0)
                    {
                        return Err(bad(
                            i,
                            "needs one multiplier per class and a positive logit scale",
                        ));
                    }
                    multipliers.iter().try_for_each(check_mult)?;
                    self.tensor(&format!("{name}.weight"), DType::I8, &[g.classes, s[0]])
                        .map_err(|m| bad(i, m))?;
                    let bias = self
                        .tensor(&format!("{name}.bias"), DType::I32, &[g.classes])
                        .map_err(|m| bad(i, m))?;
                    for (c, (m, unit)) in multipliers.iter().zip(&bias.scale).enumerate() {
                        let want = f64::from(*unit) / f64::from(*logit_scale);
                        consistent(m, want).map_err(|e| bad(i, format!("class {c}: {e}")))?;
                    }
                    [g.classes, 0, 0]
                }
            };
            if shape.iter().product::<usize>().max(shape[0]) > 1 << 28 {
                return Err(bad(i, format!("value shape {shape:?} is too large")));
            }
            shapes.push(shape);
        }
        match g.nodes.last() {
            Some(Node::Linear { .. }) => Ok(shapes),
            _ => Err(ModelError::Invalid("the last node must be the classifier".into())),
        }
    }
}
