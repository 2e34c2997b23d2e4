//! `FrozenModel`: an integer-only network as a list of nodes, each reading values that earlier
//! nodes produced, with its integer tensors. Stored in `model.qdf`: the graph as the metadata
//! attribute `model`, the weights and biases as tensors.
//!
//! Activations are 8-bit integers on a per-tensor grid `x = scale·(q − zero_point)`, `q` in
//! `[qmin, qmax]`. Signed grids are stored as they are; unsigned ones (`qmin ≥ 0`, u8) are stored
//! shifted by −128 into i8 with the zero point shifted alike, which changes no arithmetic.
//! Weights are symmetric int8 per output channel, biases int32 at scale `s_in·s_w`, and every
//! rescale a [`FixedMultiplier`].

use std::collections::BTreeMap;
use std::path::Path;

use qdarts_genotypes::Genotype;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::fixed::{FixedMultiplier, Rounding};
use crate::qdf::{DType, Meta, QTensor, QdfError, QdfFile};

/// A per-tensor activation grid.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActGrid {
    /// Step.
    pub scale: f32,
    /// Zero point (in `[qmin, qmax]`).
    pub zero_point: i32,
    /// Smallest integer.
    pub qmin: i32,
    /// Largest integer.
    pub qmax: i32,
}

impl ActGrid {
    /// What the i8 storage subtracts: 128 for an unsigned grid, else 0.
    pub fn offset(&self) -> i32 {
        if self.qmin >= 0 { 128 } else { 0 }
    }

    /// Whether the grid is unsigned (u8).
    pub fn unsigned(&self) -> bool {
        self.qmin >= 0
    }

    fn check(&self) -> Result<(), String> {
        let off = self.offset();
        if !(self.scale.is_finite() && self.scale > 0.0) {
            return Err(format!("scale {} is not a positive number", self.scale));
        }
        if self.qmin > self.qmax || self.qmin - off < -128 || self.qmax - off > 127 {
            return Err(format!("range [{}, {}] does not fit 8 bits", self.qmin, self.qmax));
        }
        if self.zero_point < self.qmin || self.zero_point > self.qmax {
            return Err(format!(
                "zero point {} is outside [{}, {}]",
                self.zero_point, self.qmin, self.qmax
            ));
        }
        Ok(())
    }
}

/// Max or average (padding excluded from the count) pooling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PoolKind {
    /// Max pooling (padding never wins).
    Max,
    /// Average pooling over the window's in-image elements.
    Avg,
}

/// A 2-D convolution: `out = requant(M_c·(Σ w·(x − z_in) + bias_c))` with an optional ReLU on
/// its input (`max(q, z_in)`), and an optional crop of its input's first `offset` rows and
/// columns (the shifted half of DARTS' FactorizedReduce). BatchNorm is folded into `w` and `bias`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConvNode {
    /// Layer path; its tensors are `<name>.weight` (i8 `[c_out, c_in/groups, kh, kw]`) and
    /// `<name>.bias` (i32 `[c_out]`).
    pub name: String,
    /// Input value.
    pub input: usize,
    /// ReLU on the input.
    pub relu: bool,
    /// Kernel `[kh, kw]`.
    pub kernel: [usize; 2],
    /// Stride.
    pub stride: [usize; 2],
    /// Zero padding (of `x − z_in`, i.e. real zeros) on both sides.
    pub padding: [usize; 2],
    /// Dilation.
    pub dilation: usize,
    /// Groups.
    pub groups: usize,
    /// Rows and columns cropped off the input's top and left first.
    #[serde(default)]
    pub offset: usize,
    /// Per output channel `M_c = s_in·s_w,c/s_out`.
    pub multipliers: Vec<FixedMultiplier>,
    /// Output grid.
    pub out: ActGrid,
}

