//! The command line: `qdarts`' global flags, its commands and their arguments (clap's
//! `--help` text is their doc comments).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::backend::{self, BackendKind};
use crate::{bench, compare_cmd, sweep_cmd};

#[derive(Debug, Parser)]
#[command(
    name = "qdarts",
    version,
    about = "Quantization-aware DARTS: search, watch, train, freeze, export"
)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) on: BackendArgs,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Where a model runs. Given before the command (`qdarts --backend wgpu search`) or after it on
/// the commands that run a model (`qdarts search --backend wgpu`; after it wins).
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct BackendArgs {
    /// Compute backend (those compiled in: see `cargo build --features`) [default: flex].
    #[arg(long, value_enum)]
    pub(crate) backend: Option<BackendKind>,
    /// Device of the backend: `cpu`, or `cuda:N` for `--backend cuda` and `--backend tch`
    /// [default: cpu for flex and tch, cuda:0 for cuda, wgpu's own choice of adapter].
    #[arg(long, value_name = "DEVICE")]
    pub(crate) device: Option<String>,
    /// GPU memory pools of `--backend cuda` and `wgpu`: `exclusive` (one page per allocation,
    /// faster, more memory) or `adaptive` (CubeCL's default: shared pages, less memory)
    /// [default: exclusive].
    #[arg(long, value_enum, value_name = "POOLS")]
    pub(crate) memory_pools: Option<backend::MemoryPools>,
}

impl BackendArgs {
    /// Whether any of the three was given.
    pub(crate) fn given(&self) -> bool {
        self.backend.is_some() || self.device.is_some() || self.memory_pools.is_some()
    }

    /// These (given after the command) over `root` (given before it), flag by flag.
    pub(crate) fn over(self, root: Self) -> Self {
        Self {
            backend: self.backend.or(root.backend),
            device: self.device.or(root.device),
            memory_pools: self.memory_pools.or(root.memory_pools),
        }
    }
}

impl Command {
    /// The backend flags given after the command, on the commands that run a model; `None` for
    /// the others.
    pub(crate) fn backend_args(&self) -> Option<&BackendArgs> {
        match self {
            Command::Search(SearchCli { on, .. })
            | Command::Train(TrainCli { on, .. })
            | Command::Freeze { on, .. }
            | Command::Eval { on, .. }
            | Command::DumpStep { on, .. }
            | Command::Parity { on, .. }
            | Command::Sweep { on, .. }
            | Command::Bench { on, .. } => Some(on),
            _ => None,
        }
    }

