//! One node of one image: the integer arithmetic of each node kind, on the kernels the
//! runtime was prepared with.

use crate::fixed::{FixedMultiplier, requantize};
use crate::model::{ActGrid, ConvNode, Node, PoolKind};

use super::{Kernels, Prepared, Runtime, direct, fast, round_f32, simd, store};

impl Runtime<'_> {
    /// Node `i` of one image, from the values before it (a classifier writes `logits` and
    /// returns no value).
    pub(super) fn eval_node(
        &self,
        i: usize,
        image: &[f32],
        values: &[Vec<i8>],
        logits: &mut Vec<i32>,
    ) -> Vec<i8> {
        match &self.model.graph.nodes[i] {
            Node::Input { grid } => self.input(image, grid),
            Node::Conv(c) => self.conv(i, c, values),
            Node::Pool { input, kind, kernel, stride, padding } => {
                self.pool(i, *input, *kind, [*kernel, *stride, *padding], values)
            }
            Node::Add { inputs, out } => self.add(i, inputs, out, values),
            Node::Concat { inputs, out } => self.concat(i, inputs, out, values),
            Node::Zero { out, .. } => {
                vec![store(out.zero_point, out); self.shapes[i].iter().product()]
            }
            Node::GlobalAvgPool { input, multiplier, out } => {
                self.global_avg_pool(*input, *multiplier, out, values)
            }
            Node::Linear { input, multipliers, .. } => {
                *logits = self.linear(i, *input, multipliers, values);
                Vec::new()
            }
        }
    }

    /// The image quantized onto the input grid.
    fn input(&self, image: &[f32], grid: &ActGrid) -> Vec<i8> {
        let (r, inv) = (self.model.graph.rounding, 1.0 / grid.scale);
        image
            .iter()
            .map(|&x| {
                let q = round_f32(x * inv, r).clamp(-1e9, 1e9) as i32;
                store(q.saturating_add(grid.zero_point), grid)
            })
            .collect()
    }

    fn conv(&self, i: usize, c: &ConvNode, values: &[Vec<i8>]) -> Vec<i8> {
        let r = self.model.graph.rounding;
        let (x, s) = (&values[c.input], self.shapes[c.input]);
        match &self.prepared[i] {
            Prepared::Plan(plan) => plan.run(c, x, s, self.shapes[i], r),
            Prepared::Weights { w, bias } => direct::conv(c, x, s, self.grid(c.input), w, bias, r),
            _ => unreachable!("every convolution is prepared"),
        }
    }

    fn pool(
        &self,
        i: usize,
        input: usize,
        kind: PoolKind,
        window: [usize; 3],
        values: &[Vec<i8>],
    ) -> Vec<i8> {
        let (r, g) = (self.model.graph.rounding, self.grid(input));
        let (x, s) = (&values[input], self.shapes[input]);
        if self.kernels == Kernels::Fast {
            let [_, oh, ow] = self.shapes[i];
            let max = kind == PoolKind::Max;
            fast::pool(x, s, [oh, ow], window, max, g.zero_point - g.offset(), r)
        } else {
            direct::pool(x, s, self.shapes[i], kind, window, g, r)
        }
    }

    /// A sum: through the table of every stored pair (two operands), one table per operand,
    /// or, directly, each operand rescaled onto the output grid in i32.
    fn add(
        &self,
        i: usize,
        inputs: &[(usize, FixedMultiplier)],
        out: &ActGrid,
        values: &[Vec<i8>],
    ) -> Vec<i8> {
        match &self.prepared[i] {
            Prepared::Pairs(pairs) => {
                let (a, b) = (&values[inputs[0].0], &values[inputs[1].0]);
                a.iter()
                    .zip(b)
                    .map(|(&qa, &qb)| pairs[usize::from(qa as u8) << 8 | usize::from(qb as u8)])
                    .collect()
            }
            Prepared::Sum(tables) => {
                let operands: Vec<&[i8]> = inputs.iter().map(|(v, _)| &values[*v][..]).collect();
                let mut y = vec![0i8; operands[0].len()];
                simd::sum_tables(&operands, tables, out, &mut y);
                y
            }
            _ => {
                let r = self.model.graph.rounding;
                let n = values[inputs[0].0].len();
                let mut acc = vec![0i32; n];
                for (v, m) in inputs {
                    let g = self.grid(*v);
                    let z = g.zero_point - g.offset();
                    simd::add_scaled(&mut acc, &values[*v], z, m.lanes(r));
                }
                let mut y = vec![0i8; n];
                simd::store_sum(&acc, out, &mut y);
                y
            }
        }
    }

    /// A concatenation: each operand through its table, or rescaled onto the output grid.
    fn concat(
        &self,
        i: usize,
        inputs: &[(usize, FixedMultiplier)],
        out: &ActGrid,
        values: &[Vec<i8>],
    ) -> Vec<i8> {
        let len = inputs.iter().map(|(v, _)| values[*v].len()).sum();
        if let Prepared::Moves(tables) = &self.prepared[i] {
            let mut y = Vec::with_capacity(len);
            for ((v, _), t) in inputs.iter().zip(tables) {
                y.extend(values[*v].iter().map(|&q| t[usize::from(q as u8)]));
            }
            return y;
        }
        let r = self.model.graph.rounding;
        let mut y = vec![0i8; len];
        let mut at = 0;
        for (v, m) in inputs {
            let g = self.grid(*v);
            let z = g.zero_point - g.offset();
            let x = &values[*v];
            simd::rescale(x, z, m.lanes(r), out, &mut y[at..at + x.len()]);
            at += x.len();
        }
        y
    }

    fn global_avg_pool(
        &self,
        input: usize,
        multiplier: FixedMultiplier,
        out: &ActGrid,
        values: &[Vec<i8>],
    ) -> Vec<i8> {
        let (r, g) = (self.model.graph.rounding, self.grid(input));
        let z = g.zero_point - g.offset();
        let [c, h, w] = self.shapes[input];
        let x = &values[input];
        (0..c)
            .map(|ch| {
                let s: i32 =
                    x[ch * h * w..(ch + 1) * h * w].iter().map(|&q| i32::from(q) - z).sum();
                store(requantize(s, multiplier, out.zero_point, out.qmin, out.qmax, r), out)
            })
            .collect()
    }

    /// The classifier's int32 logits.
    fn linear(
        &self,
        i: usize,
        input: usize,
        multipliers: &[FixedMultiplier],
        values: &[Vec<i8>],
    ) -> Vec<i32> {
        let Prepared::Weights { w, bias } = &self.prepared[i] else {
            unreachable!("every classifier is prepared")
        };
        let (r, g) = (self.model.graph.rounding, self.grid(input));
        let z = g.zero_point - g.offset();
        let x: Vec<i32> = values[input].iter().map(|&q| i32::from(q) - z).collect();
        let k = x.len();
        multipliers
            .iter()
            .enumerate()
            .map(|(o, m)| {
                let acc: i32 = w[o * k..(o + 1) * k].iter().zip(&x).map(|(a, b)| a * b).sum();
                m.apply(acc.saturating_add(bias[o]), r)
            })
            .collect()
    }
}
