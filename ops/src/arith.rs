//! Quantized elementwise add and concat with any number of operands, and an integer-only softmax.
//!
//! Add and concat put their operands on the output's grid (each operand rescaled with its own
//! multiplier) before combining them, as the integer runtime does. The softmax follows I-BERT
//! (Kim et al., 2021): `exp` from a shift and a second-order polynomial, then an integer
//! division.

use burn::module::Module;
use burn::tensor::{Tensor, TensorData};

use crate::candidates::{Ctx, QTensor, QuantSites};
use crate::qconfig::Site;
use crate::quant::{FakeQuantizer, QuantPass, SpecError};
use qdarts_kernels::cat::cat;

/// `Σ x_i`, requantized onto the output grid.
#[derive(Module, Debug)]
pub struct QAdd {
    /// Output quantizer (`<path>.act`).
    pub act: Option<FakeQuantizer>,
}

impl QAdd {
    /// An add at `ctx.path`.
    pub fn new(ctx: &Ctx) -> Result<Self, SpecError> {
        Ok(QAdd { act: ctx.quantizer(Site::Act, "act", 1)? })
    }

    /// # Shapes
    /// - xs: one or more `[N, C, H, W]` of one shape; output: the same shape.
    ///
    /// # Panics
    /// If `xs` is empty.
    pub fn forward(&self, xs: Vec<QTensor>) -> QTensor {
        self.forward_in(xs, QuantPass::OFF)
    }

    /// [`forward`](Self::forward) in the quantizer pass `qp`.
    ///
    /// # Panics
    /// If `xs` is empty.
    pub fn forward_in(&self, xs: Vec<QTensor>, qp: QuantPass) -> QTensor {
        let values: Vec<Tensor<4>> = xs.into_iter().map(|x| x.value).collect();
        let Some(sum) = values.iter().cloned().reduce(|a, b| a.add(b)) else {
            panic!("QAdd needs at least one operand");
        };
        self.forward_summed(&values, sum, qp)
    }

    /// [`forward_in`](Self::forward_in) of operands whose float sum the caller has
    /// computed (`xs` added left to right): the gradient goes through `sum` alone, and only the
    /// values of `xs` are read (they may be detached).
    ///
    /// # Shapes
    /// - xs: one or more `[N, C, H, W]` of one shape; sum and output: the same shape.
    ///
    /// # Panics
    /// If `xs` is empty.
    pub fn forward_summed(&self, xs: &[Tensor<4>], sum: Tensor<4>, qp: QuantPass) -> QTensor {
        match &self.act {
            Some(q) => {
                let (value, grid) = q.forward_summed(xs, sum, qp);
                QTensor { value, grid: Some(grid) }
            }
            None => {
                assert!(!xs.is_empty(), "QAdd needs at least one operand");
                QTensor::float(sum)
            }
        }
    }
}

impl QuantSites for QAdd {
    fn quantizers(&self) -> Vec<&FakeQuantizer> {
        self.act.iter().collect()
    }
}

/// Concatenation along channels on one common output grid.
#[derive(Module, Debug)]
pub struct QConcat {
    /// Output quantizer (`<path>.act`).
    pub act: Option<FakeQuantizer>,
}

impl QConcat {
    /// A concat at `ctx.path`.
    pub fn new(ctx: &Ctx) -> Result<Self, SpecError> {
        Ok(QConcat { act: ctx.quantizer(Site::Act, "act", 1)? })
    }

    /// Requantizing every operand on the common per-tensor grid is the same elementwise
    /// operation as quantizing their concatenation, which is what this does.
    ///
    /// # Shapes
    /// - xs: `[N, C_i, H, W]`; output: `[N, ΣC_i, H, W]`.
    pub fn forward(&self, xs: Vec<QTensor>) -> QTensor {
        self.forward_in(xs, QuantPass::OFF)
    }

    /// [`forward`](Self::forward) in the quantizer pass `qp`.
    pub fn forward_in(&self, xs: Vec<QTensor>, qp: QuantPass) -> QTensor {
        let cat = cat(xs.into_iter().map(|x| x.value).collect(), 1);
        crate::candidates::quantize_opt(&self.act, cat, qp)
    }
}

impl QuantSites for QConcat {
    fn quantizers(&self) -> Vec<&FakeQuantizer> {
        self.act.iter().collect()
    }
}