    /// The command's name on the command line.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Command::Search(_) => "search",
            Command::Train(_) => "train",
            Command::Freeze { .. } => "freeze",
            Command::Export { .. } => "export",
            Command::Eval { .. } => "eval",
            Command::DumpStep { .. } => "dump-step",
            Command::Parity { .. } => "parity",
            Command::Sweep { .. } => "sweep",
            Command::Compare { .. } => "compare",
            Command::Plot { .. } => "plot",
            Command::Sample { .. } => "sample",
            Command::Check { .. } => "check",
            Command::Dashboard { .. } => "dashboard",
            Command::Bench { .. } => "bench",
        }
    }

    /// Whether the command runs on the CPU only and refuses another backend by name
    /// ([`crate::cpu_only`]).
    pub(crate) fn cpu_only(&self) -> bool {
        matches!(self, Command::Export { .. } | Command::Check { .. })
    }
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Search a fake-quantized DARTS supernet and derive a genotype into results/<run>/.
    Search(SearchCli),
    /// Train the discrete network of a genotype with quantization-aware training.
    Train(TrainCli),
    /// Freeze a trained run into an integer-only model (<run>/frozen/model.qdf).
    Freeze {
        /// Training run folder.
        run: PathBuf,
        #[command(flatten)]
        on: BackendArgs,
    },
    /// Export a frozen model as ONNX in QDQ form (<run>/frozen/model.onnx).
    Export {
        /// Training run folder (frozen first).
        run: PathBuf,
    },
    /// Compare the fake-quant and the integer model on the test set.
    Eval {
        /// Training run folder (frozen first).
        run: PathBuf,
        /// Threads of the integer runtime.
        #[arg(long, default_value_t = default_threads())]
        threads: usize,
        #[command(flatten)]
        on: BackendArgs,
    },
    /// Write one search step's inputs for the PyTorch reference (scripts/torch_reference.py):
    /// a small supernet after one weight step, α, momentum, a training and a validation batch.
    /// The shape options make other fixtures: `--channels 4 --layers 4 --nodes 3 --batch 32` is
    /// the default experiment's supernet.
    DumpStep {
        /// Quantization preset of the supernet.
        #[arg(long, value_enum, default_value = "tensorrt")]
        preset: bench::PresetArg,
        /// Channels of the first cell.
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..))]
        channels: u16,
        /// Cells (reductions at a third and two thirds of them).
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..))]
        layers: u16,
        /// Intermediate nodes per cell.
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..))]
        nodes: u16,
        /// Images per batch (three batches are taken from the embedded training images).
        #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=1024))]
        batch: u16,
        /// Folder to write (spec.json and *.safetensors).
        #[arg(long)]
        out: PathBuf,
        /// Also write what qdarts computes from them (qdarts.safetensors).
        #[arg(long)]
        with_outputs: bool,
        #[command(flatten)]
        on: BackendArgs,
    },
    /// Check one search step on this backend against the PyTorch reference's fixtures
    /// (`scripts/torch_reference.py`): α gradients, the steps of α and the weights, the loss.
    /// Prints one row per quantity; exits 1 if any is off its bound.
    Parity {
        /// Fixture folders (each with spec.json and expected.safetensors), or a folder of them.
        #[arg(default_value = "search/tests/fixtures/parity")]
        fixtures: Vec<PathBuf>,
        /// Also write what qdarts computed, `<DIR>/<fixture>/qdarts.safetensors` (the names of
        /// expected.safetensors), to look into a difference tensor by tensor.
        #[arg(long, value_name = "DIR")]
        write_outputs: Option<PathBuf>,
        /// Run the supernet's cells in waves (the batched cell, `model.batched_cells`), from
        /// the same weights, statistics and momentum buffers; LSQ fixtures are listed as
        /// skipped.
        #[arg(long)]
        batched_cells: bool,
        #[command(flatten)]
        on: BackendArgs,
    },
    /// Expand a sweep file (a grid or list over config keys, and seeds) into numbered trials
    /// in results/<sweep>/; write Slurm / Kubernetes files that run them, or run them here.
    Sweep {
        #[command(flatten)]
        args: sweep_cmd::SweepArgs,
        #[command(flatten)]
        on: BackendArgs,
    },
    /// Runs side by side: config differences, seed, top-1, genotype, cost, wall time; mean ±
    /// std over seeds; how often each edge was chosen; searched vs random genotypes.
    Compare {
        /// Run folders, sweep folders, or folders of runs (such as results/).
        #[arg(required = true)]
        runs: Vec<PathBuf>,
        /// Runs of the random-genotype baseline (training runs of `qdarts sample` genotypes).
        #[arg(long, num_args = 1.., value_name = "RUN")]
        baseline: Vec<PathBuf>,
        /// Also write the table as CSV (with a baseline, the methods' figures beside it as
        /// FILE's stem + `-methods.csv`).
        #[arg(long, value_name = "FILE")]
        csv: Option<PathBuf>,
        /// Compare training runs that differ in training keys other than the genotype and the
        /// seed (refused otherwise: the sides would not be trained alike).
        #[arg(long)]
        allow_differing_keys: bool,
        /// The figure compared: the last evaluation's top-1 (fake-quant) or `qdarts eval`'s
        /// integer model top-1.
        #[arg(long, value_enum, default_value = "fake-quant")]
        score: compare_cmd::ScoreArg,
        /// Also pair each method's genotypes with the baseline's by the seed of the search they
        /// came from, and test the paired differences (t, Wilcoxon, sign flips).
        #[arg(long)]
        paired: bool,
        /// With --paired: test equivalence within this many points of top-1 (two one-sided
        /// tests).
        #[arg(long, value_name = "POINTS", requires = "paired", value_parser = compare_cmd::parse_margin)]
        equivalence_margin: Option<f64>,
        /// Also draw the across-run figures (SVG and PNG) into this folder.
        #[arg(long, value_name = "DIR")]
        plot: Option<PathBuf>,
    },
    /// Draw a run: its cells (graphviz when installed), loss / top-1 curves, α per edge over
    /// epochs, per-layer quantization error; SVG and PNG into <run>/plots/.
    Plot {
        /// Run folder.
        run: PathBuf,
        /// Output folder [default: <run>/plots].
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
        /// Cell layout: graphviz `dot` when installed (auto), `dot`, or the built-in one.
        #[arg(long, value_enum, default_value = "auto")]
        cells: compare_cmd::CellRenderer,
    },
    /// Write random genotypes of a search space (the random-search baseline).
    Sample {
        /// How many.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=10_000))]
        random: u32,
        /// Seed of the draw.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Search config whose space (nodes, primitives) is sampled.
        #[arg(long, default_value = "experiments/default.toml")]
        config: PathBuf,
        /// Folder of the genotype files (random-000.json, .txt, ...).
        #[arg(long, default_value = "results/random")]
        out: PathBuf,
    },
    /// Check a run folder: its config, both checkpoints against their checksums, every table,
    /// the frozen model. Exits 1 when something is wrong.
    Check {
        /// Run folder, e.g. results/default-20261122-014901.
        run: PathBuf,
    },
    /// Watch a run record in the terminal (live, finished or copied).
    Dashboard {
        /// Run folder, e.g. results/default-20261122-014901.
        run: PathBuf,
        #[command(flatten)]
        dash: DashArgs,
    },
    /// Benchmarks. Without a subcommand: the whole suite as one table (and a CSV file):
    /// fake-quant throughput per observer, each candidate op, and search steps.
    Bench {
        #[command(subcommand)]
        what: Option<bench::BenchCommand>,
        #[command(flatten)]
        suite: bench::suite::SuiteArgs,
        #[command(flatten)]
        on: BackendArgs,
    },
}

