//! Integer-only inference of a [`FrozenModel`] on the CPU: i8 activations, i32 accumulators,
//! fixed-point requantization. Direct convolution over a zero-padded, zero-point-subtracted copy
//! of the input, with the innermost loop over contiguous output columns; images of a batch run
//! on parallel threads.

use crate::fixed::{Rounding, requantize};
use crate::model::{ActGrid, ConvNode, FrozenModel, ModelError, Node, PoolKind, Shape};
use crate::qdf::QTensor;
use crate::validate::conv_out;

/// Weights widened once for the kernels.
#[derive(Debug)]
enum Prepared {
    None,
    Weights { w: Vec<i32>, bias: Vec<i32> },
}

/// A model ready to run: shapes checked, weights widened.
#[derive(Debug)]
pub struct Runtime<'a> {
    model: &'a FrozenModel,
    shapes: Vec<Shape>,
    prepared: Vec<Prepared>,
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

impl<'a> Runtime<'a> {
    /// Validates the model and prepares its kernels.
    pub fn new(model: &'a FrozenModel) -> Result<Self, ModelError> {
        let shapes = model.validate()?;
        let nodes = &model.graph.nodes;
        let mut last_use: Vec<usize> = (0..nodes.len()).collect();
        for (i, n) in nodes.iter().enumerate() {
            for v in inputs_of(n) {
                last_use[v] = last_use[v].max(i);
            }
        }
        let prepared = nodes
            .iter()
            .map(|n| match n {
                Node::Conv(ConvNode { name, .. }) | Node::Linear { name, .. } => {
                    let t = |s: &str| &model.tensors[&format!("{name}.{s}")];
                    Prepared::Weights { w: i8s(t("weight")), bias: i32s(t("bias")) }
                }
                _ => Prepared::None,
            })
            .collect();
        Ok(Runtime { model, shapes, prepared, last_use })
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
        let r = self.model.graph.rounding;
        let mut values: Vec<Vec<i8>> = vec![Vec::new(); nodes.len()];
        let mut logits = Vec::new();
        for (i, node) in nodes.iter().enumerate() {
            let out = match node {
                Node::Input { grid } => {
                    let inv = 1.0 / grid.scale;
                    image
                        .iter()
                        .map(|&x| {
                            let q = round_f32(x * inv, r).clamp(-1e9, 1e9) as i32;
                            store(q.saturating_add(grid.zero_point), grid)
                        })
                        .collect()
                }
                Node::Conv(c) => {
                    let Prepared::Weights { w, bias } = &self.prepared[i] else { unreachable!() };
                    let g_in = self.grid(c.input);
                    self.conv(c, &values[c.input], self.shapes[c.input], g_in, w, bias)
                }
                Node::Pool { input, kind, kernel, stride, padding } => {
                    let g = self.grid(*input);
                    pool(
                        &values[*input],
                        self.shapes[*input],
                        self.shapes[i],
                        *kind,
                        [*kernel, *stride, *padding],
                        g,
                        r,
                    )
                }
                Node::Add { inputs, out } => {
                    let n = values[inputs[0].0].len();
                    let mut acc = vec![0i32; n];
                    for (v, m) in inputs {
                        let g = self.grid(*v);
                        let z = g.zero_point - g.offset();
                        for (a, &q) in acc.iter_mut().zip(&values[*v]) {
                            *a = a.saturating_add(m.apply(i32::from(q) - z, r));
                        }
                    }
                    acc.iter().map(|&a| store(a.saturating_add(out.zero_point), out)).collect()
                }
                Node::Concat { inputs, out } => {
                    let mut y = Vec::new();
                    for (v, m) in inputs {
                        let g = self.grid(*v);
                        let z = g.zero_point - g.offset();
                        y.extend(values[*v].iter().map(|&q| {
                            store(
                                requantize(
                                    i32::from(q) - z,
                                    *m,
                                    out.zero_point,
                                    out.qmin,
                                    out.qmax,
                                    r,
                                ),
                                out,
                            )
                        }));
                    }
                    y
                }
                Node::Zero { out, .. } => {
                    vec![store(out.zero_point, out); self.shapes[i].iter().product()]
                }
                Node::GlobalAvgPool { input, multiplier, out } => {
                    let g = self.grid(*input);
                    let z = g.zero_point - g.offset();
                    let [c, h, w] = self.shapes[*input];
                    let x = &values[*input];
                    (0..c)
                        .map(|ch| {
                            let s: i32 = x[ch * h * w..(ch + 1) * h * w]
                                .iter()
                                .map(|&q| i32::from(q) - z)
                                .sum();
                            store(
                                requantize(s, *multiplier, out.zero_point, out.qmin, out.qmax, r),
                                out,
                            )
                        })
                        .collect()
                }
                Node::Linear { input, multipliers, .. } => {
                    let Prepared::Weights { w, bias } = &self.prepared[i] else { unreachable!() };
                    let g = self.grid(*input);
                    let z = g.zero_point - g.offset();
                    let x: Vec<i32> = values[*input].iter().map(|&q| i32::from(q) - z).collect();
                    let k = x.len();
                    logits = multipliers
                        .iter()
                        .enumerate()
                        .map(|(o, m)| {
                            let acc: i32 =
                                w[o * k..(o + 1) * k].iter().zip(&x).map(|(a, b)| a * b).sum();
                            m.apply(acc.saturating_add(bias[o]), r)
                        })
                        .collect();
                    Vec::new()
                }
            };
            values[i] = out;
            for v in inputs_of(node) {
                if self.last_use[v] == i && !keep {
                    values[v] = Vec::new();
                }
            }
        }
        (logits, values)
    }

