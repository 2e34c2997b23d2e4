//! Conv and linear nodes: integer weights per output channel, BatchNorm folded in, int32
//! biases at the accumulator scale, fixed-point rescales onto the output grid.

use burn::tensor::Tensor;
use qdarts_frozen::qdf::{DType, QTensor as FTensor};
use qdarts_frozen::{ActGrid, ConvNode, Node};
use qdarts_ops::candidates::{QBatchNorm, QConv};
use qdarts_ops::network::QLinear;

use super::{FreezeError, Freezer, err, fixed, floats};

impl Freezer<'_> {
    /// A conv (and the BN after it, if any) from value `input` onto `out`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn conv(
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
        let bits = conv.wq.as_ref().map_or(8, |q| q.spec().bits());
        let step = |c: usize| f64::from(if steps.len() == 1 { steps[0] } else { steps[c] });
        let (bw, bb) = match bn {
            Some((bn, range)) => {
                let (w, b) = bn.folded(&Tensor::<4>::zeros([1, 1, 1, 1], self.device));
                let (w, b) = (floats(w, name)?, floats(b, name)?);
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
            (out, bits),
        )
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn conv_node(
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
        (out, weight_bits): (ActGrid, u32),
    ) -> Result<usize, FreezeError> {
        let [co, cig, kh, kw] = dims;
        let per = cig * kh * kw;
        // The weights' range, [−half, half − 1].
        let half = 1i32 << (weight_bits - 1);
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
            // A negative scale (BN weight γ < 0) flips the channel: its integers are negated,
            // or, when one of them is −half (e.g. −128, whose negation is not an int8), kept as they are
            // with a negative weight scale, which the runtime applies as a sign.
            let mut sign = 1.0;
            let unit = if e.abs() < s_out * 1e-6 {
                row.fill(0);
                s_out * 2f64.powi(-20)
            } else {
                if e < 0.0 {
                    if row.contains(&-half) {
                        sign = -1.0;
                    } else {
                        row.iter_mut().for_each(|v| *v = -*v);
                    }
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
            wscale.push((sign * unit / s_in) as f32);
            bscale.push(unit as f32);
        }
        if q.iter().any(|v| !(-half..half).contains(v)) {
            return Err(err(format!("{name}: weights do not fit {weight_bits} bits")));
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
            weight_bits,
        });
        Ok(self.push(node, out))
    }

    pub(super) fn classifier(
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
        let b = floats(lin.bias.val(), "classifier.bias")?;
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
