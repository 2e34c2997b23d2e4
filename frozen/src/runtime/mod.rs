//! Integer-only inference of a [`FrozenModel`] on the CPU: i8 activations, i32 accumulators,
//! fixed-point requantization; images of a batch run on parallel threads.
//!
//! Two convolution kernels give the same integers: [`Kernels::Fast`] (im2col and a blocked
//! matrix product, module `fast`) runs by default; [`Kernels::Direct`] (a direct loop over
//! the zero-padded, zero-point-subtracted input, module `direct`) is the plain reading of the
//! arithmetic that the fast one is tested against.

mod direct;
mod fast;
mod nodes;
mod packed;
mod simd;

use crate::fixed::{FixedMultiplier, Rounding};
use crate::model::{ActGrid, ConvNode, FrozenModel, ModelError, Node, PoolKind, Shape, conv_macs};
use crate::qdf::QTensor;

/// Time spent in one kind of node ([`Runtime::profile`]).
#[derive(Debug, Clone, PartialEq)]
pub struct NodeProfile {
    /// Node kind, e.g. `conv 1×1` or `pool avg`.
    pub kind: String,
    /// Seconds over all images.
    pub seconds: f64,
    /// Multiply-accumulates over all images.
    pub macs: u64,
}

fn node_kind(node: &Node) -> String {
    match node {
        Node::Input { .. } => "input".into(),
        Node::Conv(c) if c.kernel == [1, 1] && c.groups == 1 => "conv 1×1".into(),
        Node::Conv(c) if c.groups > 1 && c.groups == c.multipliers.len() => {
            format!("depthwise {}×{}", c.kernel[0], c.kernel[1])
        }
        Node::Conv(c) => format!("conv {}×{}", c.kernel[0], c.kernel[1]),
        Node::Pool { kind: PoolKind::Max, .. } => "pool max".into(),
        Node::Pool { kind: PoolKind::Avg, .. } => "pool avg".into(),
        Node::Add { .. } => "add".into(),
        Node::Concat { .. } => "concat".into(),
        Node::Zero { .. } => "zero".into(),
        Node::GlobalAvgPool { .. } => "global avg".into(),
        Node::Linear { .. } => "linear".into(),
    }
}

/// Which convolution kernel a [`Runtime`] uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernels {
    /// im2col and a blocked i16×i16→i32 matrix product, vectorized for the CPU it runs on.
    Fast,
    /// A direct loop over the padded input: the reference the fast kernel is tested against.
    Direct,
}

/// Weights widened once for the kernels.
#[derive(Debug)]
enum Prepared {
    None,
    /// Widened weights and biases: the classifier, and convolutions on the direct kernel.
    Weights {
        w: Vec<i32>,
        bias: Vec<i32>,
    },
    /// A convolution on the fast kernels.
    Plan(fast::ConvPlan),
    /// A sum on the fast kernels: per operand, `M·(q − z)` for each of the 256 stored values.
    Sum(Vec<[i32; 256]>),
    /// A sum of two operands on the fast kernels: the stored result for every pair of stored
    /// operands, `[a][b]`.
    Pairs(Vec<i8>),
    /// A concatenation on the fast kernels: per operand, each stored value moved onto the
    /// output grid.
    Moves(Vec<[i8; 256]>),
}

/// One 256-entry table per operand `(v, M)` of a sum or concatenation, written by
/// `fill(z_v, M, table)` (`z_v`: the operand's zero point in storage).
fn operand_tables<T: Copy + Default>(
    model: &FrozenModel,
    inputs: &[(usize, FixedMultiplier)],
    r: Rounding,
    fill: impl Fn(i32, crate::fixed::Lanes, &mut [T; 256]),
) -> Vec<[T; 256]> {
    inputs
        .iter()
        .map(|(v, m)| {
            let g = model.grid_of(*v).unwrap_or(FALLBACK_GRID);
            let mut t = [T::default(); 256];
            fill(g.zero_point - g.offset(), m.lanes(r), &mut t);
            t
        })
        .collect()
}

/// Every stored value, in table order (`i as u8` read as i8).
pub(super) fn every_stored() -> [i8; 256] {
    std::array::from_fn(|i| i as u8 as i8)
}

/// A model ready to run: shapes checked, weights widened.
#[derive(Debug)]
pub struct Runtime<'a> {
    model: &'a FrozenModel,
    shapes: Vec<Shape>,
    prepared: Vec<Prepared>,
    kernels: Kernels,
    /// Last node that reads each value (its buffer is freed after).
    last_use: Vec<usize>,
}

/// Int8 weights widened to i32, each output channel (axis 0) negated where its scale is
/// negative (a flipped channel whose integers include −128).
fn i8s(t: &QTensor) -> Vec<i32> {
    let per = t.data.len() / t.scale.len().max(1);
    t.data
        .iter()
        .enumerate()
        .map(|(i, &b)| {
            let v = i32::from(b as i8);
            if t.scale.get(i / per.max(1)).is_some_and(|s| *s < 0.0) { -v } else { v }
        })
        .collect()
}