    fn grid(&self, v: usize) -> ActGrid {
        // Validated: every value an image node reads has a grid.
        self.model.grid_of(v).unwrap_or(ActGrid {
            scale: 1.0,
            zero_point: 0,
            qmin: -128,
            qmax: 127,
        })
    }

    fn conv(
        &self,
        c: &ConvNode,
        x: &[i8],
        s: Shape,
        g_in: ActGrid,
        w: &[i32],
        bias: &[i32],
    ) -> Vec<i8> {
        let r = self.model.graph.rounding;
        let z = g_in.zero_point - g_in.offset();
        let [ci_n, h, wd] = s;
        let (oh, ow) = conv_out(c, s).unwrap_or((0, 0));
        let (ph, pw) = (c.padding[0], c.padding[1]);
        let (hp, wp) = (h - c.offset + 2 * ph, wd - c.offset + 2 * pw);
        // Zero-padded copy of x − z (after the ReLU), cropped by `offset`.
        let mut xp = vec![0i32; ci_n * hp * wp];
        for ch in 0..ci_n {
            for y in c.offset..h {
                let src = &x[(ch * h + y) * wd + c.offset..(ch * h + y + 1) * wd];
                let dst = &mut xp[(ch * hp + y - c.offset + ph) * wp + pw..][..src.len()];
                for (d, &q) in dst.iter_mut().zip(src) {
                    let v = i32::from(q) - z;
                    *d = if c.relu { v.max(0) } else { v };
                }
            }
        }
        let co_n = c.multipliers.len();
        let cig = ci_n / c.groups;
        let cog = co_n / c.groups;
        let [kh, kw] = c.kernel;
        let [sh, sw] = c.stride;
        let d = c.dilation;
        let mut out = vec![0i8; co_n * oh * ow];
        let mut acc = vec![0i32; oh * ow];
        for co in 0..co_n {
            acc.fill(bias[co]);
            let g = co / cog;
            for cl in 0..cig {
                let plane = &xp[(g * cig + cl) * hp * wp..][..hp * wp];
                for ky in 0..kh {
                    for kx in 0..kw {
                        let wv = w[((co * cig + cl) * kh + ky) * kw + kx];
                        if wv == 0 {
                            continue;
                        }
                        for oy in 0..oh {
                            let row = &plane[(oy * sh + ky * d) * wp + kx * d..];
                            let a = &mut acc[oy * ow..(oy + 1) * ow];
                            if sw == 1 {
                                for (a, &xv) in a.iter_mut().zip(&row[..ow]) {
                                    *a += wv * xv;
                                }
                            } else {
                                for (ox, a) in a.iter_mut().enumerate() {
                                    *a += wv * row[ox * sw];
                                }
                            }
                        }
                    }
                }
            }
            let m = c.multipliers[co];
            for (o, &a) in out[co * oh * ow..(co + 1) * oh * ow].iter_mut().zip(&acc) {
                *o = store(requantize(a, m, c.out.zero_point, c.out.qmin, c.out.qmax, r), &c.out);
            }
        }
        out
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

/// Pooling on the input's grid: max of the window (padding ignored), or the average of the
/// window's in-image values rounded as the model rounds.
fn pool(
    x: &[i8],
    s: Shape,
    o: Shape,
    kind: PoolKind,
    [k, st, p]: [usize; 3],
    g: ActGrid,
    r: Rounding,
) -> Vec<i8> {
    let [c, h, w] = s;
    let z = g.zero_point - g.offset();
    let mut out = Vec::with_capacity(o.iter().product());
    for ch in 0..c {
        let plane = &x[ch * h * w..(ch + 1) * h * w];
        for oy in 0..o[1] {
            for ox in 0..o[2] {
                let (y0, x0) = ((oy * st) as isize - p as isize, (ox * st) as isize - p as isize);
                let (mut best, mut sum, mut cnt) = (i32::MIN, 0i32, 0i32);
                for y in y0.max(0)..(y0 + k as isize).min(h as isize) {
                    for xx in x0.max(0)..(x0 + k as isize).min(w as isize) {
                        let q = i32::from(plane[y as usize * w + xx as usize]);
                        best = best.max(q);
                        sum += q - z;
                        cnt += 1;
                    }
                }
                let q = match kind {
                    PoolKind::Max => best,
                    PoolKind::Avg => div_round(sum, cnt.max(1), r) + z,
                };
                out.push(q.clamp(-128, 127) as i8);
            }
        }
    }
    out
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
