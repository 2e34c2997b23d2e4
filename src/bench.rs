//! `qdarts bench`: throughput tables. Timings live here, never in unit tests.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use burn::tensor::{DType, Device, Distribution, Tensor};
use clap::Subcommand;
use qdarts_genotypes::Primitive;
use qdarts_ops::candidates::{CandidateOp, QTensor};
use qdarts_ops::qconfig::{Preset, QuantConfig};
use qdarts_ops::quant::{
    FakeQuantImpl, FakeQuantizer, Granularity, Grid, ObserverKind, QuantSpec, RoundMode,
    TensorRole, fake_quant_with,
};
use qdarts_search::architect::Batch;
use qdarts_search::config::ExperimentConfig;
use qdarts_search::search::{arch_step, build_optimizers, weight_step};
use qdarts_search::supernet::{Alphas, NetShape, SearchNetwork};

use crate::backend::Backend;

/// What to benchmark.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Fake-quant throughput per observer, per-tensor and per-channel, forward and
    /// forward+backward, against a plain elementwise copy of the same tensor.
    Quant {
        /// Tensor shape N,C,H,W (per-channel quantizes along C).
        #[arg(long, default_value = "64,64,56,56", value_parser = parse_shape)]
        shape: [usize; 4],
        /// Timed repetitions per row (after one warm-up).
        #[arg(long, default_value_t = 5)]
        reps: usize,
        /// Also write the table as CSV.
        #[arg(long)]
        csv: Option<PathBuf>,
    },
    /// Seconds per search step (architecture step + weight step), first and second order,
    /// float and fake-quant.
    Search {
        /// Supernet shape(s).
        #[arg(long, value_enum, default_value = "default")]
        shape: SearchShapeArg,
        /// Timed steps per row.
        #[arg(long, default_value_t = 3)]
        reps: usize,
        /// Untimed steps first.
        #[arg(long, default_value_t = 1)]
        warmup: usize,
        /// Also write the table as CSV.
        #[arg(long)]
        csv: Option<PathBuf>,
    },
    /// Forward+backward time of each candidate op, float against fake-quant.
    Ops {
        /// Batch size.
        #[arg(long, default_value_t = 32)]
        batch: usize,
        /// Channels.
        #[arg(long, default_value_t = 16)]
        channels: usize,
        /// Height and width.
        #[arg(long, default_value_t = 32)]
        size: usize,
        /// Quantization preset of the fake-quant column.
        #[arg(long, value_enum, default_value = "tensorrt")]
        preset: PresetArg,
        /// Timed repetitions per row (after one warm-up).
        #[arg(long, default_value_t = 5)]
        reps: usize,
        /// Also write the table as CSV.
        #[arg(long)]
        csv: Option<PathBuf>,
    },
    /// Integer-runtime throughput (images/s) of a frozen model on the embedded test images,
    /// single-threaded and on every core.
    Runtime {
        /// Training run folder with frozen/model.qdf.
        run: PathBuf,
        /// Timed passes over the test set per row (after one warm-up).
        #[arg(long, default_value_t = 3)]
        reps: usize,
        /// Also write the table as CSV.
        #[arg(long)]
        csv: Option<PathBuf>,
    },
}

/// Which supernet shapes `bench search` times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SearchShapeArg {
    /// experiments/default.toml: C=4, 4 cells, 3 nodes, batch 32, 1×28×28.
    Default,
    /// The DARTS shape: C=16, 8 cells, 4 nodes, batch 64, 3×32×32.
    Darts,
    /// Both.
    Both,
}

/// A quantization preset on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PresetArg {
    /// int8 per-channel weights, int8 per-tensor activations.
    Tensorrt,
    /// int8 per-channel weights, uint8 affine activations.
    OnnxQdq,
    /// channel-wise abs-max weights, moving-average abs-max activations.
    Paddle,
    /// learned step sizes.
    Lsq,
}

impl From<PresetArg> for Preset {
    fn from(p: PresetArg) -> Preset {
        match p {
            PresetArg::Tensorrt => Preset::Tensorrt,
            PresetArg::OnnxQdq => Preset::OnnxQdq,
            PresetArg::Paddle => Preset::Paddle,
            PresetArg::Lsq => Preset::Lsq,
        }
    }
}

