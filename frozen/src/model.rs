//! `FrozenModel`: an integer-only network as a list of nodes, each reading values that earlier
//! nodes produced, with its integer tensors. Stored in `model.qdf`: the graph as the metadata
//! attribute `model`, the weights and biases as tensors.
//!
//! Activations are 8-bit integers on a per-tensor grid `x = scale·(q − zero_point)`, `q` in
//! `[qmin, qmax]`. Signed grids are stored as they are; unsigned ones (`qmin ≥ 0`, u8) are stored
//! shifted by −128 into i8 with the zero point shifted alike, which changes no arithmetic.
//! Weights are symmetric per output channel, 2 to 8 bits each stored in an int8 (a conv's
//! `weight_bits` says how many), biases int32 at scale `s_in·s_w`, and every rescale a
//! [`FixedMultiplier`]. Activation grids narrower than 8 bits (`qmin`/`qmax`) are stored in
//! i8 alike.

use std::collections::BTreeMap;
use std::path::Path;

use qdarts_genotypes::Genotype;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::fixed::{FixedMultiplier, Rounding};
use crate::qdf::{Meta, QTensor, QdfError, QdfFile};

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

    pub(crate) fn check(&self) -> Result<(), String> {
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
    /// Bits of the weights (2 to 8), stored one per int8: they lie in `[−2^(b−1), 2^(b−1) − 1]`
    /// (8 in models written before per-op widths).
    #[serde(default = "eight_bits")]
    pub weight_bits: u32,
}

fn eight_bits() -> u32 {
    8
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

/// Multiply-accumulates of a convolution from input shape `s` to output shape `o`.
pub(crate) fn conv_macs(c: &ConvNode, s: Shape, o: Shape) -> u64 {
    (s[0] / c.groups * c.kernel[0] * c.kernel[1] * o.iter().product::<usize>()) as u64
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

    /// The `.qdf` container of the model.
    pub fn to_qdf(&self) -> Result<QdfFile, ModelError> {
        let mut attrs = BTreeMap::new();
        let graph = serde_json::to_value(&self.graph)
            .map_err(|e| ModelError::Invalid(format!("the graph cannot be encoded: {e}")))?;
        attrs.insert("model".to_string(), graph);
        Ok(QdfFile {
            meta: Meta { genotype: self.genotype.clone(), attrs },
            tensors: self.tensors.values().cloned().collect(),
        })
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
            self.to_qdf()?.write().map_err(|cause| ModelError::Qdf { path: path.into(), cause })?;
        // A temp file of this write's own, synced, then renamed: two `freeze` at once each
        // put a whole model in place.
        static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = path.file_name().map_or_else(String::new, |s| s.to_string_lossy().into_owned());
        let tmp = path.with_file_name(format!(".{name}.{}.{n}.tmp", std::process::id()));
        let written = std::fs::File::create(&tmp).and_then(|mut f| {
            std::io::Write::write_all(&mut f, &bytes)?;
            f.sync_all()
        });
        written.and_then(|()| std::fs::rename(&tmp, path)).map_err(|cause| {
            let _ = std::fs::remove_file(&tmp);
            ModelError::Io { path: path.into(), cause }
        })
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
                    let macs = conv_macs(c, shapes[c.input], shapes[i]);
                    out.push((macs, c.weight_bits, bits(self.grid_of(c.input))));
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

    /// Bytes of the integer parameters (weights and biases) as stored (one byte per weight).
    pub fn param_bytes(&self) -> u64 {
        self.tensors.values().map(|t| t.data.len() as u64).sum()
    }

    /// Bytes of the weights packed at their widths (`⌈n·b/8⌉` per conv; the classifier at 8
    /// bits; biases not counted): the size a bit-width search's cost estimates.
    pub fn weight_bytes(&self) -> u64 {
        let n = |name: &str| self.tensors.get(name).map_or(0, |t| t.data.len() as u64);
        self.graph
            .nodes
            .iter()
            .map(|node| match node {
                Node::Conv(c) => {
                    (n(&format!("{}.weight", c.name)) * u64::from(c.weight_bits)).div_ceil(8)
                }
                Node::Linear { name, .. } => n(&format!("{name}.weight")),
                _ => 0,
            })
            .sum()
    }
}
