//! `qdarts bench quant`: fake-quant throughput per observer, per tensor and per channel,
//! forward and forward+backward, against a plain elementwise copy of the same tensor; and the
//! bare fake-quant op, composite expression against the fused kernel.

use std::path::Path;

use anyhow::Result;
use burn::tensor::{DType, Device, Distribution, Tensor};
use qdarts_ops::quant::{
    FakeQuantImpl, FakeQuantizer, Granularity, Grid, ObserverKind, QuantSpec, RoundMode,
    TensorRole, fake_quant_with,
};

use super::timing::{Timing, settle, time_reps, write_csv};
use crate::backend::Backend;

/// Which passes a row times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// Forward only.
    Fwd,
    /// Forward and backward.
    FwdBwd,
}

impl Pass {
    /// Its column text.
    pub fn name(self) -> &'static str {
        match self {
            Pass::Fwd => "fwd",
            Pass::FwdBwd => "fwd+bwd",
        }
    }
}

/// One timed configuration.
#[derive(Debug, Clone)]
pub struct QuantRow {
    pub what: String,
    pub granularity: &'static str,
    pub pass: Pass,
    pub median_s: f64,
    pub min_s: f64,
    pub max_s: f64,
    pub numel: usize,
}

impl QuantRow {
    pub fn elems_per_s(&self) -> f64 {
        self.numel as f64 / self.median_s
    }
    /// Nominal traffic: one f32 read and one f32 write per element (per pass direction).
    pub fn gb_per_s(&self) -> f64 {
        let dirs = if self.pass == Pass::Fwd { 1.0 } else { 2.0 };
        dirs * 8.0 * self.numel as f64 / self.median_s / 1e9
    }
}

pub fn quant_rows(shape: [usize; 4], reps: usize, device: &Device) -> Result<Vec<QuantRow>> {
    let numel: usize = shape.iter().product();
    let per_channel = Granularity::PerChannel { axis: 1 };
    let configs: Vec<(ObserverKind, Granularity)> = vec![
        (ObserverKind::AbsMax, Granularity::PerTensor),
        (ObserverKind::MovingAverageAbsMax { rate: 0.9 }, Granularity::PerTensor),
        (ObserverKind::MinMax, Granularity::PerTensor),
        (ObserverKind::Lsq, Granularity::PerTensor),
        (ObserverKind::ChannelWiseAbsMax, per_channel),
        (ObserverKind::MinMax, per_channel),
        (ObserverKind::Lsq, per_channel),
    ];
    let gran_name = |g: Granularity| match g {
        Granularity::PerTensor => "per-tensor",
        Granularity::PerChannel { .. } => "per-channel",
    };
    let mut rows = Vec::new();
    let x = Tensor::<4>::random(shape, Distribution::Normal(0.0, 1.0), device);
    let row = |what: String, granularity, pass, t: Timing| QuantRow {
        what,
        granularity,
        pass,
        median_s: t.median,
        min_s: t.min,
        max_s: t.max,
        numel,
    };

    // Baseline: the cheapest elementwise op that writes a new tensor.
    let t = time_reps(reps, || {
        settle(x.clone().add_scalar(0.0));
        Ok(())
    })?;
    rows.push(row("copy (x + 0)".into(), "-", Pass::Fwd, t));
    let ad = device.clone().autodiff();
    let xa = Tensor::<4>::from_inner(x.clone());
    let t = time_reps(reps, || {
        let xg = xa.clone().require_grad();
        let grads = xg.clone().add_scalar(0.0).sum().backward();
        if let Some(g) = xg.grad(&grads) {
            settle(g);
        }
        Ok(())
    })?;
    rows.push(row("copy (x + 0)".into(), "-", Pass::FwdBwd, t));

    // The fake-quant op alone on a fixed grid: composite expression against the fused kernel.
    for granularity in [Granularity::PerTensor, per_channel] {
        let c = granularity.axis().map_or(1, |a| shape[a]);
        let steps: Vec<f32> = (0..c).map(|k| 0.02 + 0.001 * k as f32).collect();
        let grid_on = |dev: &Device| {
            Grid::from_step(
                Tensor::from_floats(steps.as_slice(), dev),
                Tensor::<1>::zeros([c], dev),
                (-128, 127),
                RoundMode::TiesToEven,
                granularity.axis(),
            )
        };
        let (grid, grid_ad) = (grid_on(device), grid_on(&ad));
        // A backend without the fused kernel would time the composite twice: leave it out.
        let imps = if qdarts_ops::quant::fused_available(device, DType::F32) {
            vec![FakeQuantImpl::Composite, FakeQuantImpl::Fused]
        } else {
            vec![FakeQuantImpl::Composite]
        };
        for imp in imps {
            let name = match imp {
                FakeQuantImpl::Composite => "kernel: composite",
                FakeQuantImpl::Fused => "kernel: fused",
            };
            let t = time_reps(reps, || {
                settle(fake_quant_with(x.clone(), &grid, imp));
                Ok(())
            })?;
            rows.push(row(name.into(), gran_name(granularity), Pass::Fwd, t));
            let t = time_reps(reps, || {
                let xg = xa.clone().require_grad();
                let grads = fake_quant_with(xg.clone(), &grid_ad, imp).sum().backward();
                if let Some(g) = xg.grad(&grads) {
                    settle(g);
                }
                Ok(())
            })?;
            rows.push(row(name.into(), gran_name(granularity), Pass::FwdBwd, t));
        }
    }

    // Whole quantizers: observer update + the process-wide kernel.
    for (observer, granularity) in configs {
        let s = QuantSpec::with(8, true, true, granularity, observer)?;
        let fq = FakeQuantizer::new(s, "bench", TensorRole::Act, shape[1], device)?;
        let t = time_reps(reps, || {
            settle(fq.try_forward(x.clone())?);
            Ok(())
        })?;
        rows.push(row(observer.name().to_string(), gran_name(granularity), Pass::Fwd, t));

        let fq = FakeQuantizer::new(s, "bench", TensorRole::Act, shape[1], &ad)?;
        let t = time_reps(reps, || {
            let xg = xa.clone().require_grad();
            let out = fq.try_forward(xg.clone())?;
            let grads = out.sum().backward();
            if let Some(g) = xg.grad(&grads) {
                settle(g);
            }
            Ok(())
        })?;
        rows.push(row(observer.name().to_string(), gran_name(granularity), Pass::FwdBwd, t));
    }
    Ok(rows)
}