fn i32s(t: &QTensor) -> Vec<i32> {
    t.data.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn inputs_of(node: &Node) -> Vec<usize> {
    match node {
        Node::Input { .. } => vec![],
        Node::Conv(c) => vec![c.input],
        Node::Pool { input, .. } | Node::Zero { input, .. } => vec![*input],
        Node::GlobalAvgPool { input, .. } | Node::Linear { input, .. } => vec![*input],
        Node::Add { inputs, .. } | Node::Concat { inputs, .. } => {
            inputs.iter().map(|(v, _)| *v).collect()
        }
    }
}

/// `round(num/den)` for `den > 0`, ties as `r` says.
fn div_round(num: i32, den: i32, r: Rounding) -> i32 {
    let q = num.div_euclid(den);
    let rem = num.rem_euclid(den);
    let twice = 2 * rem;
    let up = match r {
        Rounding::TiesToEven => twice > den || (twice == den && q & 1 == 1),
        Rounding::TiesAwayFromZero => twice > den || (twice == den && q >= 0),
    };
    q + i32::from(up)
}

/// Rounds a float as the model's rounding says.
pub fn round_f32(x: f32, r: Rounding) -> f32 {
    match r {
        Rounding::TiesToEven => x.round_ties_even(),
        Rounding::TiesAwayFromZero => x.round(),
    }
}

fn store(q: i32, g: &ActGrid) -> i8 {
    (q.clamp(g.qmin, g.qmax) - g.offset()) as i8
}

/// Accumulators of one output channel requantized onto `out` and stored.
fn store_requantized(acc: &[i32], m: FixedMultiplier, out: &ActGrid, r: Rounding, dst: &mut [i8]) {
    simd::requantize(acc, m.lanes(r), out, dst);
}

/// Never used: validation gives every value an image node reads a grid.
const FALLBACK_GRID: ActGrid = ActGrid { scale: 1.0, zero_point: 0, qmin: -128, qmax: 127 };

impl<'a> Runtime<'a> {
    /// Validates the model and prepares the fast kernels.
    pub fn new(model: &'a FrozenModel) -> Result<Self, ModelError> {
        Self::with_kernels(model, Kernels::Fast)
    }

    /// Validates the model and prepares the given kernels.
    pub fn with_kernels(model: &'a FrozenModel, kernels: Kernels) -> Result<Self, ModelError> {
        let shapes = model.validate()?;
        let nodes = &model.graph.nodes;
        let mut last_use: Vec<usize> = (0..nodes.len()).collect();
        for (i, n) in nodes.iter().enumerate() {
            for v in inputs_of(n) {
                last_use[v] = last_use[v].max(i);
            }
        }
        let r = model.graph.rounding;
        let prepared = nodes
            .iter()
            .map(|n| match n {
                Node::Conv(ConvNode { name, .. }) | Node::Linear { name, .. } => {
                    let t = |s: &str| &model.tensors[&format!("{name}.{s}")];
                    let (w, bias) = (i8s(t("weight")), i32s(t("bias")));
                    match n {
                        Node::Conv(c) if kernels == Kernels::Fast => {
                            let g = model.grid_of(c.input).unwrap_or(FALLBACK_GRID);
                            Prepared::Plan(fast::ConvPlan::new(
                                c,
                                &w,
                                &bias,
                                g.zero_point - g.offset(),
                                r,
                            ))
                        }
                        _ => Prepared::Weights { w, bias },
                    }
                }
                // The same arithmetic as the direct path below, once per stored value.
                Node::Add { inputs, out } if kernels == Kernels::Fast => {
                    let tables = operand_tables(model, inputs, r, |z, l, t| {
                        simd::add_scaled(t, &every_stored(), z, l);
                    });
                    if let [ta, tb] = &tables[..] {
                        // Two operands: the stored result of every pair, by the same sum.
                        let a: Vec<i8> = (0..1 << 16).map(|i| (i >> 8) as u8 as i8).collect();
                        let b: Vec<i8> = (0..1 << 16).map(|i| i as u8 as i8).collect();
                        let mut pairs = vec![0i8; 1 << 16];
                        simd::sum_tables(&[&a, &b], &[*ta, *tb], out, &mut pairs);
                        Prepared::Pairs(pairs)
                    } else {
                        Prepared::Sum(tables)
                    }
                }
                Node::Concat { inputs, out } if kernels == Kernels::Fast => {
                    Prepared::Moves(operand_tables(model, inputs, r, |z, l, t| {
                        simd::rescale(&every_stored(), z, l, out, t);
                    }))
                }
                _ => Prepared::None,
            })
            .collect();
        Ok(Runtime { model, shapes, prepared, kernels, last_use })
    }

    /// Values per image of the input.
    pub fn input_len(&self) -> usize {
        self.model.graph.input_shape.iter().product()
    }

    /// Classes.
    pub fn classes(&self) -> usize {
        self.model.graph.classes
    }

    /// Value of one logit unit.
    pub fn logit_scale(&self) -> f32 {
        match self.model.graph.nodes.last() {
            Some(Node::Linear { logit_scale, .. }) => *logit_scale,
            _ => 1.0,
        }
    }

    /// The int32 logits of one normalized float image `[C, H, W]` (the only float step is the
    /// input's quantization).
    ///
    /// # Panics
    /// If `image` is not `input_len()` long.
    pub fn run_image(&self, image: &[f32]) -> Vec<i32> {
        self.run_image_keep(image, false).0
    }

    /// The logits and every intermediate value (i8 storage; subtract nothing: add the grid's
    /// offset to get `q`) of one image, for inspection.
    ///
    /// # Panics
    /// If `image` is not `input_len()` long.
    pub fn run_image_values(&self, image: &[f32]) -> (Vec<i32>, Vec<Vec<i8>>) {
        self.run_image_keep(image, true)
    }

    fn run_image_keep(&self, image: &[f32], keep: bool) -> (Vec<i32>, Vec<Vec<i8>>) {
        assert_eq!(image.len(), self.input_len(), "image size");
        let nodes = &self.model.graph.nodes;
        let mut values: Vec<Vec<i8>> = vec![Vec::new(); nodes.len()];
        let mut logits = Vec::new();
        for (i, node) in nodes.iter().enumerate() {
            let out = self.eval_node(i, image, &values, &mut logits);
            values[i] = out;
            for v in inputs_of(node) {
                if self.last_use[v] == i && !keep {
                    values[v] = Vec::new();
                }
            }
        }
        (logits, values)
    }

    /// Where one thread's time goes: seconds per node kind (`input`, `conv 1×1`, `conv k×k`,
    /// `depthwise k×k`, `pool max`, `pool avg`, `add`, `concat`, `zero`, `global avg`,
    /// `linear`) over `images`, and their MACs, in order of first appearance.
    pub fn profile(&self, images: &[f32]) -> Vec<NodeProfile> {
        let nodes = &self.model.graph.nodes;
        let mut rows: Vec<NodeProfile> = Vec::new();
        for image in images.chunks_exact(self.input_len()) {
            let mut values: Vec<Vec<i8>> = vec![Vec::new(); nodes.len()];
            let mut logits = Vec::new();
            for (i, node) in nodes.iter().enumerate() {
                let t0 = std::time::Instant::now();
                values[i] = self.eval_node(i, image, &values, &mut logits);
                let seconds = t0.elapsed().as_secs_f64();
                let kind = node_kind(node);
                let macs = match node {
                    Node::Conv(c) => conv_macs(c, self.shapes[c.input], self.shapes[i]),
                    _ => 0,
                };
                match rows.iter_mut().find(|r| r.kind == kind) {
                    Some(r) => {
                        r.seconds += seconds;
                        r.macs += macs;
                    }
                    None => rows.push(NodeProfile { kind, seconds, macs }),
                }
            }
        }
        rows
    }

    fn grid(&self, v: usize) -> ActGrid {
        // Validated: every value an image node reads has a grid.
        self.model.grid_of(v).unwrap_or(FALLBACK_GRID)
    }

    /// The kernels this runtime uses.
    pub fn kernels(&self) -> Kernels {
        self.kernels
    }

    /// Logits of `n` images (`images` is `n·input_len()` normalized floats) on `threads`
    /// threads (images split between them). Returns `n·classes` int32 logits.
    pub fn run(&self, images: &[f32], threads: usize) -> Vec<i32> {
        let len = self.input_len();
        let n = images.len() / len;
        let threads = threads.clamp(1, n.max(1));
        let per = n.div_ceil(threads).max(1);
        let mut out = vec![0i32; n * self.classes()];
        std::thread::scope(|scope| {
            for (imgs, dst) in images.chunks(per * len).zip(out.chunks_mut(per * self.classes())) {
                scope.spawn(move || {
                    for (img, d) in imgs.chunks_exact(len).zip(dst.chunks_exact_mut(self.classes()))
                    {
                        d.copy_from_slice(&self.run_image(img));
                    }
                });
            }
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn division_rounds_as_asked() {
        assert_eq!(div_round(5, 2, Rounding::TiesToEven), 2);
        assert_eq!(div_round(7, 2, Rounding::TiesToEven), 4);
        assert_eq!(div_round(-5, 2, Rounding::TiesToEven), -2);
        assert_eq!(div_round(5, 2, Rounding::TiesAwayFromZero), 3);
        assert_eq!(div_round(-5, 2, Rounding::TiesAwayFromZero), -3);
        assert_eq!(div_round(-7, 4, Rounding::TiesAwayFromZero), -2);
        assert_eq!(div_round(10, 4, Rounding::TiesAwayFromZero), 3);
        assert_eq!(div_round(10, 4, Rounding::TiesToEven), 2);
        assert_eq!(div_round(4, 9, Rounding::TiesToEven), 0);
        assert_eq!(div_round(5, 9, Rounding::TiesToEven), 1);
    }
}
