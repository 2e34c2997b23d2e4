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
            let at = Check { model: self, i, shapes: &shapes };
            let shape = match node {
                Node::Input { grid } => {
                    if i != 0 {
                        return Err(bad(i, "only node 0 may be the input"));
                    }
                    at.grid(grid)?;
                    g.input_shape
                }
                _ if i == 0 => return Err(bad(0, "node 0 must be the input")),
                Node::Conv(c) => at.conv(c)?,
                Node::Pool { input, kernel, stride, padding, .. } => {
                    at.pool(*input, *kernel, *stride, *padding)?
                }
                Node::Add { inputs, out } => at.operands(inputs, out, true)?,
                Node::Concat { inputs, out } => at.operands(inputs, out, false)?,
                Node::Zero { input, stride, out } => {
                    at.grid(out)?;
                    let s = at.image(*input)?;
                    if *stride == 0 {
                        return Err(bad(i, "stride 0"));
                    }
                    [s[0], s[1].div_ceil(*stride), s[2].div_ceil(*stride)]
                }
                Node::GlobalAvgPool { input, multiplier, out } => {
                    at.global_avg_pool(*input, multiplier, out)?
                }
                Node::Linear { name, input, multipliers, logit_scale } => {
                    at.linear(name, *input, multipliers, *logit_scale)?
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

/// The checks of node `i`, given the shapes of the values before it.
struct Check<'a> {
    model: &'a FrozenModel,
    i: usize,
    shapes: &'a [Shape],
}

impl Check<'_> {
    fn bad(&self, msg: impl std::fmt::Display) -> ModelError {
        bad(self.i, msg)
    }

    /// The shape of value `v`, which must be computed before this node.
    fn get(&self, v: usize) -> Result<Shape, ModelError> {
        if v >= self.i {
            return Err(self.bad(format!("reads value {v}, which is not computed before it")));
        }
        Ok(self.shapes[v])
    }

    /// The shape of value `v`, which must be an image.
    fn image(&self, v: usize) -> Result<Shape, ModelError> {
        let s = self.get(v)?;
        if s[1] == 0 {
            return Err(self.bad(format!("value {v} is a vector, not an image")));
        }
        Ok(s)
    }

    fn grid(&self, gr: &ActGrid) -> Result<(), ModelError> {
        gr.check().map_err(|m| self.bad(format!("output grid: {m}")))
    }

    fn mult(&self, m: &FixedMultiplier) -> Result<(), ModelError> {
        if (m.m0 != 0 && m.m0 < 1 << 30) || m.m0 < 0 || m.n < -30 || m.n > 62 {
            return Err(self.bad(format!("multiplier {m:?} out of range")));
        }
        Ok(())
    }

    fn conv(&self, c: &ConvNode) -> Result<Shape, ModelError> {
        let s = self.image(c.input)?;
        self.grid(&c.out)?;
        let co = c.multipliers.len();
        if c.groups == 0
            || !s[0].is_multiple_of(c.groups)
            || !co.is_multiple_of(c.groups)
            || co == 0
        {
            return Err(self.bad(format!(
                "{} input and {co} output channels do not split into {} groups",
                s[0], c.groups
            )));
        }
        if c.kernel[0] > 64
            || c.kernel[1] > 64
            || c.dilation > 64
            || c.padding[0] > 64
            || c.padding[1] > 64
        {
            return Err(self.bad("kernel, dilation or padding out of range"));
        }
        let (oh, ow) =
            conv_out(c, s).ok_or_else(|| self.bad(format!("conv does not fit input {s:?}")))?;
        c.multipliers.iter().try_for_each(|m| self.mult(m))?;
        let wd = [co, s[0] / c.groups, c.kernel[0], c.kernel[1]];
        let w = self
            .model
            .tensor(&format!("{}.weight", c.name), DType::I8, &wd)
            .map_err(|m| self.bad(m))?;
        if !(2..=8).contains(&c.weight_bits) {
            return Err(self.bad(format!("{} weight bits: 2 to 8", c.weight_bits)));
        }
        let half = 1i32 << (c.weight_bits - 1);
        if let Some(v) =
            w.data.iter().map(|&b| i32::from(b as i8)).find(|v| !(-half..half).contains(v))
        {
            return Err(self.bad(format!("weight {v} does not fit {} bits", c.weight_bits)));
        }
        let bias = self
            .model
            .tensor(&format!("{}.bias", c.name), DType::I32, &[co])
            .map_err(|m| self.bad(m))?;
        for (ch, (m, unit)) in c.multipliers.iter().zip(&bias.scale).enumerate() {
            let want = f64::from(*unit) / f64::from(c.out.scale);
            consistent(m, want).map_err(|e| self.bad(format!("channel {ch}: {e}")))?;
        }
        Ok([co, oh, ow])
    }

    fn pool(
        &self,
        input: usize,
        kernel: usize,
        stride: usize,
        padding: usize,
    ) -> Result<Shape, ModelError> {
        let s = self.image(input)?;
        if kernel == 0 || stride == 0 || kernel > 16 || 2 * padding > kernel {
            return Err(self.bad("pool window out of range"));
        }
        let (hp, wp) = (s[1] + 2 * padding, s[2] + 2 * padding);
        if hp < kernel || wp < kernel {
            return Err(self.bad(format!("pool does not fit input {s:?}")));
        }
        Ok([s[0], (hp - kernel) / stride + 1, (wp - kernel) / stride + 1])
    }

    /// A sum (`add`: operands of one shape) or a concatenation (along channels).
    fn operands(
        &self,
        inputs: &[(usize, FixedMultiplier)],
        out: &ActGrid,
        add: bool,
    ) -> Result<Shape, ModelError> {
        self.grid(out)?;
        if inputs.is_empty() {
            return Err(self.bad("no operands"));
        }
        let first = self.image(inputs[0].0)?;
        let mut c = 0;
        for (v, m) in inputs {
            let s = self.image(*v)?;
            self.mult(m)?;
            if let Some(gv) = self.model.grid_of(*v) {
                let want = f64::from(gv.scale) / f64::from(out.scale);
                consistent(m, want).map_err(|e| self.bad(format!("operand {v}: {e}")))?;
            }
            if s[1..] != first[1..] || (add && s[0] != first[0]) {
                return Err(self.bad(format!("operand shapes {first:?} and {s:?} differ")));
            }
            c += s[0];
        }
        Ok(if add { first } else { [c, first[1], first[2]] })
    }

    fn global_avg_pool(
        &self,
        input: usize,
        multiplier: &FixedMultiplier,
        out: &ActGrid,
    ) -> Result<Shape, ModelError> {
        self.grid(out)?;
        self.mult(multiplier)?;
        let s = self.image(input)?;
        if let Some(gv) = self.model.grid_of(input) {
            let hw = (s[1] * s[2]) as f64;
            let want = f64::from(gv.scale) / (hw * f64::from(out.scale));
            consistent(multiplier, want).map_err(|e| self.bad(e))?;
        }
        Ok([s[0], 0, 0])
    }

    fn linear(
        &self,
        name: &str,
        input: usize,
        multipliers: &[FixedMultiplier],
        logit_scale: f32,
    ) -> Result<Shape, ModelError> {
        let classes = self.model.graph.classes;
        let s = self.get(input)?;
        if s[1] != 0 {
            return Err(self.bad("the classifier reads a vector"));
        }
        if multipliers.len() != classes || !(logit_scale.is_finite() && logit_scale > 0.0) {
            return Err(self.bad("needs one multiplier per class and a positive logit scale"));
        }
        multipliers.iter().try_for_each(|m| self.mult(m))?;
        self.model
            .tensor(&format!("{name}.weight"), DType::I8, &[classes, s[0]])
            .map_err(|m| self.bad(m))?;
        let bias = self
            .model
            .tensor(&format!("{name}.bias"), DType::I32, &[classes])
            .map_err(|m| self.bad(m))?;
        for (c, (m, unit)) in multipliers.iter().zip(&bias.scale).enumerate() {
            let want = f64::from(*unit) / f64::from(logit_scale);
            consistent(m, want).map_err(|e| self.bad(format!("class {c}: {e}")))?;
        }
        Ok([classes, 0, 0])
    }
}
