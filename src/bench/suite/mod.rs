//! `qdarts bench` without a subcommand: the whole suite as one table, also written as CSV.
//!
//! Sections, in order: fake-quant throughput per observer (and the bare kernel, composite
//! against fused) against a copy of the same tensor; forward+backward of each candidate op,
//! float against fake-quant; seconds per search step (architecture step + weight step), first
//! and second order, float and fake-quant, on the default experiment's shape and on the DARTS
//! shape, with the peak memory of a step. Rows report the median and the min..max of the
//! timed runs after warm-up. A time budget keeps the whole suite bounded on slow machines:
//! search rows that do not fit get fewer runs (the `runs` column says how many), and a row that
//! cannot fit even one step is listed as skipped, never left out silently.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use burn::tensor::Device;
use qdarts_ops::qconfig::Preset;
use qdarts_search::config::Order;

use self::rows::csv_lines;
use super::ops::op_rows;
use super::quant::{Pass, quant_rows};
use super::search::{
    DARTS_SHAPE, DEFAULT_SHAPE, SEARCH_SHAPES, SearchCase, SearchShape, order_name, preset_name,
    time_search_step,
};
use super::timing::write_csv;
use crate::backend::{Backend, BackendKind};

mod rows;

/// Options of the suite.
#[derive(Debug, Clone, clap::Args)]
pub struct SuiteArgs {
    /// Timed runs per fake-quant and op row (after one warm-up).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Timed steps per search row.
    #[arg(long, default_value_t = 3)]
    search_reps: usize,
    /// Untimed steps before each search row's timed steps.
    #[arg(long, default_value_t = 1)]
    search_warmup: usize,
    /// Wall-clock budget of the whole suite in seconds (0: none). Search rows that would
    /// overrun it drop their warm-up, then timed steps (down to one); a row whose estimated
    /// step does not fit at all is skipped (and listed).
    #[arg(long, default_value_t = 540)]
    budget_s: u64,
    /// Where to write the CSV (default: results/bench-<backend>.csv).
    #[arg(long)]
    csv: Option<PathBuf>,
}

