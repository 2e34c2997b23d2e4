//! `qdarts bench search`: seconds per search step (architecture step + weight step) of a
//! supernet shape, first or second order, float or fake-quant, with the peak memory of a step.

use std::time::{Duration, Instant};

use anyhow::Result;
use burn::tensor::{Device, Distribution, Tensor};
use qdarts_genotypes::Primitive;
use qdarts_ops::qconfig::{Preset, QuantConfig};
use qdarts_search::architect::Batch;
use qdarts_search::config::{Order, SearchConfig};
use qdarts_search::step::{arch_step, build_optimizers, weight_step};
use qdarts_search::supernet::{Alphas, NetShape, SearchNetwork};

use super::timing::{MemProbe, Timing, sampled_pool_peak};

/// A supernet shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SearchShape {
    /// Its name in tables.
    pub name: &'static str,
    /// Input channels.
    pub c_in: usize,
    /// Input height and width.
    pub hw: usize,
    /// Channels of the first cell.
    pub c: usize,
    /// Cells.
    pub layers: usize,
    /// Intermediate nodes per cell.
    pub nodes: usize,
    /// Batch size.
    pub batch: usize,
    /// PC-DARTS partial channels (1: plain DARTS).
    pub partial: usize,
}

/// `experiments/default.toml`'s supernet: C=4, 4 cells, 3 nodes, batch 32, 1×28×28.
pub const DEFAULT_SHAPE: SearchShape = SearchShape {
    name: "default",
    c_in: 1,
    hw: 28,
    c: 4,
    layers: 4,
    nodes: 3,
    batch: 32,
    partial: 1,
};

/// The DARTS paper's supernet: C=16, 8 cells, 4 nodes, batch 64, 3×32×32.
pub const DARTS_SHAPE: SearchShape = SearchShape {
    name: "darts",
    c_in: 3,
    hw: 32,
    c: 16,
    layers: 8,
    nodes: 4,
    batch: 64,
    partial: 1,
};

/// Both shapes, smallest first.
pub const SEARCH_SHAPES: [SearchShape; 2] = [DEFAULT_SHAPE, DARTS_SHAPE];

impl SearchShape {
    /// A one-line description for tables.
    pub fn describe(&self) -> String {
        let pc = if self.partial > 1 { format!(" K={}", self.partial) } else { String::new() };
        format!("C={} {} cells {} nodes b{}{pc}", self.c, self.layers, self.nodes, self.batch)
    }
}

/// One search row: a shape, an order and a quantization preset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SearchCase {
    /// The supernet.
    pub shape: SearchShape,
    /// First or second order.
    pub order: Order,
    /// Quantization preset (`Float`: none).
    pub preset: Preset,
    /// The cells in waves (the batched cell).
    pub batched: bool,
    /// A bit-width search over [`BIT_CHOICES`] (EdMIPS' composite quantization).
    pub bits: bool,
}

/// The candidate widths of `bench search --bits`, `(weights, activations)`: those of
/// `experiments/bits-default.toml`.
pub const BIT_CHOICES: ([u32; 3], [u32; 2]) = ([2, 4, 8], [4, 8]);

impl SearchCase {
    /// The network column: the shape, "in waves" for batched cells, "bit search" under a
    /// bit-width search.
    pub fn network(&self) -> String {
        let mut d = self.shape.describe();
        if self.batched {
            d.push_str(", in waves");
        }
        if self.bits {
            d.push_str(", bit search");
        }
        d
    }
}

/// The name of an order in tables.
pub fn order_name(order: Order) -> &'static str {
    match order {
        Order::First => "first",
        Order::Second => "second",
    }
}

/// The name of a preset in tables.
pub fn preset_name(preset: Preset) -> &'static str {
    match preset {
        Preset::Tensorrt => "tensorrt",
        Preset::OnnxQdq => "onnx_qdq",
        Preset::Paddle => "paddle",
        Preset::Lsq => "lsq",
        Preset::Float => "float",
    }
}

/// Timings of one search row.
#[derive(Debug, Clone, Copy)]
pub struct StepTimes {
    /// Seconds per step.
    pub time: Timing,
    /// Peak memory: on flex, of the timed steps (see [`MemProbe`]); with a device pool, the
    /// most it held after a timed step or while one more step ran (see
    /// [`sampled_pool_peak`]).
    pub peak: Option<u64>,
    /// Warm-up and timed steps actually run.
    pub runs: (usize, usize),
    /// Kernel launches per timed step (the median), on the CubeCL backends.
    pub launches: Option<u64>,
}

