//! Quantization error statistics: MSE, SQNR and clip fraction of the last tensor a quantizer saw.
//!
//! Recording is off by default. When on, the quantizer keeps a handful of scalar tensors on the
//! device (no host sync in the training step); [`Monitor::read`] brings them back on request.

use std::sync::{Arc, Mutex};

use burn::tensor::Tensor;
use qdarts_kernels::reduce::sum_all;
pub use qdarts_record::{QuantError, TensorRole};

use super::error::SpecError;
use super::fake_quant::{Grid, Quantized, quantize};
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
    signal: Tensor<1>,
    noise: Tensor<1>,
    clipped: Tensor<1>,
    numel: usize,
    step: Tensor<1>,
    zero_point: Tensor<1>,
}

#[derive(Debug, Default)]
struct MonitorState {
    recording: bool,
    last: Option<Recorded>,
}

/// Shared recording switch and last statistics of a quantizer.
#[derive(Debug, Clone, Default)]
pub struct Monitor {
    state: Arc<Mutex<MonitorState>>,
}

impl Monitor {
    /// Turns recording on or off.
    pub fn set_recording(&self, on: bool) {
        if let Ok(mut s) = self.state.lock() {
            s.recording = on;
        }
    }

    /// Whether recording is on.
    pub fn is_recording(&self) -> bool {
        self.state.lock().map(|s| s.recording).unwrap_or(false)
    }

    /// Keeps the error of `out` against `x` (device tensors only) when recording. Without `qz`
    /// (the fused kernel keeps no mask), the clip fraction is recomputed from `x` and `grid`.
    pub fn record<const D: usize>(
        &self,
        x: &Tensor<D>,
        out: &Tensor<D>,
        qz: Option<&Quantized<D>>,
        grid: &Grid,
    ) {
        let Ok(mut s) = self.state.lock() else { return };
        if !s.recording {
            return;
        }
        let x = x.clone().detach();
        let noise = x.clone().sub(out.clone().detach());
        s.last = Some(Recorded {
            signal: sum_all(x.clone().square()),
            noise: sum_all(noise.square()),
            clipped: match qz {
                Some(qz) => sum_all(qz.in_range.clone().bool_not().float()),
                None => sum_all(quantize(x.clone(), grid).in_range.bool_not().float()),
            },
            numel: x.dims().iter().product(),
            step: grid.step.clone().detach(),
            zero_point: grid.zero_point.clone().detach(),
        });
    }

    /// Reads the last statistics back to the host (`None`: nothing recorded).
    pub fn read(
        &self,
        path: &str,
        role: TensorRole,
        spec: &QuantSpec,
    ) -> Result<Option<QuantError>, SpecError> {
        let Some(last) = self.state.lock().ok().and_then(|s| s.last.clone()) else {
            return Ok(None);
        };
        // The mean of a tensor (a scalar, or a per-channel step or zero point).
        let scalar = |t: Tensor<1>, what: &str| -> Result<f64, SpecError> {
            let v = t
                .try_to_vec_as::<f32>()
                .map_err(|e| SpecError::ReadBack(format!("{path} {what}: {e:?}")))?;
            Ok(if v.is_empty() {
                0.0
            } else {
                v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64
            })
        };
        let signal = scalar(last.signal, "signal energy")?;
        let noise = scalar(last.noise, "noise energy")?;
        let n = last.numel.max(1) as f64;
        Ok(Some(QuantError {
            layer: path.to_string(),
            kind: role,
            bits: spec.bits(),
            scale: scalar(last.step, "step")?,
            zero_point: scalar(last.zero_point, "zero point")?,
            mse: noise / n,
            sqnr_db: sqnr_db(signal, noise),
            clip_frac: scalar(last.clipped, "clipped count")? / n,
        }))
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
