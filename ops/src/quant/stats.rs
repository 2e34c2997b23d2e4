//! Quantization error statistics: MSE, SQNR and clip fraction of the last tensor a quantizer saw.
//!
//! Recording is off by default. A pass that records gives its quantizers an [`ErrorTape`]:
//! each keeps a handful of scalar tensors on it, on the device (no host sync in the training
//! step), which the quantizer's `error_rows` brings back on request.

use std::cell::RefCell;
use std::collections::HashMap;

use burn::tensor::Tensor;
use qdarts_kernels::reduce::sum_all;
pub use qdarts_record::{QuantError, TensorRole};

use super::error::SpecError;
use super::fake_quant::{Grid, Quantized, quantize};
use super::pass::SiteKey;
use super::spec::QuantSpec;

/// SQNR reported when the quantization is exact (zero noise), and its negative when there is
/// noise but no signal: the value stays finite so plots and CSV readers never see inf or NaN.
pub const SQNR_CAP_DB: f64 = 200.0;

/// SQNR in dB from the signal and noise energies, finite in every case.
pub fn sqnr_db(signal: f64, noise: f64) -> f64 {
    if noise <= 0.0 {
        SQNR_CAP_DB
    } else if signal <= 0.0 {
        -SQNR_CAP_DB
    } else {
        (10.0 * (signal / noise).log10()).clamp(-SQNR_CAP_DB, SQNR_CAP_DB)
    }
}

#[derive(Debug, Clone)]
struct Recorded {
    /// Per row, `[rows]`.
    signal: Tensor<1>,
    noise: Tensor<1>,
    clipped: Tensor<1>,
    numel: usize,
    step: Tensor<1>,
    zero_point: Tensor<1>,
}

/// One of the sites a quantizer stands for when it quantizes several sites' tensors side by
/// side (the batched cell's waves): a contiguous run of channels along its
/// [`RowLayout::axis`], with its own layer path and error row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// The site's layer path.
    pub path: String,
    /// Its number of values, where its run holds more (a filter zero-padded to a larger
    /// kernel); `None`: the run's.
    pub numel: Option<usize>,
    /// The paths of sites that see the same tensor from the same state and so are this row
    /// (a pool that every edge reading one state would compute alike): each gets its copy of
    /// the error row.
    pub also: Vec<String>,
}

impl Row {
    /// A row at `path` counting the values of its run.
    pub fn new(path: impl Into<String>) -> Self {
        Row { path: path.into(), numel: None, also: Vec::new() }
    }
}

/// Rows of a tensor: `rows` equal runs of its `axis`, each with the dimensions after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowLayout {
    /// The axis the rows split.
    pub axis: usize,
    /// How many.
    pub rows: usize,
}

impl RowLayout {
    /// `x`'s sum per row, `[rows]`; one layout of none, the sum of all.
    fn sums<const D: usize>(layout: Option<Self>, x: Tensor<D>) -> Tensor<1> {
        let Some(RowLayout { axis, rows }) = layout else { return sum_all(x) };
        let dims = x.dims();
        let before: usize = dims[..axis].iter().product();
        let numel: usize = dims.iter().product();
        x.reshape([before, rows, numel / (before * rows)]).sum_dim(2).sum_dim(0).reshape([rows])
    }
}

/// The error statistics of one recorded forward pass: each quantizer's last tensor, kept on the
/// device (a handful of reductions, no host sync in the training step) until the quantizers'
/// `error_rows` bring them back. A pass records on it through its
/// [`QuantPass`](super::QuantPass); it belongs to the pass's caller, not to a quantizer.
#[derive(Debug, Default)]
pub struct ErrorTape {
    kept: RefCell<HashMap<SiteKey, Recorded>>,
}