/// Times `reps` search steps after `warmup` untimed ones. With a `deadline`, it stops early
/// when the next step would end after it (judged by the last step's time): the remaining
/// warm-up is dropped first, then timed steps, keeping at least one timed step. The steps run
/// on a rayon worker, as a search runs them ([`crate::on_rayon_worker`]).
pub fn time_search_step(
    case: &SearchCase,
    reps: usize,
    warmup: usize,
    deadline: Option<Instant>,
    device: &Device,
) -> Result<StepTimes> {
    crate::on_rayon_worker(|| time_steps_here(case, reps, warmup, deadline, device))
}

/// [`time_search_step`] on the calling thread.
fn time_steps_here(
    case: &SearchCase,
    reps: usize,
    warmup: usize,
    deadline: Option<Instant>,
    device: &Device,
) -> Result<StepTimes> {
    let sh = case.shape;
    let mut s = SearchConfig::with_defaults(1, sh.batch);
    s.order = case.order;
    let quant = QuantConfig::preset(case.preset);
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
        bits: case.bits.then(|| (BIT_CHOICES.0.to_vec(), BIT_CHOICES.1.to_vec())),
    };
    let mut net = SearchNetwork::new(&shape, &quant, &ad)?;
    if case.batched {
        net.batch_cells(&shape.primitives)?;
    }
    let mut alphas = Alphas::new(sh.nodes, Primitive::DARTS.len(), &ad);
    if case.bits {
        let (w, a) = (BIT_CHOICES.0.len(), BIT_CHOICES.1.len());
        alphas = alphas.with_bits(Primitive::DARTS.len(), w, a, &ad);
    }
    let (mut w_optim, mut a_optim) = build_optimizers(&s);
    let batch = || -> Batch {
        (
            Tensor::random([sh.batch, sh.c_in, sh.hw, sh.hw], Distribution::Normal(0.0, 1.0), &ad),
            Tensor::<1>::random([sh.batch], Distribution::Uniform(0.0, 9.99), &ad).int(),
        )
    };
    let (tb, vb) = (batch(), batch());
    let mut step = |mut net: SearchNetwork, alphas: Alphas| {
        let a = arch_step(
            &mut net,
            alphas,
            (&mut a_optim, &w_optim),
            (&tb, &vb),
            s.w_lr,
            &s,
            None,
            0.0,
        );
        let (n, _loss) = weight_step(net, &a, &mut w_optim, &tb, s.w_lr, &s);
        settle_alphas(&a);
        (a, n)
    };
    let mut times = Vec::with_capacity(reps);
    let mut peak: Option<u64> = None;
    let mut launches = Vec::new();
    let (mut warmed, mut last) = (0, None::<f64>);
    for i in 0..warmup + reps {
        let over = match (deadline, last) {
            (Some(d), Some(l)) => Instant::now() + Duration::from_secs_f64(l) > d,
            _ => false,
        };
        if over && !times.is_empty() {
            break;
        }
        // Out of time during warm-up: time this step, so the row keeps one measurement.
        let timed = i >= warmup || over;
        let probe = MemProbe::start(device);
        let start = Instant::now();
        let ((a, n), issued) = qdarts_kernels::launches::counted(device, || step(net, alphas));
        (alphas, net) = (a, n);
        let took = start.elapsed().as_secs_f64();
        last = Some(took);
        if timed {
            times.push(took);
            peak = peak.max(probe.finish(device));
            launches.extend(issued);
        } else {
            warmed += 1;
        }
    }
    // A pool that returns pages during a step (exclusive pages) holds less after it than at
    // its peak: one more step, untimed, with the pool read every millisecond meanwhile.
    let room = match (deadline, last) {
        (Some(d), Some(l)) => Instant::now() + Duration::from_secs_f64(l) <= d,
        _ => true,
    };
    if room && device.memory_pool_usage().is_some() && !times.is_empty() {
        let (_, sampled) = sampled_pool_peak(device, || step(net, alphas));
        peak = peak.max(sampled);
    }
    let runs = (warmed, times.len());
    launches.sort_unstable();
    let launches = launches.get(launches.len() / 2).copied();
    Ok(StepTimes { time: Timing::of(times), peak, runs, launches })
}

/// Waits for the step's lazy work (GPU backends) by reading one α value back.
fn settle_alphas(alphas: &Alphas) {
    let v = alphas.normal.val();
    let _ = v.slice([0..1, 0..1]).into_scalar::<f32>();
}