fn parse_shape(s: &str) -> Result<[usize; 4], String> {
    let dims: Vec<usize> = s
        .split(',')
        .map(|d| d.trim().parse::<usize>().map_err(|e| format!("`{d}`: {e}")))
        .collect::<Result<_, _>>()?;
    match dims.as_slice() {
        &[n, c, h, w] if n * c * h * w > 0 => Ok([n, c, h, w]),
        _ => Err(format!("expected four positive dimensions N,C,H,W, got `{s}`")),
    }
}

/// Runs a benchmark command.
pub fn run(cmd: BenchCommand, backend: Backend) -> Result<()> {
    match cmd {
        BenchCommand::Runtime { run, reps, csv } => runtime_bench(&run, reps, csv.as_deref()),
        BenchCommand::Quant { shape, reps, csv } => {
            if reps == 0 {
                bail!("--reps must be at least 1");
            }
            let device = backend.device()?;
            let rows = quant_rows(shape, reps, &device)?;
            let numel: usize = shape.iter().product();
            println!(
                "fake-quant throughput on {}, tensor {}x{}x{}x{} ({:.1} M elements, f32), median of {reps} after 1 warm-up",
                backend.name(),
                shape[0],
                shape[1],
                shape[2],
                shape[3],
                numel as f64 / 1e6
            );
            print!("{}", render(&rows));
            if let Some(path) = csv {
                write_quant_csv(&path, backend, shape, &rows)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            Ok(())
        }
        BenchCommand::Search { shape, reps, warmup, csv } => {
            if reps == 0 {
                bail!("--reps must be at least 1");
            }
            let device = backend.device()?;
            let shapes: &[SearchShape] = match shape {
                SearchShapeArg::Default => &SEARCH_SHAPES[..1],
                SearchShapeArg::Darts => &SEARCH_SHAPES[1..],
                SearchShapeArg::Both => &SEARCH_SHAPES[..],
            };
            println!(
                "seconds per search step (architecture step + weight step) on {}, median of {reps} after {warmup} warm-up",
                backend.name()
            );
            let mut rows = Vec::new();
            println!(
                "{:<8} {:<26} {:<7} {:<10} {:>10} {:>17}",
                "shape", "network", "order", "quant", "s/step", "min..max"
            );
            for sh in shapes {
                for order in ["first", "second"] {
                    for preset in ["float", "tensorrt"] {
                        let t = time_search_step(sh, order, preset, reps, warmup, &device)?;
                        let net = format!(
                            "C={} {} cells {} nodes b{}",
                            sh.c, sh.layers, sh.nodes, sh.batch
                        );
                        println!(
                            "{:<8} {:<26} {:<7} {:<10} {:>10.2} {:>17}",
                            sh.name,
                            net,
                            order,
                            preset,
                            t.0,
                            format!("{:.2}..{:.2}", t.1, t.2)
                        );
                        if let Some(p) = t.3 {
                            println!(
                                "{:>72}",
                                format!("peak memory {:.1} MiB", p as f64 / 1048576.0)
                            );
                        }
                        rows.push(format!(
                            "{},{},{},{},{},{:.4},{:.4},{:.4}",
                            backend.name(),
                            sh.name,
                            net,
                            order,
                            preset,
                            t.0,
                            t.1,
                            t.2
                        ));
                    }
                }
            }
            if let Some(path) = csv {
                write_csv(&path, "backend,shape,network,order,quant,median_s,min_s,max_s", rows)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            Ok(())
        }
        BenchCommand::Ops { batch, channels, size, preset, reps, csv } => {
            if reps == 0 || batch == 0 || channels < 2 || size < 2 {
                bail!("--reps, --batch must be >= 1, --channels and --size >= 2");
            }
            let device = backend.device()?;
            let shape = [batch, channels, size, size];
            let rows = op_rows(shape, preset.into(), reps, &device)?;
            println!(
                "candidate ops, forward+backward on {}, input {batch}x{channels}x{size}x{size}, \
                 fake-quant preset {preset:?}, median of {reps} after 1 warm-up (ms)",
                backend.name()
            );
            print!("{}", render_ops(&rows));
            if let Some(path) = csv {
                write_ops_csv(&path, backend, shape, &rows)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            Ok(())
        }
    }
}

/// A supernet shape for `bench search`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SearchShape {
    pub(crate) name: &'static str,
    pub(crate) c_in: usize,
    pub(crate) hw: usize,
    pub(crate) c: usize,
    pub(crate) layers: usize,
    pub(crate) nodes: usize,
    pub(crate) batch: usize,
    /// PC-DARTS partial channels (1: plain DARTS).
    pub(crate) partial: usize,
}

pub(crate) const SEARCH_SHAPES: [SearchShape; 2] = [
    SearchShape {
        name: "default",
        c_in: 1,
        hw: 28,
        c: 4,
        layers: 4,
        nodes: 3,
        batch: 32,
        partial: 1,
    },
    SearchShape {
        name: "darts",
        c_in: 3,
        hw: 32,
        c: 16,
        layers: 8,
        nodes: 4,
        batch: 64,
        partial: 1,
    },
];

/// Median, min and max seconds per search step, and the peak memory seen during the timed
/// steps (see [`MemProbe`]).
pub(crate) fn time_search_step(
    sh: &SearchShape,
    order: &str,
    preset: &str,
    reps: usize,
    warmup: usize,
    device: &Device,
) -> Result<(f64, f64, f64, Option<u64>)> {
    let t = time_search_step_until(sh, order, preset, reps, warmup, None, device)?;
    Ok((t.median, t.min, t.max, t.peak))
}

/// Timings of one search row.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StepTimes {
    pub(crate) median: f64,
    pub(crate) min: f64,
    pub(crate) max: f64,
    pub(crate) peak: Option<u64>,
    /// Warm-up and timed steps actually run.
    pub(crate) runs: (usize, usize),
}

/// [`time_search_step`] that stops early when the next step would end after `deadline`
/// (judged by the last step's time): the remaining warm-up is dropped first, then timed steps,
/// keeping at least one timed step.
pub(crate) fn time_search_step_until(
    sh: &SearchShape,
    order: &str,
    preset: &str,
    reps: usize,
    warmup: usize,
    deadline: Option<Instant>,
    device: &Device,
) -> Result<StepTimes> {
    let text = format!(
        "name = \"bench\"\n[data]\ndataset = \"fashion-mnist\"\n[model]\ninit_channels = {}\nlayers = {}\nnodes = {}\n\
         [search]\nepochs = 1\nbatch_size = {}\norder = \"{order}\"\n[quant]\npreset = \"{preset}\"\n",
        sh.c, sh.layers, sh.nodes, sh.batch
    );
    let cfg = ExperimentConfig::parse(&text, Path::new("<bench>"), &[])?;
    let ad = device.clone().autodiff();
    ad.seed(1);
    let shape = NetShape {
        c_in: sh.c_in,
        classes: 10,
        channels: sh.c,
        layers: sh.layers,
        nodes: sh.nodes,
        stem_multiplier: 3,
        primitives: Primitive::DARTS.to_vec(),
        partial_channels: sh.partial,
    };
    let mut net = SearchNetwork::new(&shape, &cfg.quant, &ad)?;
    let mut alphas = Alphas::new(sh.nodes, 8, &ad);
    let (mut w_optim, mut a_optim) = build_optimizers(&cfg);
    let batch = || -> Batch {
        (
            Tensor::random([sh.batch, sh.c_in, sh.hw, sh.hw], Distribution::Normal(0.0, 1.0), &ad),
            Tensor::<1>::random([sh.batch], Distribution::Uniform(0.0, 9.99), &ad).int(),
        )
    };
    let (tb, vb) = (batch(), batch());
    let mut times = Vec::with_capacity(reps);
    let mut peak: Option<u64> = None;
    let (mut warmed, mut last) = (0, None::<f64>);
    for i in 0..warmup + reps {
        let over = match (deadline, last) {
            (Some(d), Some(l)) => Instant::now() + std::time::Duration::from_secs_f64(l) > d,
            _ => false,
        };
        if over && !times.is_empty() {
            break;
        }
        // Out of time during warm-up: time this step, so the row keeps one measurement.
        let timed = i >= warmup || over;
        let probe = MemProbe::start(device);
        let start = Instant::now();
        alphas = arch_step(&net, alphas, &mut a_optim, (&tb, &vb), 0.025, &cfg.search);
        let (n, _loss) = weight_step(net, &alphas, &mut w_optim, &tb, 0.025, &cfg.search);
        net = n;
        settle_net(&alphas);
        let took = start.elapsed().as_secs_f64();
        last = Some(took);
        if timed {
            times.push(took);
            peak = peak.max(probe.finish(device));
        } else {
            warmed += 1;
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(StepTimes {
        median: times[times.len() / 2],
        min: times[0],
        max: times[times.len() - 1],
        peak,
        runs: (warmed, times.len()),
    })
}

/// Waits for the step's lazy work (GPU backends) by reading one α value back.
pub(crate) fn settle_net(alphas: &Alphas) {
    let v = alphas.normal.val();
    let _ = v.slice([0..1, 0..1]).into_scalar::<f32>();
}

/// Peak memory of a step: on flex, the largest live host heap during the step (all tensors
/// live there); elsewhere, the bytes the device's memory pool holds after the step (the pool
/// grows to the peak and keeps its pages), when the backend reports it.
#[derive(Debug)]
pub(crate) struct MemProbe {
    host: bool,
}

impl MemProbe {
    pub(crate) fn start(device: &Device) -> Self {
        let host = device.memory_pool_usage().is_none();
        if host {
            crate::alloc::reset_peak();
        }
        MemProbe { host }
    }

    pub(crate) fn finish(self, device: &Device) -> Option<u64> {
        if self.host {
            Some(crate::alloc::peak_bytes() as u64)
        } else {
            device.memory_pool_usage().map(|u| u.bytes_reserved)
        }
    }
}

/// Float and fake-quant timings of one op.
#[derive(Debug, Clone)]
pub(crate) struct OpRow {
    pub(crate) op: String,
    pub(crate) stride: usize,
    pub(crate) float: (f64, f64, f64),
    pub(crate) quant: (f64, f64, f64),
}

fn time_op(op: &CandidateOp, x: &Tensor<4>, reps: usize) -> Result<(f64, f64, f64)> {
    time_reps(reps, || {
        let xg = x.clone().require_grad();
        let out = op.forward(QTensor::float(xg.clone())).value;
        if out.is_tracked() {
            let grads = out.sum().backward();
            if let Some(g) = xg.grad(&grads) {
                settle(g);
            }
        } else {
            settle(out);
        }
        Ok(())
    })
}

pub(crate) fn op_rows(
    shape: [usize; 4],
    preset: Preset,
    reps: usize,
    device: &Device,
) -> Result<Vec<OpRow>> {
    let ad = device.clone().autodiff();
    let x = Tensor::<4>::random(shape, Distribution::Normal(0.0, 1.0), &ad);
    let float = QuantConfig::float();
    let quant = QuantConfig::preset(preset);
    let mut rows = Vec::new();
    for stride in [1, 2] {
        for p in Primitive::DARTS {
            let path = format!("bench.{p}");
            let f = CandidateOp::new(p, shape[1], stride, false, &float, &path, &ad)?;
            let q = CandidateOp::new(p, shape[1], stride, false, &quant, &path, &ad)?;
            rows.push(OpRow {
                op: p.name().to_string(),
                stride,
                float: time_op(&f, &x, reps)?,
                quant: time_op(&q, &x, reps)?,
            });
        }
    }
    Ok(rows)
}

pub(crate) fn render_ops(rows: &[OpRow]) -> String {
    let mut out = format!(
        "{:<14} {:>6} {:>10} {:>17} {:>12} {:>17} {:>7}\n",
        "op", "stride", "float", "min..max", "fake-quant", "min..max", "ratio"
    );
    for r in rows {
        out.push_str(&format!(
            "{:<14} {:>6} {:>10.2} {:>17} {:>12.2} {:>17} {:>7.2}\n",
            r.op,
            r.stride,
            r.float.0 * 1e3,
            format!("{:.2}..{:.2}", r.float.1 * 1e3, r.float.2 * 1e3),
            r.quant.0 * 1e3,
            format!("{:.2}..{:.2}", r.quant.1 * 1e3, r.quant.2 * 1e3),
            r.quant.0 / r.float.0
        ));
    }
    out
}

fn write_ops_csv(path: &Path, backend: Backend, shape: [usize; 4], rows: &[OpRow]) -> Result<()> {
    let shape = format!("{}x{}x{}x{}", shape[0], shape[1], shape[2], shape[3]);
    let lines = rows.iter().map(|r| {
        format!(
            "{},{shape},{},{},{:.6},{:.6},{:.6},{:.6},{:.6},{:.6}",
            backend.name(),
            r.op,
            r.stride,
            r.float.0,
            r.float.1,
            r.float.2,
            r.quant.0,
            r.quant.1,
            r.quant.2
        )
    });
    write_csv(
        path,
        "backend,shape,op,stride,float_median_s,float_min_s,float_max_s,quant_median_s,quant_min_s,quant_max_s",
        lines,
    )
}

/// One timed configuration.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub(crate) what: String,
    pub(crate) granularity: &'static str,
    pub(crate) pass: &'static str,
    pub(crate) median_s: f64,
    pub(crate) min_s: f64,
    pub(crate) max_s: f64,
    pub(crate) numel: usize,
}

impl Row {
    pub(crate) fn elems_per_s(&self) -> f64 {
        self.numel as f64 / self.median_s
    }
    /// Nominal traffic: one f32 read and one f32 write per element (per pass direction).
    pub(crate) fn gb_per_s(&self) -> f64 {
        let dirs = if self.pass == "fwd" { 1.0 } else { 2.0 };
        dirs * 8.0 * self.numel as f64 / self.median_s / 1e9
    }
}

pub(crate) fn time_reps(reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<(f64, f64, f64)> {
    f()?; // warm-up
    let mut t = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = Instant::now();
        f()?;
        t.push(start.elapsed().as_secs_f64());
    }
    t.sort_by(f64::total_cmp);
    Ok((t[t.len() / 2], t[0], t[t.len() - 1]))
}

/// Forces the lazy work of a result to finish (a one-element read back).
pub(crate) fn settle(t: Tensor<4>) -> f32 {
    t.slice([0..1, 0..1, 0..1, 0..1]).into_scalar::<f32>()
}

pub(crate) fn quant_rows(shape: [usize; 4], reps: usize, device: &Device) -> Result<Vec<Row>> {
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
    let row = |what: String, granularity, pass, (median_s, min_s, max_s)| Row {
        what,
        granularity,
        pass,
        median_s,
        min_s,
        max_s,
        numel,
    };

    // Baseline: the cheapest elementwise op that writes a new tensor.
    let t = time_reps(reps, || {
        settle(x.clone().add_scalar(0.0));
        Ok(())
    })?;
    rows.push(row("copy (x + 0)".into(), "-", "fwd", t));
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
    rows.push(row("copy (x + 0)".into(), "-", "fwd+bwd", t));

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
        let imps = if qdarts_ops::quant::fused::fused_available(device, DType::F32) {
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
            rows.push(row(name.into(), gran_name(granularity), "fwd", t));
            let t = time_reps(reps, || {
                let xg = xa.clone().require_grad();
                let grads = fake_quant_with(xg.clone(), &grid_ad, imp).sum().backward();
                if let Some(g) = xg.grad(&grads) {
                    settle(g);
                }
                Ok(())
            })?;
            rows.push(row(name.into(), gran_name(granularity), "fwd+bwd", t));
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
        rows.push(row(observer.name().to_string(), gran_name(granularity), "fwd", t));

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
        rows.push(row(observer.name().to_string(), gran_name(granularity), "fwd+bwd", t));
    }
    Ok(rows)
}

pub(crate) fn render(rows: &[Row]) -> String {
    let copy = |pass: &str| {
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
            r.pass,
            r.median_s * 1e3,
            format!("{:.1}..{:.1}", r.min_s * 1e3, r.max_s * 1e3),
            r.elems_per_s() / 1e6,
            r.gb_per_s(),
            ratio
        ));
    }
    out
}