/// One node of the graph; node `i` produces value `i`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Node {
    /// The (normalized float) image, quantized onto `grid`. Node 0, and only node 0.
    Input {
        /// Input grid.
        grid: ActGrid,
    },
    /// Convolution (also 1×1 depthwise for a BatchNorm after a pool).
    Conv(ConvNode),
    /// 3×3-style pooling; the output stays on the input's grid.
    Pool {
        /// Input value.
        input: usize,
        /// Max or average.
        kind: PoolKind,
        /// Window.
        kernel: usize,
        /// Stride.
        stride: usize,
        /// Padding.
        padding: usize,
    },
    /// `out = clamp(z_out + Σ_i M_i·(q_i − z_i))`, each term rounded on its own.
    Add {
        /// Operands and their rescales `s_i/s_out`.
        inputs: Vec<(usize, FixedMultiplier)>,
        /// Output grid.
        out: ActGrid,
    },
    /// Channel concatenation, each operand rescaled onto the output grid.
    Concat {
        /// Operands and their rescales `s_i/s_out`.
        inputs: Vec<(usize, FixedMultiplier)>,
        /// Output grid.
        out: ActGrid,
    },
    /// All zero (`none`), `[C, ceil(H/s), ceil(W/s)]` of the input.
    Zero {
        /// Input value (for the shape).
        input: usize,
        /// Stride.
        stride: usize,
        /// Output grid.
        out: ActGrid,
    },
    /// Global average pooling: `clamp(z_out + M·Σ_hw (q − z_in))`, `M = s_in/(H·W·s_out)`.
    GlobalAvgPool {
        /// Input value.
        input: usize,
        /// Rescale.
        multiplier: FixedMultiplier,
        /// Output grid.
        out: ActGrid,
    },
    /// The classifier: int32 logits `M_c·(Σ w·(x − z_in) + bias_c)` at `logit_scale`.
    Linear {
        /// Layer path; tensors `<name>.weight` (i8 `[out, in]`) and `<name>.bias` (i32).
        name: String,
        /// Input value (a vector).
        input: usize,
        /// Per class `s_in·s_w,c/logit_scale`.
        multipliers: Vec<FixedMultiplier>,
        /// Value of one logit unit.
        logit_scale: f32,
    },
}

/// Input normalization and the graph: what `model.qdf` stores as its `model` attribute.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Graph {
    /// Image `[C, H, W]`.
    pub input_shape: [usize; 3],
    /// Per-channel mean the float image is normalized with (pixel/255 − mean)/std.
    pub mean: Vec<f32>,
    /// Per-channel standard deviation.
    pub std: Vec<f32>,
    /// Classes.
    pub classes: usize,
    /// Rounding of every rescale.
    pub rounding: Rounding,
    /// Nodes; the last one is the output (a `Linear`).
    pub nodes: Vec<Node>,
}

/// A frozen model: genotype, graph and integer tensors.
#[derive(Debug, Clone, PartialEq)]
pub struct FrozenModel {
    /// The genotype it was built from.
    pub genotype: Genotype,
    /// The graph.
    pub graph: Graph,
    /// Weights (i8) and biases (i32) by name.
    pub tensors: BTreeMap<String, QTensor>,
}

/// Why a model was refused.
#[derive(Debug, Error)]
pub enum ModelError {
    /// The file could not be read or written.
    #[error("{path}: {cause}")]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// The cause.
        cause: std::io::Error,
    },
    /// The container is damaged.
    #[error("{path}: {cause}")]
    Qdf {
        /// The file.
        path: std::path::PathBuf,
        /// The cause.
        cause: QdfError,
    },
    /// The graph is inconsistent.
    #[error("{0}")]
    Invalid(String),
}

/// A value's shape: `[C, H, W]`, or a vector `[C]` (`h = w = 0`).
pub type Shape = [usize; 3];

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

impl FrozenModel {
    /// The grid of value `v` (`None` for the logits).
    pub fn grid_of(&self, v: usize) -> Option<ActGrid> {
        match self.graph.nodes.get(v)? {
            Node::Input { grid } => Some(*grid),
            Node::Conv(c) => Some(c.out),
            Node::Pool { input, .. } => self.grid_of(*input),
            Node::Add { out, .. } | Node::Concat { out, .. } => Some(*out),
            Node::Zero { out, .. } | Node::GlobalAvgPool { out, .. } => Some(*out),
            Node::Linear { .. } => None,
        }
    }

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
                    self.tensor(&format!("{}.weight", c.name), DType::I8, &wd)
                        .map_err(|m| bad(i, m))?;
                    self.tensor(&format!("{}.bias", c.name), DType::I32, &[co])
                        .map_err(|m| bad(i, m))?;
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
                    [image(*input)?[0], 0, 0]
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
                    self.tensor(&format!("{name}.bias"), DType::I32, &[g.classes])
                        .map_err(|m| bad(i, m))?;
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

