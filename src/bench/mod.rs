//! `qdarts bench`: throughput tables. Timings live here, never in unit tests.
//!
//! One module per concern: the timing harness ([`timing`]), fake-quant throughput
//! ([`quant`]), candidate ops ([`ops`]), search steps ([`search`]), the integer runtime
//! ([`runtime`]), and the whole suite as one table ([`suite`]).

mod args;
mod cell;
mod ops;
mod quant;
mod runtime;
mod search;
pub mod suite;
mod timing;

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use qdarts_ops::qconfig::{Preset, QuantConfig};
use qdarts_search::config::Order;

pub use self::args::{BenchCommand, OrderArg, PresetArg, SearchShapeArg};
use self::search::{DARTS_SHAPE, DEFAULT_SHAPE, SearchCase, SearchShape, order_name, preset_name};
use crate::backend::Backend;

/// What `bench search` was asked for.
#[derive(Debug, Clone, Copy)]
struct SearchRequest {
    shape: SearchShapeArg,
    batch: Option<usize>,
    layers: Option<usize>,
    init_channels: Option<usize>,
    order: Option<OrderArg>,
    quant: Option<PresetArg>,
    batched: bool,
    bits: bool,
}

impl SearchRequest {
    /// The rows: each shape (with the overrides) × order × preset.
    fn cases(&self) -> Result<Vec<SearchCase>> {
        let shapes: &[SearchShape] = match self.shape {
            SearchShapeArg::Default => &[DEFAULT_SHAPE],
            SearchShapeArg::Darts => &[DARTS_SHAPE],
            SearchShapeArg::Both => &[DEFAULT_SHAPE, DARTS_SHAPE],
        };
        if self.batch == Some(0) || self.layers.is_some_and(|l| l < 3) {
            bail!("--batch must be at least 1 and --layers at least 3 (two reduction cells)");
        }
        if self.init_channels.is_some_and(|c| c < 2 || c % 2 != 0) {
            bail!("--init-channels must be even and at least 2");
        }
        let orders = match self.order {
            Some(o) => vec![o.into()],
            None => vec![Order::First, Order::Second],
        };
        let presets = match self.quant {
            Some(p) => vec![p.into()],
            // A bit-width search mixes quantizers: the quantized preset only.
            None if self.bits => vec![Preset::Tensorrt],
            None => vec![Preset::Float, Preset::Tensorrt],
        };
        if self.batched && presets.contains(&Preset::Lsq) {
            bail!("--batched-cells runs no LSQ quantizers: pick another --quant");
        }
        if self.bits && presets.contains(&Preset::Float) {
            bail!(
                "--bits searches the widths of a quantized network: pick a --quant other than float"
            );
        }
        let mut cases = Vec::new();
        for sh in shapes {
            let shape = SearchShape {
                batch: self.batch.unwrap_or(sh.batch),
                layers: self.layers.unwrap_or(sh.layers),
                c: self.init_channels.unwrap_or(sh.c),
                ..*sh
            };
            for &order in &orders {
                for &preset in &presets {
                    let (batched, bits) = (self.batched, self.bits);
                    cases.push(SearchCase { shape, order, preset, batched, bits });
                }
            }
        }
        Ok(cases)
    }
}

/// Runs a benchmark command.
pub fn run(cmd: BenchCommand, backend: Backend) -> Result<()> {
    match cmd {
        BenchCommand::Runtime { run, reps, rounds, direct, python, csv } => {
            crate::cpu_only(backend, "bench runtime")?;
            let python = (python != "none").then_some(python.as_str());
            runtime::runtime_bench(&run, reps, rounds, direct, python, csv.as_deref())
        }
        BenchCommand::Quant { shape, reps, csv } => quant_bench(shape, reps, csv, backend),
        BenchCommand::Search {
            shape,
            batch,
            layers,
            init_channels,
            order,
            quant,
            batched_cells,
            bits,
            reps,
            warmup,
            csv,
        } => {
            if reps == 0 {
                bail!("--reps must be at least 1");
            }
            let request = SearchRequest {
                shape,
                batch,
                layers,
                init_channels,
                order,
                quant,
                batched: batched_cells,
                bits,
            };
            search_bench(&request.cases()?, (reps, warmup), csv, backend)
        }
        BenchCommand::Cell { batch, channels, size, quant, rounds, kernels, csv } => {
            let cfg = QuantConfig::preset(quant.into());
            cell_bench([batch, channels, size], &cfg, rounds, kernels, csv, backend)
        }
        BenchCommand::Ops { batch, channels, size, preset, reps, csv } => {
            ops_bench([batch, channels, size, size], preset, reps, csv, backend)
        }
    }
}