/// Running one trial of a sweep.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct TrialArgs {
    /// Run a trial of this sweep folder (made by `qdarts sweep`); its folder is resumed when
    /// it has a checkpoint.
    #[arg(long, value_name = "SWEEP_DIR", conflicts_with_all = ["config", "overrides", "resume", "data", "dataset"])]
    pub(crate) sweep: Option<PathBuf>,
    /// The trial [default: $SLURM_ARRAY_TASK_ID, else $JOB_COMPLETION_INDEX].
    #[arg(long, value_name = "N", requires = "sweep")]
    pub(crate) trial: Option<usize>,
}

/// Dashboard settings.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct DashArgs {
    /// How often the dashboard reads the run folder, in milliseconds.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(50..=60_000))]
    pub(crate) refresh_ms: u64,
    /// Quantizers under this SQNR (dB) are highlighted.
    #[arg(long, default_value_t = 20.0)]
    pub(crate) sqnr_threshold: f64,
}

impl DashArgs {
    pub(crate) fn options(&self) -> qdarts_tui::Options {
        qdarts_tui::Options {
            refresh: std::time::Duration::from_millis(self.refresh_ms),
            sqnr_threshold: self.sqnr_threshold,
        }
    }
}

fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// What a run starts from: a config and its overrides, or the run folder to resume.
#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// Experiment config (TOML) [default: experiments/default.toml].
    #[arg(long, conflicts_with = "resume")]
    pub(crate) config: Option<PathBuf>,
    /// Override a config key, e.g. `--set search.epochs=5`.
    #[arg(long = "set", value_name = "KEY=VALUE", conflicts_with = "resume")]
    pub(crate) overrides: Vec<String>,
    /// Continue an interrupted run with the config it started with.
    #[arg(long, value_name = "RUN_DIR")]
    pub(crate) resume: Option<PathBuf>,
    /// With --resume: add this many epochs to the run (recorded in its changes.csv; the
    /// cosine learning rate is stretched over the new total).
    #[arg(long, value_name = "N", requires = "resume", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(crate) extend_epochs: Option<u32>,
}

impl RunArgs {
    /// The epochs `--extend-epochs` adds (none without it).
    pub(crate) fn extra_epochs(&self) -> usize {
        self.extend_epochs.map_or(0, |n| n as usize)
    }
}

/// `qdarts search`'s arguments.
#[derive(Debug, Args)]
pub(crate) struct SearchCli {
    #[command(flatten)]
    pub(crate) run: RunArgs,
    /// Show the dashboard while searching (logs go to the run's debug.log).
    #[arg(long)]
    pub(crate) dashboard: bool,
    #[command(flatten)]
    pub(crate) dash: DashArgs,
    #[command(flatten)]
    pub(crate) data: DataArgs,
    #[command(flatten)]
    pub(crate) trial: TrialArgs,
    #[command(flatten)]
    pub(crate) on: BackendArgs,
}

/// `qdarts train`'s arguments: [`RunArgs`] in training's words.
#[derive(Debug, Args)]
#[command(
    mut_arg("config", |a| a.help("Training config (TOML) [default: experiments/train-default.toml]")),
    mut_arg("overrides", |a| a.help("Override a config key, e.g. `--set train.epochs=5`")),
    mut_arg("resume", |a| a.help("Continue an interrupted training run with the config it started with")),
)]
pub(crate) struct TrainCli {
    #[command(flatten)]
    pub(crate) run: RunArgs,
    /// The genotype: a JSON or DARTS-text file, a search run folder, or a shipped name
    /// such as DARTS_V2 (sets `genotype`).
    #[arg(long, conflicts_with = "resume")]
    pub(crate) genotype: Option<String>,
    #[command(flatten)]
    pub(crate) data: DataArgs,
    #[command(flatten)]
    pub(crate) trial: TrialArgs,
    #[command(flatten)]
    pub(crate) on: BackendArgs,
}

/// Where a new search's or training run's data comes from, over its config.
#[derive(Debug, Args)]
pub(crate) struct DataArgs {
    /// Folder of the dataset files (sets `data.path`).
    #[arg(long, value_name = "DIR", conflicts_with = "resume")]
    pub(crate) data: Option<PathBuf>,
    /// Dataset (sets `data.dataset`).
    #[arg(long, value_parser = ["fashion-mnist", "mnist", "cifar10"], conflicts_with = "resume")]
    pub(crate) dataset: Option<String>,
}