    /// The `.qdf` container of the model.
    pub fn to_qdf(&self) -> QdfFile {
        let mut attrs = BTreeMap::new();
        attrs.insert("model".to_string(), serde_json::to_value(&self.graph).unwrap_or_default());
        QdfFile {
            meta: Meta { genotype: self.genotype.clone(), attrs },
            tensors: self.tensors.values().cloned().collect(),
        }
    }

    /// The model of a `.qdf` container, validated.
    pub fn from_qdf(file: QdfFile) -> Result<Self, ModelError> {
        let graph =
            file.meta.attrs.get("model").ok_or_else(|| {
                ModelError::Invalid("the metadata has no `model` attribute".into())
            })?;
        let graph: Graph = serde_json::from_value(graph.clone())
            .map_err(|e| ModelError::Invalid(format!("the `model` attribute: {e}")))?;
        let tensors = file.tensors.into_iter().map(|t| (t.name.clone(), t)).collect();
        let m = FrozenModel { genotype: file.meta.genotype, graph, tensors };
        m.validate()?;
        Ok(m)
    }

    /// Writes `model.qdf`.
    pub fn save(&self, path: &Path) -> Result<(), ModelError> {
        let bytes =
            self.to_qdf().write().map_err(|cause| ModelError::Qdf { path: path.into(), cause })?;
        let tmp = path.with_extension("qdf.tmp");
        std::fs::write(&tmp, bytes)
            .and_then(|()| std::fs::rename(&tmp, path))
            .map_err(|cause| ModelError::Io { path: path.into(), cause })
    }

    /// Reads and validates `model.qdf`.
    pub fn load(path: &Path) -> Result<Self, ModelError> {
        let bytes =
            std::fs::read(path).map_err(|cause| ModelError::Io { path: path.into(), cause })?;
        let file =
            QdfFile::read(&bytes).map_err(|cause| ModelError::Qdf { path: path.into(), cause })?;
        Self::from_qdf(file).map_err(|e| match e {
            ModelError::Invalid(m) => ModelError::Invalid(format!("{}: {m}", path.display())),
            e => e,
        })
    }

    /// Multiply-accumulates per image of every conv and the classifier, with the bit widths of
    /// their operands: `(MACs, weight bits, activation bits)`.
    pub fn macs(&self) -> Result<Vec<(u64, u32, u32)>, ModelError> {
        let shapes = self.validate()?;
        // Bits of a grid: ceil(log2(levels)).
        let bits = |g: Option<ActGrid>| {
            g.map_or(8, |g| ((g.qmax - g.qmin) as u32 + 1).next_power_of_two().trailing_zeros())
        };
        let mut out = Vec::new();
        for (i, node) in self.graph.nodes.iter().enumerate() {
            match node {
                Node::Conv(c) => {
                    let s = shapes[c.input];
                    let per_out = (s[0] / c.groups * c.kernel[0] * c.kernel[1]) as u64;
                    let o = shapes[i];
                    out.push((
                        per_out * (o[0] * o[1] * o[2]) as u64,
                        8,
                        bits(self.grid_of(c.input)),
                    ));
                }
                Node::Linear { input, .. } => {
                    out.push((
                        (shapes[*input][0] * self.graph.classes) as u64,
                        8,
                        bits(self.grid_of(*input)),
                    ));
                }
                _ => {}
            }
        }
        Ok(out)
    }

    /// BitOPs per image: Σ MACs · weight bits · activation bits.
    pub fn bitops(&self) -> Result<u64, ModelError> {
        Ok(self.macs()?.iter().map(|&(m, wb, ab)| m * u64::from(wb) * u64::from(ab)).sum())
    }

    /// Bytes of the integer parameters (weights and biases).
    pub fn param_bytes(&self) -> u64 {
        self.tensors.values().map(|t| t.data.len() as u64).sum()
    }
}
