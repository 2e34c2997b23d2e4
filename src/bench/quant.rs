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

/// What every row of `bench quant` times on: the input, its autodiff twin and the devices.
struct Bench<'a> {
    x: Tensor<4>,
    xa: Tensor<4>,
    device: &'a Device,
    ad: Device,
    reps: usize,
    numel: usize,
}

impl Bench<'_> {
    fn row(&self, what: &str, granularity: Granularity, pass: Pass, t: Timing) -> QuantRow {
        QuantRow {
            what: what.into(),
            granularity: gran_name(granularity),
            pass,
            median_s: t.median,
            min_s: t.min,
            max_s: t.max,
            numel: self.numel,
        }
    }

    /// Times `f(x)` forward, and forward and backward to `x`'s gradient: two rows.
    fn fwd_bwd<F>(&self, what: &str, granularity: Granularity, f: F) -> Result<[QuantRow; 2]>
    where
        F: Fn(Tensor<4>, bool) -> Result<Tensor<4>>,
    {
        let fwd = time_reps(self.reps, || {
            settle(f(self.x.clone(), false)?);
            Ok(())
        })?;
        let bwd = time_reps(self.reps, || {
            let xg = self.xa.clone().require_grad();
            let grads = f(xg.clone(), true)?.sum().backward();
            if let Some(g) = xg.grad(&grads) {
                settle(g);
            }
            Ok(())
        })?;
        Ok([
            self.row(what, granularity, Pass::Fwd, fwd),
            self.row(what, granularity, Pass::FwdBwd, bwd),
        ])
    }
}

fn gran_name(g: Granularity) -> &'static str {
    match g {
        Granularity::PerTensor => "per-tensor",
        Granularity::PerChannel { .. } => "per-channel",
    }
}

pub fn quant_rows(shape: [usize; 4], reps: usize, device: &Device) -> Result<Vec<QuantRow>> {
    let x = Tensor::<4>::random(shape, Distribution::Normal(0.0, 1.0), device);
    let xa = Tensor::<4>::from_inner(x.clone());
    let ad = device.clone().autodiff();
    let bench = Bench { x, xa, device, ad, reps, numel: shape.iter().product() };
    let mut rows = Vec::new();
    // Baseline: the cheapest elementwise op that writes a new tensor. Its granularity column
    // reads "-".
    let copy =
        bench.fwd_bwd("copy (x + 0)", Granularity::PerTensor, |x, _| Ok(x.add_scalar(0.0)))?;
    rows.extend(copy.map(|r| QuantRow { granularity: "-", ..r }));
    rows.extend(kernel_rows(&bench, shape)?);
    rows.extend(quantizer_rows(&bench, shape)?);
    Ok(rows)
}

/// The fake-quant op alone on a fixed grid: composite expression against the fused kernel.
fn kernel_rows(bench: &Bench<'_>, shape: [usize; 4]) -> Result<Vec<QuantRow>> {
    let mut rows = Vec::new();
    for granularity in [Granularity::PerTensor, Granularity::PerChannel { axis: 1 }] {
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
        let (grid, grid_ad) = (grid_on(bench.device), grid_on(&bench.ad));
        // A backend without the fused kernel would time the composite twice: leave it out.
        let imps = if qdarts_ops::quant::fused_available(bench.device, DType::F32) {
            vec![FakeQuantImpl::Composite, FakeQuantImpl::Fused]
        } else {
            vec![FakeQuantImpl::Composite]
        };
        for imp in imps {
            let name = match imp {
                FakeQuantImpl::Composite => "kernel: composite",
                FakeQuantImpl::Fused => "kernel: fused",
            };
            rows.extend(bench.fwd_bwd(name, granularity, |x, ad| {
                Ok(fake_quant_with(x, if ad { &grid_ad } else { &grid }, imp))
            })?);
        }
    }
    Ok(rows)
}

/// Whole quantizers: observer update + the process-wide kernel.
fn quantizer_rows(bench: &Bench<'_>, shape: [usize; 4]) -> Result<Vec<QuantRow>> {
    let per_channel = Granularity::PerChannel { axis: 1 };
    let configs: [(ObserverKind, Granularity); 7] = [
        (ObserverKind::AbsMax, Granularity::PerTensor),
        (ObserverKind::MovingAverageAbsMax { rate: 0.9 }, Granularity::PerTensor),
        (ObserverKind::MinMax, Granularity::PerTensor),
        (ObserverKind::Lsq, Granularity::PerTensor),
        (ObserverKind::ChannelWiseAbsMax, per_channel),
        (ObserverKind::MinMax, per_channel),
        (ObserverKind::Lsq, per_channel),
    ];
    let mut rows = Vec::new();
    for (observer, granularity) in configs {
        let s = QuantSpec::with(8, true, true, granularity, observer)?;
        let fq = FakeQuantizer::new(s, "bench", TensorRole::Act, shape[1], bench.device)?;
        let fq_ad = FakeQuantizer::new(s, "bench", TensorRole::Act, shape[1], &bench.ad)?;
        rows.extend(bench.fwd_bwd(observer.name(), granularity, |x, ad| {
            Ok(if ad { &fq_ad } else { &fq }.try_forward(x)?)
        })?);
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
