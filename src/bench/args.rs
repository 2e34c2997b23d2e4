//! `qdarts bench`'s command line: what to benchmark and the values its flags take.

use std::path::PathBuf;

use clap::Subcommand;
use qdarts_ops::qconfig::Preset;
use qdarts_search::config::Order;

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
    /// Seconds per search step (architecture step + weight step): by default first and second
    /// order, float and fake-quant; `--order` / `--quant` pick one, and `--batch`, `--layers`,
    /// `--init-channels` change the shape.
    Search {
        /// Supernet shape(s) to start from.
        #[arg(long, value_enum, default_value = "default")]
        shape: SearchShapeArg,
        /// Batch size (overrides the shape's).
        #[arg(long)]
        batch: Option<usize>,
        /// Cells (overrides the shape's).
        #[arg(long)]
        layers: Option<usize>,
        /// Channels of the first cell (overrides the shape's).
        #[arg(long)]
        init_channels: Option<usize>,
        /// Only this order.
        #[arg(long, value_enum)]
        order: Option<OrderArg>,
        /// Only this quantization preset.
        #[arg(long, value_enum)]
        quant: Option<PresetArg>,
        /// Run the supernet's cells in waves (the batched cell, `model.batched_cells`; not
        /// with `--quant lsq`).
        #[arg(long)]
        batched_cells: bool,
        /// A bit-width search (EdMIPS' composite quantization) over weights of 2, 4 or 8 bits
        /// and activations of 4 or 8, as `experiments/bits-default.toml` (tensorrt unless
        /// `--quant` names another quantized preset).
        #[arg(long)]
        bits: bool,
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
    /// One search cell's forward+backward, edge by edge against in waves (the batched
    /// cell): kernel launches (CubeCL backends) and seconds, in interleaved rounds.
    Cell {
        /// Batch size.
        #[arg(long, default_value_t = 2)]
        batch: usize,
        /// Channels of the cell.
        #[arg(long, default_value_t = 4)]
        channels: usize,
        /// Height and width of its inputs.
        #[arg(long, default_value_t = 8)]
        size: usize,
        /// Quantization preset of the cell.
        #[arg(long, value_enum, default_value = "float")]
        quant: PresetArg,
        /// Rounds of edges then waves, alternating, after one warm-up each.
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// Also list each form's N most launched kernels (CubeCL backends). With
        /// QDARTS_LAUNCH_TRACE=NAME in the environment, every launch of a kernel whose name
        /// contains NAME is printed on standard error with the lines it comes from.
        #[arg(long, value_name = "N", default_value_t = 0)]
        kernels: usize,
        /// Also write the table as CSV.
        #[arg(long)]
        csv: Option<PathBuf>,
    },
    /// Integer-runtime throughput (images/s) of a frozen model on its run's test images,
    /// single-threaded and on every core, beside onnxruntime on the run's exported
    /// frozen/model.onnx over the same images when Python has onnxruntime.
    Runtime {
        /// Training run folder with frozen/model.qdf.
        run: PathBuf,
        /// Timed passes over the test set per row (after one warm-up).
        #[arg(long, default_value_t = 3)]
        reps: usize,
        /// Rounds of qdarts then onnxruntime, alternating; the ratios are the median of the
        /// per-round ratios with their min..max.
        #[arg(long, default_value_t = 1)]
        rounds: usize,
        /// Also time the direct (reference) convolution kernel.
        #[arg(long)]
        direct: bool,
        /// Python interpreter for the onnxruntime column (`none` leaves it out).
        #[arg(long, default_value = "python3")]
        python: String,
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

/// The architecture gradient on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OrderArg {
    /// DARTS first order.
    First,
    /// DARTS second order (unrolled).
    Second,
}

impl From<OrderArg> for Order {
    fn from(o: OrderArg) -> Order {
        match o {
            OrderArg::First => Order::First,
            OrderArg::Second => Order::Second,
        }
    }
}

/// A quantization preset on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PresetArg {
    /// No quantization.
    Float,
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
            PresetArg::Float => Preset::Float,
            PresetArg::Tensorrt => Preset::Tensorrt,
            PresetArg::OnnxQdq => Preset::OnnxQdq,
            PresetArg::Paddle => Preset::Paddle,
            PresetArg::Lsq => Preset::Lsq,
        }
    }
}

pub(super) fn parse_shape(s: &str) -> Result<[usize; 4], String> {
    let dims: Vec<usize> = s
        .split(',')
        .map(|d| d.trim().parse::<usize>().map_err(|e| format!("`{d}`: {e}")))
        .collect::<Result<_, _>>()?;
    match dims.as_slice() {
        &[n, c, h, w] if n * c * h * w > 0 => Ok([n, c, h, w]),
        _ => Err(format!("expected four positive dimensions N,C,H,W, got `{s}`")),
    }
}