impl ErrorTape {
    /// Keeps the error of `out` against `x` (device tensors only) when recording. Without `qz`
    /// (the fused kernel keeps no mask), the clip fraction is recomputed from `x` and `grid`.
    /// With `rows`, the energies and clip counts are kept per row.
    pub(crate) fn record<const D: usize>(
        &self,
        key: SiteKey,
        x: &Tensor<D>,
        out: &Tensor<D>,
        qz: Option<&Quantized<D>>,
        grid: &Grid,
        rows: Option<RowLayout>,
    ) {
        let x = x.clone().detach();
        let noise = x.clone().sub(out.clone().detach());
        let recorded = Recorded {
            signal: RowLayout::sums(rows, x.clone().square()),
            noise: RowLayout::sums(rows, noise.square()),
            clipped: match qz {
                Some(qz) => RowLayout::sums(rows, qz.in_range.clone().bool_not().float()),
                None => {
                    RowLayout::sums(rows, quantize(x.clone(), grid).in_range.bool_not().float())
                }
            },
            numel: x.dims().iter().product(),
            step: grid.step.clone().detach(),
            zero_point: grid.zero_point.clone().detach(),
        };
        self.kept.borrow_mut().insert(key, recorded);
    }

    /// The statistics the quantizer `key` recorded last, read back to the host: one error row
    /// for each of `rows`, in order (kept per row where the quantizer stands for several sites,
    /// [`RowLayout`]; none: nothing recorded). A grid parameter of several values per row (per
    /// channel) reads as their mean, as one site's does.
    pub(crate) fn read_rows(
        &self,
        key: SiteKey,
        rows: &[Row],
        role: TensorRole,
        spec: &QuantSpec,
    ) -> Result<Vec<QuantError>, SpecError> {
        let Some(last) = self.kept.borrow().get(&key).cloned() else {
            return Ok(Vec::new());
        };
        let what = rows.first().map_or("", |r| r.path.as_str());
        let read = |t: Tensor<1>, name: &str| -> Result<Vec<f64>, SpecError> {
            let v = t
                .try_to_vec_as::<f32>()
                .map_err(|e| SpecError::ReadBack(format!("{what} {name}: {e:?}")))?;
            Ok(v.into_iter().map(f64::from).collect())
        };
        // The mean of row `r`'s part of `v` (a scalar per row, or its channels' values).
        let mean = |v: &[f64], r: usize| -> f64 {
            let per = v.len() / rows.len();
            if per == 0 {
                return 0.0;
            }
            v[r * per..(r + 1) * per].iter().sum::<f64>() / per as f64
        };
        let (signal, noise) =
            (read(last.signal, "signal energy")?, read(last.noise, "noise energy")?);
        let clipped = read(last.clipped, "clipped count")?;
        let (step, zero_point) = (read(last.step, "step")?, read(last.zero_point, "zero point")?);
        let run = last.numel / rows.len().max(1);
        Ok(rows
            .iter()
            .enumerate()
            .flat_map(|(r, row)| {
                let n = row.numel.unwrap_or(run).max(1) as f64;
                let (signal, noise) = (mean(&signal, r), mean(&noise, r));
                let error = |layer: &String| QuantError {
                    layer: layer.clone(),
                    kind: role,
                    bits: spec.bits(),
                    scale: mean(&step, r),
                    zero_point: mean(&zero_point, r),
                    mse: noise / n,
                    sqnr_db: sqnr_db(signal, noise),
                    clip_frac: mean(&clipped, r) / n,
                };
                std::iter::once(&row.path).chain(&row.also).map(error).collect::<Vec<_>>()
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqnr_is_finite_at_the_edges() {
        assert_eq!(sqnr_db(0.0, 0.0), SQNR_CAP_DB);
        assert_eq!(sqnr_db(1.0, 0.0), SQNR_CAP_DB);
        assert_eq!(sqnr_db(0.0, 1.0), -SQNR_CAP_DB);
        // 10·log10(100/1) = 20 dB by hand.
        assert!((sqnr_db(100.0, 1.0) - 20.0).abs() < 1e-12);
    }
}
