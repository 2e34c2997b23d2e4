//! A quantized add of several operands in one launch on the CubeCL backends (`n` for more
//! than [`ARITY`](crate::cat::ARITY) operands).
//!
//! An integer add rounds every operand onto the output grid on its own (rescaled with its own
//! multiplier), adds the integers, then the zero point, and clamps (`qdarts_ops`'
//! `fake_quant_sum`). As tensor expressions that is about `7n + 9` launches forward for `n`
//! operands (a product and a rounding per operand, the sums, the range tests, the clamp, the
//! dequantization, a zero-valued gradient term per operand) and `n` backward (each operand's
//! gradient masked on its own, to the same values). Here:
//!
//! - forward: one launch that reads every operand, adds `Σ round(x_i · mult)` in the operands'
//!   order, then the zero point, keeps that unclamped sum `r` and writes
//!   `(clamp(r) − zp) · step`; past [`ARITY`](crate::cat::ARITY) operands, one launch per
//!   operand but the last, `acc = Σ round(x_i · mult)` in place, then one that adds the last
//!   operand and the zero point and writes the same;
//! - backward: one launch, `grad · [qmin ≤ r ≤ qmax]`, handed to the float sum of the operands
//!   (which the caller computed for its observer), whose adds pass it to every operand as it
//!   is: the gradient the expressions give each of them.
//!
//! The arithmetic is the expressions', operation for operation in f32, in their order; the
//! rounding is spelled out exactly as in the fused fake quantization.

use burn::tensor::{DType, Device, Tensor};

use crate::fake_quant::FusedLayout;

/// Whether [`fake_quant_sum`] runs for tensors on `device` with this dtype: f32 on a CubeCL
/// backend.
pub fn quant_sum_available(device: &Device, dtype: DType) -> bool {
    dtype == DType::F32 && crate::support::on_cube(device)
}

/// The quantized sum of `xs` (at least two, of one shape) on the grid (`mult`, `step`,
/// `zero_point`, each `[1]` or `[layout.channels]`, not differentiated): every operand rounded
/// onto the grid on its own, the integers added, then the zero point, clamped and dequantized.
/// The gradient reaches `sum`, which must be the float sum of `xs` (its adds hand it to every
/// operand): the upstream gradient where the unclamped integer sum lies in range, else 0.
///
/// Returns the dequantized sum and the unclamped integer sum `r` (zero point included; not
/// differentiated), from which the caller can tell what was clipped.
///
/// # Panics
/// If [`quant_sum_available`] is false for `sum`, or `xs` has fewer than two operands.
pub fn fake_quant_sum<const D: usize>(
    sum: Tensor<D>,
    xs: &[Tensor<D>],
    [mult, step, zero_point]: [&Tensor<1>; 3],
    layout: FusedLayout,
) -> (Tensor<D>, Tensor<D>) {
    assert!(
        quant_sum_available(&sum.device(), sum.dtype()),
        "the quantized sum kernels are not available on {:?} for {:?}",
        sum.device(),
        sum.dtype()
    );
    let Some((last, rest)) = xs.split_last().filter(|(_, rest)| !rest.is_empty()) else {
        panic!("a quantized sum needs at least two operands, got {}", xs.len());
    };
    #[cfg(feature = "cube")]
    {
        use burn::backend::Dispatch;

        let param = |p: &Tensor<1>| layout.param(p);
        let mult = param(mult);
        if xs.len() <= crate::cat::ARITY {
            let count = xs.len();
            let operands = xs.iter().map(|x| x.clone().into_dispatch()).collect();
            let [x0, x1, x2, x3, x4, x5, x6, x7] = crate::cat::slots(operands);
            let (out, r) = <Dispatch as QuantSumBackend>::quant_sum_all(
                sum.into_dispatch(),
                x0,
                x1,
                x2,
                x3,
                x4,
                x5,
                x6,
                x7,
                count,
                mult,
                param(step),
                param(zero_point),
                layout,
            );
            return (Tensor::from_dispatch(out), Tensor::from_dispatch(r));
        }
        let mut acc = <Dispatch as QuantSumBackend>::quant_sum_start(
            rest[0].clone().into_dispatch(),
            mult.clone(),
            layout,
        );
        for x in &rest[1..] {
            acc = <Dispatch as QuantSumBackend>::quant_sum_add(
                acc,
                x.clone().into_dispatch(),
                mult.clone(),
                layout,
            );
        }
        let (out, r) = <Dispatch as QuantSumBackend>::quant_sum_finish(
            sum.into_dispatch(),
            acc,
            last.clone().into_dispatch(),
            mult,
            param(step),
            param(zero_point),
            layout,
        );
        (Tensor::from_dispatch(out), Tensor::from_dispatch(r))
    }
    #[cfg(not(feature = "cube"))]
    unreachable!(
        "quant_sum_available is false without the CubeCL backends: {last:?} {rest:?} {mult:?} \
         {step:?} {zero_point:?} {layout:?}"
    )
}

#[cfg(feature = "cube")]
pub use extension::QuantSumBackend;

#[cfg(feature = "cube")]
mod cube;

#[cfg(feature = "cube")]
mod extension;