fn write_quant_csv(path: &Path, backend: Backend, shape: [usize; 4], rows: &[Row]) -> Result<()> {
    let shape = format!("{}x{}x{}x{}", shape[0], shape[1], shape[2], shape[3]);
    let lines = rows.iter().map(|r| {
        format!(
            "{},{shape},{},{},{},{:.6},{:.6},{:.6},{:.0},{:.3}",
            backend.name(),
            r.what,
            r.granularity,
            r.pass,
            r.median_s,
            r.min_s,
            r.max_s,
            r.elems_per_s(),
            r.gb_per_s()
        )
    });
    write_csv(
        path,
        "backend,shape,observer,granularity,pass,median_s,min_s,max_s,elems_per_s,gb_per_s",
        lines,
    )
}

/// Writes a header and one line per row, synced to disk.
pub(crate) fn write_csv(
    path: &Path,
    header: &str,
    lines: impl IntoIterator<Item = String>,
) -> Result<()> {
    let mut f = File::create(path)?;
    writeln!(f, "{header}")?;
    for line in lines {
        writeln!(f, "{line}")?;
    }
    f.sync_all()?;
    Ok(())
}

/// `bench runtime`: images/s of the integer runtime over the run's test set.
fn runtime_bench(run: &Path, reps: usize, csv: Option<&Path>) -> Result<()> {
    if reps == 0 {
        bail!("--reps must be at least 1");
    }
    let qdf = run.join("frozen").join("model.qdf");
    if !qdf.exists() {
        bail!("{}: no frozen model; run `qdarts freeze {}` first", qdf.display(), run.display());
    }
    let model = qdarts_frozen::FrozenModel::load(&qdf)?;
    let cfg = qdarts_search::train::TrainConfig::load(&run.join("config.toml"), &[])?;
    let set = qdarts_search::train::test_set(&cfg)?;
    let rt = qdarts_frozen::Runtime::new(&model)?;
    let [c, h, w] = model.graph.input_shape;
    let images: Vec<f32> = set
        .images
        .chunks_exact(c * h * w)
        .flat_map(|img| {
            img.iter().enumerate().map(|(i, &p)| {
                let ch = i / (h * w);
                (f32::from(p) / 255.0 - model.graph.mean[ch]) / model.graph.std[ch]
            })
        })
        .collect();
    let n = set.len();
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let mut threads = vec![1];
    if cores > 1 {
        threads.push(cores);
    }
    println!(
        "integer runtime on {} ({} test images, {:.1} M MACs/image), median of {reps} passes after 1 warm-up",
        qdf.display(),
        n,
        model.macs()?.iter().map(|m| m.0).sum::<u64>() as f64 / 1e6
    );
    println!("{:>8} {:>12} {:>12} {:>22}", "threads", "images/s", "ms/image", "min..max images/s");
    let mut lines = Vec::new();
    for t in threads {
        let _ = rt.run(&images, t);
        let mut rates: Vec<f64> = (0..reps)
            .map(|_| {
                let t0 = Instant::now();
                std::hint::black_box(rt.run(&images, t));
                n as f64 / t0.elapsed().as_secs_f64()
            })
            .collect();
        rates.sort_by(f64::total_cmp);
        let med = rates[rates.len() / 2];
        println!(
            "{t:>8} {med:>12.1} {:>12.3} {:>22}",
            1000.0 / med,
            format!("{:.1}..{:.1}", rates[0], rates[rates.len() - 1])
        );
        lines.push(format!("{t},{med:.3},{:.3},{:.3}", rates[0], rates[rates.len() - 1]));
    }
    if let Some(p) = csv {
        write_csv(p, "threads,images_per_s,min,max", lines)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_parse_and_bad_shapes_say_why() {
        assert_eq!(parse_shape("2,3,4,5").unwrap(), [2, 3, 4, 5]);
        assert!(parse_shape("2,3,4").unwrap_err().contains("four positive"));
        assert!(parse_shape("2,0,4,5").unwrap_err().contains("four positive"));
        assert!(parse_shape("2,x,4,5").unwrap_err().contains("`x`"));
    }

    #[test]
    fn a_tiny_bench_produces_every_row() {
        let rows = quant_rows([2, 3, 4, 4], 1, &Device::flex()).unwrap();
        // copy, the bare kernel (composite and fused, per tensor and per channel) and 7
        // observer configs, each forward and forward+backward.
        assert_eq!(rows.len(), 2 * (1 + 4 + 7));
        assert!(rows.iter().any(|r| r.what == "kernel: fused" && r.pass == "fwd+bwd"));
        assert!(rows.iter().all(|r| r.median_s > 0.0 && r.min_s <= r.max_s));
        let table = render(&rows);
        assert!(table.contains("channel_wise_abs_max") && table.contains("per-channel"));
    }

    #[test]
    fn a_tiny_ops_bench_times_every_primitive_at_both_strides() {
        let rows = op_rows([2, 4, 8, 8], Preset::Tensorrt, 1, &Device::flex()).unwrap();
        assert_eq!(rows.len(), 16);
        assert!(rows.iter().all(|r| r.float.0 > 0.0 && r.quant.0 > 0.0));
        assert!(render_ops(&rows).contains("sep_conv_5x5"));
    }
}
