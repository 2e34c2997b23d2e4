//! The ranges an observer reads from a tensor (absolute maxima, minima and maxima, per tensor
//! or per channel) and torch.ao's grid from a range.

use burn::tensor::Tensor;

use super::fake_quant::MIN_SCALE;
use super::spec::QuantSpec;
use qdarts_kernels::reduce::{row_max, row_min};

/// Flattens `x` to `[C, rest]` along `axis` (or `[1, numel]` per tensor).
pub fn channel_rows<const D: usize>(x: Tensor<D>, axis: Option<usize>) -> Tensor<2> {
    let dims = x.dims();
    let numel: usize = dims.iter().product();
    match axis {
        None => x.reshape([1, numel]),
        Some(a) => {
            let c = dims[a];
            x.swap_dims(0, a).reshape([c, numel / c])
        }
    }
}

/// `row` (a per-row minimum or maximum) of each channel's values along `axis` (`None`: of the
/// whole tensor): the rows of `[C, rest]` ([`channel_rows`]) for the first axis or per
/// tensor; for a later axis the runs of each channel first, `[before·C, after]`, then their
/// `before` results per channel, so that the tensor is never moved to put its channels first
/// (a stacked quantizer's rows lie along axis 1 of whole activations). A minimum or maximum
/// is exact in any order: the same values either way.
fn per_channel<const D: usize>(
    x: Tensor<D>,
    axis: Option<usize>,
    row: fn(Tensor<2>) -> Tensor<1>,
) -> Tensor<1> {
    let dims = x.dims();
    match axis {
        Some(a) if a > 0 => {
            let c = dims[a];
            let before: usize = dims[..a].iter().product();
            let after = dims.iter().product::<usize>() / (before * c);
            let runs = row(x.reshape([before * c, after])).reshape([before, c]);
            row(runs.swap_dims(0, 1))
        }
        _ => row(channel_rows(x, axis)),
    }
}

/// Per-channel (or per-tensor) max |x|, shape `[C]` (or `[1]`).
pub fn abs_max<const D: usize>(x: Tensor<D>, axis: Option<usize>) -> Tensor<1> {
    per_channel(x.detach().abs(), axis, row_max)
}

pub(super) fn min_max<const D: usize>(x: Tensor<D>, axis: Option<usize>) -> (Tensor<1>, Tensor<1>) {
    let x = x.detach();
    (per_channel(x.clone(), axis, row_min), per_channel(x, axis, row_max))
}

/// torch.ao's zero point of a symmetric grid: 0 signed, the middle of the range unsigned.
pub(super) fn symmetric_zero_point(spec: &QuantSpec) -> f32 {
    let (qmin, qmax) = spec.quant_range();
    if spec.signed() { 0.0 } else { ((qmin + qmax + 1) / 2) as f32 }
}

/// torch.ao `_calculate_qparams`: scale and zero point from a min and a max.
pub fn qparams_from_min_max(
    min: Tensor<1>,
    max: Tensor<1>,
    spec: &QuantSpec,
) -> (Tensor<1>, Tensor<1>) {
    let (qmin, qmax) = spec.quant_range();
    let (qmin_f, qmax_f) = (qmin as f32, qmax as f32);
    let min_neg = min.clamp_max(0.0);
    let max_pos = max.clamp_min(0.0);
    if spec.is_symmetric() {
        let max_abs = min_neg.neg().max_pair(max_pos);
        let scale = max_abs.div_scalar((qmax_f - qmin_f) / 2.0).clamp_min(MIN_SCALE);
        let zero_point = scale.zeros_like().add_scalar(symmetric_zero_point(spec));
        (scale, zero_point)
    } else {
        let scale = max_pos.sub(min_neg.clone()).div_scalar(qmax_f - qmin_f).clamp_min(MIN_SCALE);
        let zero_point =
            min_neg.div(scale.clone()).round().neg().add_scalar(qmin_f).clamp(qmin_f, qmax_f);
        (scale, zero_point)
    }
}