pub fn render(rows: &[QuantRow]) -> String {
    let copy = |pass: Pass| {
        rows.iter().find(|r| r.what.starts_with("copy") && r.pass == pass).map(|r| r.median_s)
    };
    let mut out = format!(
        "{:<24} {:<12} {:<8} {:>10} {:>19} {:>10} {:>7} {:>8}\n",
        "observer", "granularity", "pass", "median ms", "min..max ms", "Melem/s", "GB/s", "x copy"
    );
    for r in rows {
        let ratio = copy(r.pass).map(|c| r.median_s / c).unwrap_or(f64::NAN);
        out.push_str(&format!(
            "{:<24} {:<12} {:<8} {:>10.1} {:>19} {:>10.1} {:>7.2} {:>8.2}\n",
            r.what,
            r.granularity,
            r.pass.name(),
            r.median_s * 1e3,
            format!("{:.1}..{:.1}", r.min_s * 1e3, r.max_s * 1e3),
            r.elems_per_s() / 1e6,
            r.gb_per_s(),
            ratio
        ));
    }
    out
}

pub fn write_quant_csv(
    path: &Path,
    backend: Backend,
    shape: [usize; 4],
    rows: &[QuantRow],
) -> Result<()> {
    /// One row of `bench quant --csv`.
    #[derive(serde::Serialize)]
    struct Row<'a> {
        backend: String,
        shape: &'a str,
        observer: &'a str,
        granularity: &'a str,
        pass: &'a str,
        median_s: f64,
        min_s: f64,
        max_s: f64,
        elems_per_s: f64,
        gb_per_s: f64,
    }
    let shape = format!("{}x{}x{}x{}", shape[0], shape[1], shape[2], shape[3]);
    let lines = rows.iter().map(|r| Row {
        backend: backend.label(),
        shape: &shape,
        observer: &r.what,
        granularity: r.granularity,
        pass: r.pass.name(),
        median_s: r.median_s,
        min_s: r.min_s,
        max_s: r.max_s,
        elems_per_s: r.elems_per_s(),
        gb_per_s: r.gb_per_s(),
    });
    write_csv(path, lines)
}