/// I-BERT's fit of `exp` on `[−ln 2, 0]`: `0.35815147·(x + b)·x + c` written as
/// `a·((x + b')·x + c')`.
const EXP_A: f64 = 0.358_151_47;
const EXP_B: f64 = 0.969_632_38 / EXP_A;
const EXP_C: f64 = 1.0 / EXP_A;
/// `exp` is cut off below `−30·ln 2` (I-BERT's `n = 30`).
const EXP_CUT: i64 = 30;

/// Integer `exp` of `q·scale` for `q <= 0` (I-BERT `int_exp`): `q = −z·⌊ln2/S⌋ + r`, a
/// polynomial in `r`, shifted right by `z`. Returns integers on the scale `a·S²`.
fn int_exp(q: i64, ln2_int: i64, b_int: i64, c_int: i64) -> i64 {
    let q = q.max(EXP_CUT * ln2_int);
    let z = q / ln2_int; // both negative: z >= 0, truncation is floor here
    let r = q - ln2_int * z; // in (ln2_int, 0]
    let p = (r + b_int) * r + c_int;
    (p >> z).max(0)
}

/// Finest input scale the integer exp works at. A coarse scale (8-bit logits have S ≈ 0.03)
/// makes `⌊b'/S⌋` and `⌊c'/S²⌋` lose about 1 % of the polynomial's coefficients; I-BERT avoids
/// it by feeding softmax a 32-bit accumulator scale. Here the input integers are shifted left
/// (exactly) until the scale is at most this.
const FINE_SCALE: f64 = 1.0 / 1024.0;

/// Integer softmax of one row of integers `q` on input scale `scale`; the result is integers on
/// the scale `1/levels` (e.g. 255 for the 8-bit `[0, 1]` grid), rounded half up.
///
/// Only integer arithmetic after the constants: the shift `k` that brings `S/2^k` under
/// `FINE_SCALE`, `⌊−ln2/S'⌋`, `⌊b'/S'⌋`, `⌊c'/S'²⌋`.
pub fn int_softmax(q: &[i64], scale: f64, levels: i64) -> Vec<i64> {
    let Some(&max) = q.iter().max() else { return vec![] };
    let shift = (scale / FINE_SCALE).log2().ceil().clamp(0.0, 20.0) as u32;
    let scale = scale / f64::from(1u32 << shift);
    let ln2_int = ((-std::f64::consts::LN_2 / scale).floor() as i64).min(-1);
    let b_int = (EXP_B / scale).floor() as i64;
    let c_int = (EXP_C / (scale * scale)).floor() as i64;
    let e: Vec<i64> =
        q.iter().map(|&v| int_exp((v - max) << shift, ln2_int, b_int, c_int)).collect();
    let sum: i64 = e.iter().sum::<i64>().max(1);
    e.iter().map(|&v| (2 * v * levels + sum) / (2 * sum)).collect()
}

/// Softmax over the last axis computed with [`int_softmax`]: inputs rounded onto the symmetric
/// `in_bits` grid of their row's range, outputs on the `[0, 1]` grid with `2^out_bits − 1`
/// levels. The gradient is the float softmax's (straight-through).
///
/// # Shapes
/// - x: `[R, K]`; output: `[R, K]`.
pub fn quantized_softmax(
    x: Tensor<2>,
    in_bits: u32,
    out_bits: u32,
) -> Result<Tensor<2>, SpecError> {
    let [rows, k] = x.dims();
    let device = x.device();
    let float = burn::tensor::activation::softmax(x.clone(), 1);
    let values: Vec<f32> = x
        .detach()
        .try_to_vec_as::<f32>()
        .map_err(|e| SpecError::ReadBack(format!("softmax input: {e:?}")))?;
    let qmax = ((1i64 << (in_bits - 1)) - 1) as f64;
    let levels = (1i64 << out_bits) - 1;
    let mut out = Vec::with_capacity(rows * k);
    for row in values.chunks(k) {
        let range = row.iter().fold(0f64, |m, &v| m.max((v as f64).abs()));
        let scale = (range / qmax).max(f32::EPSILON as f64);
        let q: Vec<i64> =
            row.iter().map(|&v| (v as f64 / scale).round_ties_even() as i64).collect();
        out.extend(int_softmax(&q, scale, levels).into_iter().map(|v| v as f32 / levels as f32));
    }
    let int = Tensor::<2>::from_data(TensorData::new(out, [rows, k]), &device);
    // Value: exactly the integer result; gradient: the float softmax's.
    Ok(int.add(float.clone().sub(float.detach())))
}