/// `bench quant`: fake-quant throughput on one tensor shape.
fn quant_bench(
    shape: [usize; 4],
    reps: usize,
    csv: Option<PathBuf>,
    backend: Backend,
) -> Result<()> {
    if reps == 0 {
        bail!("--reps must be at least 1");
    }
    let device = backend.device()?;
    let rows = quant::quant_rows(shape, reps, &device)?;
    let numel: usize = shape.iter().product();
    let [n, c, h, w] = shape;
    println!(
        "fake-quant throughput on {}, tensor {n}x{c}x{h}x{w} ({:.1} M elements, f32), median of {reps} after 1 warm-up",
        backend.label(),
        numel as f64 / 1e6
    );
    print!("{}", quant::render(&rows));
    if let Some(path) = csv {
        quant::write_quant_csv(&path, backend, shape, &rows)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// `bench search`: one timed row per case, printed as it comes, and the CSV at the end.
fn search_bench(
    cases: &[SearchCase],
    (reps, warmup): (usize, usize),
    csv: Option<PathBuf>,
    backend: Backend,
) -> Result<()> {
    let device = backend.device()?;
    let pools = crate::backend::pools_in_use(&device);
    let pools_name = pools.map_or("", |p| p.name());
    let on = match pools {
        Some(p) => format!("{} ({} memory pools)", backend.label(), p.name()),
        None => backend.label(),
    };
    println!(
        "seconds per search step (architecture step + weight step) on {on}, median of {reps} after {warmup} warm-up"
    );
    println!(
        "{:<8} {:<30} {:<7} {:<10} {:>10} {:>17} {:>10} {:>10} {:>9}",
        "shape",
        "network",
        "order",
        "quant",
        "s/step",
        "min..max",
        "peak MiB",
        "RSS MiB",
        "launches"
    );
    let mut rows = Vec::new();
    for case in cases {
        let t = search::time_search_step(case, reps, warmup, None, &device)?;
        let tm = t.time;
        // The process's peak so far: with one case per process, that case's.
        let rss = crate::alloc::peak_rss_bytes();
        let row = SearchCsvRow {
            backend: backend.label(),
            shape: case.shape.name,
            network: case.network(),
            order: order_name(case.order),
            quant: preset_name(case.preset),
            median_s: tm.median,
            min_s: tm.min,
            max_s: tm.max,
            peak_bytes: t.peak,
            peak_rss_bytes: rss,
            launches: t.launches,
            pools: pools_name,
        };
        println!("{}", row.line());
        rows.push(row);
    }
    if let Some(path) = csv {
        timing::write_csv(&path, rows).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// `bench cell`: one cell, per-edge against waves.
fn cell_bench(
    shape: [usize; 3],
    cfg: &QuantConfig,
    rounds: usize,
    kernels: usize,
    csv: Option<PathBuf>,
    backend: Backend,
) -> Result<()> {
    let [batch, channels, size] = shape;
    if rounds == 0 || batch == 0 || channels < 2 || size < 4 {
        bail!("--rounds, --batch must be >= 1, --channels >= 2, --size >= 4");
    }
    let device = backend.device()?;
    let rows = cell::cell_rows(shape, cfg, rounds, &device)?;
    println!(
        "one DARTS cell (4 nodes, 8 candidates, {}), forward+backward on {}, inputs \
         {batch}x{channels}x{size}x{size}, median of {rounds} interleaved rounds",
        preset_name(cfg.preset),
        backend.label()
    );
    print!("{}", cell::render(&rows));
    if kernels > 0 {
        print!("{}", cell::render_kernels(&rows, kernels));
    }
    if let Some(path) = csv {
        cell::write_cell_csv(&path, backend, shape, &rows)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// `bench ops`: every candidate op, float and fake-quant.
fn ops_bench(
    shape: [usize; 4],
    preset: PresetArg,
    reps: usize,
    csv: Option<PathBuf>,
    backend: Backend,
) -> Result<()> {
    let [batch, channels, size, _] = shape;
    if reps == 0 || batch == 0 || channels < 2 || size < 2 {
        bail!("--reps, --batch must be >= 1, --channels and --size >= 2");
    }
    let device = backend.device()?;
    let rows = ops::op_rows(shape, preset.into(), reps, &device)?;
    println!(
        "candidate ops, forward+backward on {}, input {batch}x{channels}x{size}x{size}, \
         fake-quant preset {preset:?}, median of {reps} after 1 warm-up (ms)",
        backend.label()
    );
    print!("{}", ops::render_ops(&rows));
    if let Some(path) = csv {
        ops::write_ops_csv(&path, backend, shape, &rows)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// One row of `bench search --csv`.
#[derive(Debug, serde::Serialize)]
struct SearchCsvRow<'a> {
    backend: String,
    shape: &'static str,
    network: String,
    order: &'static str,
    quant: &'static str,
    median_s: f64,
    min_s: f64,
    max_s: f64,
    peak_bytes: Option<u64>,
    peak_rss_bytes: Option<u64>,
    launches: Option<u64>,
    pools: &'a str,
}

impl SearchCsvRow<'_> {
    /// The row as `bench search` prints it.
    fn line(&self) -> String {
        let mib =
            |b: Option<u64>| b.map_or(String::new(), |p| format!("{:.1}", p as f64 / 1048576.0));
        format!(
            "{:<8} {:<30} {:<7} {:<10} {:>10.2} {:>17} {:>10} {:>10} {:>9}",
            self.shape,
            self.network,
            self.order,
            self.quant,
            self.median_s,
            format!("{:.2}..{:.2}", self.min_s, self.max_s),
            mib(self.peak_bytes),
            mib(self.peak_rss_bytes),
            self.launches.map_or(String::new(), |n| n.to_string())
        )
    }
}

#[cfg(test)]
mod tests {
    use super::args::parse_shape;
    use burn::tensor::Device;

    use super::*;

    #[test]
    fn shapes_parse_and_bad_shapes_say_why() {
        assert_eq!(parse_shape("2,3,4,5").unwrap(), [2, 3, 4, 5]);
        assert!(parse_shape("2,3,4").unwrap_err().contains("four positive"));
        assert!(parse_shape("2,0,4,5").unwrap_err().contains("four positive"));
        assert!(parse_shape("2,x,4,5").unwrap_err().contains("`x`"));
    }

    #[test]
    fn search_requests_override_the_shape_and_pick_order_and_quant() {
        let all = SearchRequest {
            shape: SearchShapeArg::Darts,
            batch: None,
            layers: None,
            init_channels: None,
            order: None,
            quant: None,
            batched: false,
            bits: false,
        };
        assert_eq!(all.cases().unwrap().len(), 4);
        let waves = SearchRequest { batched: true, ..all };
        assert!(waves.cases().unwrap().iter().all(|c| c.batched));
        let lsq = SearchRequest { quant: Some(PresetArg::Lsq), ..waves };
        assert!(lsq.cases().is_err());
        // A bit-width search needs quantizers to mix: tensorrt unless --quant says otherwise,
        // and not float.
        let bits = SearchRequest { bits: true, ..all };
        let cases = bits.cases().unwrap();
        assert!(cases.iter().all(|c| c.bits && c.preset == Preset::Tensorrt), "{cases:?}");
        let float = SearchRequest { quant: Some(PresetArg::Float), ..bits };
        assert!(float.cases().unwrap_err().to_string().contains("--quant"));
        let one = SearchRequest {
            batch: Some(8),
            layers: Some(5),
            init_channels: Some(6),
            order: Some(OrderArg::Second),
            quant: Some(PresetArg::Tensorrt),
            ..all
        };
        let cases = one.cases().unwrap();
        assert_eq!(cases.len(), 1);
        let c = cases[0];
        assert_eq!((c.shape.batch, c.shape.layers, c.shape.c), (8, 5, 6));
        assert_eq!((c.order, c.preset), (Order::Second, Preset::Tensorrt));
        assert!(SearchRequest { layers: Some(2), ..all }.cases().is_err());
        assert!(SearchRequest { init_channels: Some(3), ..all }.cases().is_err());
    }

    #[test]
    fn a_tiny_bench_produces_every_row() {
        let rows = quant::quant_rows([2, 3, 4, 4], 1, &Device::flex()).unwrap();
        // copy, the bare kernel (composite and fused, per tensor and per channel) and 7
        // observer configs, each forward and forward+backward.
        assert_eq!(rows.len(), 2 * (1 + 4 + 7));
        assert!(rows.iter().any(|r| r.what == "kernel: fused" && r.pass == quant::Pass::FwdBwd));
        assert!(rows.iter().all(|r| r.median_s > 0.0 && r.min_s <= r.max_s));
        let table = quant::render(&rows);
        assert!(table.contains("channel_wise_abs_max") && table.contains("per-channel"));
    }

    #[test]
    fn a_tiny_ops_bench_times_every_primitive_at_both_strides() {
        let rows = ops::op_rows([2, 4, 8, 8], Preset::Tensorrt, 1, &Device::flex()).unwrap();
        assert_eq!(rows.len(), 16);
        assert!(rows.iter().all(|r| r.float.median > 0.0 && r.quant.median > 0.0));
        assert!(ops::render_ops(&rows).contains("sep_conv_5x5"));
    }
}