/// One line of the table.
#[derive(Debug, Clone)]
struct Line {
    section: &'static str,
    case: String,
    variant: String,
    /// Warm-up and timed runs.
    runs: (usize, usize),
    /// Median, min, max seconds (`None`: skipped).
    time: Option<(f64, f64, f64)>,
    /// Elements/s and GB/s.
    rate: Option<(f64, f64)>,
    /// Median over a baseline's median, and the baseline's name.
    ratio: Option<(f64, &'static str)>,
    peak_bytes: Option<u64>,
    note: String,
}

fn fmt_time(s: f64) -> String {
    if s >= 1.0 { format!("{s:.2} s") } else { format!("{:.2} ms", s * 1e3) }
}

fn fmt_span(lo: f64, hi: f64) -> String {
    if hi >= 1.0 {
        format!("{lo:.2}..{hi:.2} s")
    } else {
        format!("{:.2}..{:.2} ms", lo * 1e3, hi * 1e3)
    }
}

fn render(lines: &[Line]) -> String {
    let mut out = format!(
        "{:<7} {:<34} {:<22} {:>5} {:>10} {:>20} {:>17} {:>16} {:>9}\n",
        "section",
        "case",
        "variant",
        "runs",
        "median",
        "min..max",
        "throughput",
        "ratio",
        "peak MiB"
    );
    for l in lines {
        let (median, span) = match l.time {
            Some((m, lo, hi)) => (fmt_time(m), fmt_span(lo, hi)),
            None => ("-".into(), "-".into()),
        };
        let rate = l.rate.map_or(String::new(), |(e, gb)| format!("{:.0}M/s {gb:.1}GB/s", e / 1e6));
        let ratio = l.ratio.map_or(String::new(), |(r, of)| format!("{r:.2}x {of}"));
        let peak = l.peak_bytes.map_or(String::new(), |b| format!("{:.1}", b as f64 / 1048576.0));
        out.push_str(&format!(
            "{:<7} {:<34} {:<22} {:>5} {:>10} {:>20} {:>17} {:>16} {:>9}{}\n",
            l.section,
            l.case,
            l.variant,
            format!("{}+{}", l.runs.0, l.runs.1),
            median,
            span,
            rate,
            ratio,
            peak,
            if l.note.is_empty() { String::new() } else { format!("  {}", l.note) }
        ));
    }
    out
}

/// The fake-quant tensor: the shape of a ResNet-50 stage-1 activation at batch 64.
const QUANT_SHAPE: [usize; 4] = [64, 64, 56, 56];
/// Candidate ops at the DARTS shape's first cell: batch 64, C = 16, 32×32.
const OP_SHAPE: [usize; 4] = [64, 16, 32, 32];

fn quant_section(reps: usize, device: &Device, out: &mut Vec<Line>) -> Result<()> {
    let rows = quant_rows(QUANT_SHAPE, reps, device)?;
    let copy = |pass: Pass| {
        rows.iter().find(|r| r.what.starts_with("copy") && r.pass == pass).map(|r| r.median_s)
    };
    let [n, c, h, w] = QUANT_SHAPE;
    for r in &rows {
        let what = if r.what.starts_with("copy") || r.what.starts_with("kernel") {
            r.what.clone()
        } else {
            format!("quantizer: {}", r.what)
        };
        out.push(Line {
            section: "quant",
            case: format!("{what} {n}x{c}x{h}x{w}"),
            variant: format!("{} {}", r.granularity, r.pass.name()),
            runs: (1, reps),
            time: Some((r.median_s, r.min_s, r.max_s)),
            rate: Some((r.elems_per_s(), r.gb_per_s())),
            ratio: copy(r.pass).map(|c| (r.median_s / c, "copy")),
            peak_bytes: None,
            note: String::new(),
        });
    }
    Ok(())
}

fn ops_section(reps: usize, device: &Device, out: &mut Vec<Line>) -> Result<()> {
    let rows = op_rows(OP_SHAPE, Preset::Tensorrt, reps, device)?;
    let [n, c, h, w] = OP_SHAPE;
    for r in &rows {
        let case = format!("{} s{} {n}x{c}x{h}x{w}", r.op, r.stride);
        for (variant, t, ratio) in [
            ("float fwd+bwd", r.float, None),
            ("tensorrt fwd+bwd", r.quant, Some((r.quant.median / r.float.median, "float"))),
        ] {
            out.push(Line {
                section: "op",
                case: case.clone(),
                variant: variant.into(),
                runs: (1, reps),
                time: Some((t.median, t.min, t.max)),
                rate: None,
                ratio,
                peak_bytes: None,
                note: String::new(),
            });
        }
    }
    Ok(())
}

fn search_rows() -> Vec<SearchCase> {
    let mut rows = Vec::new();
    let pc = SearchShape { name: "darts-pc4", partial: 4, ..DARTS_SHAPE };
    for shape in [DEFAULT_SHAPE, DARTS_SHAPE] {
        for order in [Order::First, Order::Second] {
            for preset in [Preset::Float, Preset::Tensorrt] {
                rows.push(SearchCase { shape, order, preset, batched: false, bits: false });
            }
        }
        if shape == DARTS_SHAPE {
            let row = SearchCase {
                shape: pc,
                order: Order::First,
                preset: Preset::Tensorrt,
                batched: false,
                bits: false,
            };
            rows.insert(rows.len() - 2, row);
        }
    }
    rows
}

/// A step's cost relative to the first-order float step of the same shape (for the budget).
fn relative_cost(row: &SearchCase) -> f64 {
    let order = if row.order == Order::Second { 2.6 } else { 1.0 };
    let quant = if row.preset == Preset::Float { 1.0 } else { 1.3 };
    let pc = if row.shape.partial > 1 { 0.5 } else { 1.0 };
    order * quant * pc
}

/// Activation elements of one supernet pass, up to a constant (for scaling step times; partial
/// channels are [`relative_cost`]'s).
fn activation_size(sh: &SearchShape) -> f64 {
    (sh.batch * sh.c * sh.hw * sh.hw * sh.layers) as f64
}

fn search_section(
    args: &SuiteArgs,
    device: &Device,
    started: Instant,
    out: &mut Vec<Line>,
) -> Result<()> {
    let budget = (args.budget_s > 0).then_some(args.budget_s as f64);
    // Seconds of one first-order float step, per shape name, once measured.
    let mut unit: Vec<(&str, f64)> = Vec::new();
    for row in search_rows() {
        let sh = row.shape;
        let base = sh.name.trim_end_matches("-pc4");
        // Measured on this shape, else scaled from a smaller shape by activation size (a low
        // estimate: the DARTS shape costs 51× the default on flex for 21× the activations), so
        // that a shape far beyond the budget is skipped without paying for one step of it.
        let est = unit
            .iter()
            .find(|(n, _)| *n == base)
            .map(|(_, u)| *u)
            .or_else(|| {
                let (other, u) = unit.first()?;
                let other = SEARCH_SHAPES.iter().find(|s| s.name == *other)?;
                Some(u * activation_size(&sh) / activation_size(other))
            })
            .map(|u| u * relative_cost(&row));
        let left = budget.map(|b| b - started.elapsed().as_secs_f64());
        let (warmup, reps) = (args.search_warmup, args.search_reps);
        let fits = match (left, est) {
            (Some(left), Some(est)) => est <= left,
            (Some(left), None) => left > 0.0,
            _ => true,
        };
        let case = format!(
            "{} C={} {} cells b{}{}",
            sh.name,
            sh.c,
            sh.layers,
            sh.batch,
            if sh.partial > 1 { format!(" K={}", sh.partial) } else { String::new() }
        );
        let variant = format!("{} order, {}", order_name(row.order), preset_name(row.preset));
        if !fits {
            out.push(Line {
                section: "search",
                case,
                variant,
                runs: (0, 0),
                time: None,
                rate: None,
                ratio: None,
                peak_bytes: None,
                note: format!(
                    "skipped: ~{:.0} s/step does not fit the {} s budget (--budget-s 0 runs it)",
                    est.unwrap_or(0.0),
                    args.budget_s
                ),
            });
            eprintln!("bench: {}", render(&out[out.len() - 1..]).lines().nth(1).unwrap_or(""));
            continue;
        }
        let deadline = budget.map(|b| started + std::time::Duration::from_secs_f64(b));
        let t = time_search_step(&row, reps, warmup, deadline, device)?;
        let (m, lo, hi, peak) = (t.time.median, t.time.min, t.time.max, t.peak);
        let unit_row = row.order == Order::First && row.preset == Preset::Float;
        if est.is_none() || (unit_row && sh.partial == 1) {
            unit.retain(|(n, _)| *n != base);
            unit.push((base, m / relative_cost(&row)));
        }
        let float = out
            .iter()
            .rev()
            .find(|l| {
                l.case == case && l.variant == format!("{} order, float", order_name(row.order))
            })
            .and_then(|l| l.time.map(|t| t.0));
        out.push(Line {
            section: "search",
            case,
            variant,
            runs: t.runs,
            time: Some((m, lo, hi)),
            rate: None,
            ratio: float.filter(|_| row.preset != Preset::Float).map(|f| (m / f, "float")),
            peak_bytes: peak,
            note: String::new(),
        });
        eprintln!("bench: {}", render(&out[out.len() - 1..]).lines().nth(1).unwrap_or(""));
    }
    Ok(())
}

/// Runs the suite.
pub fn run(args: &SuiteArgs, backend: Backend) -> Result<()> {
    if args.reps == 0 || args.search_reps == 0 {
        bail!("--reps and --search-reps must be at least 1");
    }
    let device = backend.device()?;
    let csv = args
        .csv
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("results/bench-{}.csv", backend.label())));
    if let Some(dir) = csv.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let started = Instant::now();
    let mut lines = Vec::new();
    eprintln!("bench: fake-quant throughput ({} timed runs per row)", args.reps);
    quant_section(args.reps, &device, &mut lines)?;
    eprintln!("bench: candidate ops");
    ops_section(args.reps.min(3), &device, &mut lines)?;
    eprintln!("bench: search steps");
    search_section(args, &device, started, &mut lines)?;
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    println!(
        "qdarts bench on {} ({cores} cores): median and min..max of the timed runs after warm-up; \
         runs = warm-up+timed; peak MiB = largest live heap during a search step{}",
        backend.label(),
        if backend.kind() == BackendKind::Flex { "" } else { " (device pool bytes reserved)" }
    );
    print!("{}", render(&lines));
    write_csv(&csv, csv_lines(backend, &lines))
        .with_context(|| format!("writing {}", csv.display()))?;
    println!(
        "{} rows in {:.0} s; CSV: {}",
        lines.len(),
        started.elapsed().as_secs_f64(),
        csv.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_suite_times_both_shapes_both_orders_float_and_fake_quant_and_pc_darts() {
        let rows = search_rows();
        for shape in ["default", "darts"] {
            for order in [Order::First, Order::Second] {
                for preset in [Preset::Float, Preset::Tensorrt] {
                    assert!(
                        rows.iter().any(|r| r.shape.name == shape
                            && r.order == order
                            && r.preset == preset),
                        "missing {shape} {order:?} {preset:?}"
                    );
                }
            }
        }
        let darts = rows.iter().find(|r| r.shape.name == "darts").map(|r| r.shape);
        let darts = darts.expect("darts shape");
        assert_eq!((darts.c, darts.layers, darts.batch, darts.hw), (16, 8, 64, 32));
        assert!(rows.iter().any(|r| r.shape.partial == 4));
        // Cheapest first within a shape, so the budget drops the dearest rows.
        let costs: Vec<f64> =
            rows.iter().filter(|r| r.shape.name.starts_with("darts")).map(relative_cost).collect();
        assert!(costs.windows(2).all(|w| w[0] <= w[1] + 1.0), "{costs:?}");
    }

    #[test]
    fn skipped_rows_are_listed_with_their_reason_and_csv_quotes_text() {
        let line = Line {
            section: "search",
            case: "darts C=16 8 cells b64".into(),
            variant: "second order, float".into(),
            runs: (0, 0),
            time: None,
            rate: None,
            ratio: None,
            peak_bytes: None,
            note: "skipped: ~80 s/step does not fit".into(),
        };
        let table = render(std::slice::from_ref(&line));
        assert!(table.contains("skipped: ~80 s/step") && table.contains("0+0"), "{table}");
        let path =
            std::env::temp_dir().join(format!("qdarts-suite-csv-{}.csv", std::process::id()));
        write_csv(&path, csv_lines(Backend::FLEX, &[line])).expect("write");
        let text = std::fs::read_to_string(&path).expect("read");
        std::fs::remove_file(&path).ok();
        let mut lines = text.lines();
        let header = lines.next().expect("header");
        assert!(
            header.starts_with("backend,section,case,variant,warmup,reps,median_s"),
            "{header}"
        );
        let row = lines.next().expect("row");
        assert!(
            row.starts_with("flex,search,darts C=16 8 cells b64,\"second order, float\",0,0,,"),
            "{row}"
        );
        let fields = csv::Reader::from_reader(text.as_bytes())
            .records()
            .next()
            .expect("one record")
            .expect("parses");
        assert_eq!(fields.len(), header.split(',').count());
        assert_eq!(&fields[14], "skipped: ~80 s/step does not fit");
    }
}
