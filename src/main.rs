//! `qdarts`: quantization-aware differentiable architecture search.
//!
//! Exit codes: 0 success; 1 error (message on stderr); 2 invalid command line.

mod alloc;
mod backend;
mod bench;
mod dashboard_cmd;
mod debug_log;
mod search_cmd;
mod train_cmd;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use backend::Backend;

#[derive(Debug, Parser)]
#[command(
    name = "qdarts",
    version,
    about = "Quantization-aware DARTS: search, watch, train, freeze, export"
)]
struct Cli {
    /// Compute backend (those compiled in: see `cargo build --features`).
    #[arg(long, global = true, value_enum, default_value = "flex")]
    backend: Backend,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Search a fake-quantized DARTS supernet and derive a genotype into results/<run>/.
    Search {
        /// Experiment config (TOML) [default: experiments/default.toml].
        #[arg(long, conflicts_with = "resume")]
        config: Option<PathBuf>,
        /// Override a config key, e.g. `--set search.epochs=5`.
        #[arg(long = "set", value_name = "KEY=VALUE", conflicts_with = "resume")]
        overrides: Vec<String>,
        /// Continue an interrupted run with the config it started with.
        #[arg(long, value_name = "RUN_DIR")]
        resume: Option<PathBuf>,
        /// With --resume: add this many epochs to the run (recorded in its changes.csv; the
        /// cosine learning rate is stretched over the new total).
        #[arg(long, value_name = "N", requires = "resume", value_parser = clap::value_parser!(u32).range(1..=100_000))]
        extend_epochs: Option<u32>,
        /// Show the dashboard while searching (logs go to the run's debug.log).
        #[arg(long)]
        dashboard: bool,
        #[command(flatten)]
        dash: DashArgs,
        /// Folder of the dataset files (sets `data.path`).
        #[arg(long, value_name = "DIR", conflicts_with = "resume")]
        data: Option<PathBuf>,
        /// Dataset (sets `data.dataset`).
        #[arg(long, value_parser = ["fashion-mnist", "mnist", "cifar10"], conflicts_with = "resume")]
        dataset: Option<String>,
    },
    /// Train the discrete network of a genotype with quantization-aware training.
    Train {
        /// Training config (TOML) [default: experiments/train-default.toml].
        #[arg(long, conflicts_with = "resume")]
        config: Option<PathBuf>,
        /// The genotype: a JSON or DARTS-text file, a search run folder, or a shipped name
        /// such as DARTS_V2 (sets `genotype`).
        #[arg(long, conflicts_with = "resume")]
        genotype: Option<String>,
        /// Override a config key, e.g. `--set train.epochs=5`.
        #[arg(long = "set", value_name = "KEY=VALUE", conflicts_with = "resume")]
        overrides: Vec<String>,
        /// Continue an interrupted training run with the config it started with.
        #[arg(long, value_name = "RUN_DIR")]
        resume: Option<PathBuf>,
        /// With --resume: add this many epochs to the run (recorded in its changes.csv).
        #[arg(long, value_name = "N", requires = "resume", value_parser = clap::value_parser!(u32).range(1..=100_000))]
        extend_epochs: Option<u32>,
        /// Folder of the dataset files (sets `data.path`).
        #[arg(long, value_name = "DIR", conflicts_with = "resume")]
        data: Option<PathBuf>,
        /// Dataset (sets `data.dataset`).
        #[arg(long, value_parser = ["fashion-mnist", "mnist", "cifar10"], conflicts_with = "resume")]
        dataset: Option<String>,
    },
    /// Freeze a trained run into an integer-only model (<run>/frozen/model.qdf).
    Freeze {
        /// Training run folder.
        run: PathBuf,
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
    },
    /// Write one search step's inputs for the PyTorch reference (scripts/torch_reference.py):
    /// a small supernet after one weight step, α, momentum, a training and a validation batch.
    DumpStep {
        /// Quantization preset of the supernet.
        #[arg(long, value_enum, default_value = "tensorrt")]
        preset: bench::PresetArg,
        /// Folder to write (spec.json and *.safetensors).
        #[arg(long)]
        out: PathBuf,
        /// Also write what qdarts computes from them (qdarts.safetensors).
        #[arg(long)]
        with_outputs: bool,
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
    },
}

/// Dashboard settings.
#[derive(Debug, Clone, clap::Args)]
struct DashArgs {
    /// How often the dashboard reads the run folder, in milliseconds.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(50..=60_000))]
    refresh_ms: u64,
    /// Quantizers under this SQNR (dB) are highlighted.
    #[arg(long, default_value_t = 20.0)]
    sqnr_threshold: f64,
}

impl DashArgs {
    fn options(&self) -> qdarts_tui::Options {
        qdarts_tui::Options {
            refresh: std::time::Duration::from_millis(self.refresh_ms),
            sqnr_threshold: self.sqnr_threshold,
        }
    }
}

fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// `--data`/`--dataset` as config overrides.
fn data_overrides(overrides: &mut Vec<String>, data: Option<PathBuf>, dataset: Option<String>) {
    if let Some(d) = dataset {
        overrides.push(format!("data.dataset=\"{d}\""));
    }
    if let Some(p) = data {
        overrides.push(format!("data.path={}", toml_string(&p.display().to_string())));
    }
}

/// Commands that run on the CPU only (the integer runtime and file exports) refuse another
/// backend rather than ignore it.
pub(crate) fn cpu_only(backend: Backend, command: &str) -> anyhow::Result<()> {
    if backend == Backend::Flex {
        Ok(())
    } else {
        anyhow::bail!(
            "`{command}` runs on the CPU (the integer model, or a file), not on a device: drop \
             --backend {}",
            backend.name()
        )
    }
}

fn toml_string(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Search {
            config,
            mut overrides,
            resume,
            extend_epochs,
            dashboard,
            dash,
            data,
            dataset,
        } => {
            data_overrides(&mut overrides, data, dataset);
            let config = config.unwrap_or_else(|| PathBuf::from("experiments/default.toml"));
            search_cmd::run(&search_cmd::SearchArgs {
                config: &config,
                overrides: &overrides,
                resume: resume.as_deref(),
                extend_epochs: extend_epochs.map_or(0, |n| n as usize),
                backend: cli.backend,
                dashboard,
                dash: dash.options(),
            })
        }
        Command::Train {
            config,
            genotype,
            mut overrides,
            resume,
            extend_epochs,
            data,
            dataset,
        } => {
            data_overrides(&mut overrides, data, dataset);
            if let Some(g) = genotype {
                overrides.push(format!("genotype={}", toml_string(&g)));
            }
            let config = config.unwrap_or_else(|| PathBuf::from("experiments/train-default.toml"));
            train_cmd::train(&train_cmd::TrainArgs {
                config: &config,
                overrides: &overrides,
                resume: resume.as_deref(),
                extend_epochs: extend_epochs.map_or(0, |n| n as usize),
                backend: cli.backend,
            })
        }
        Command::Freeze { run } => train_cmd::freeze_cmd(&run, cli.backend),
        Command::Export { run } => {
            cpu_only(cli.backend, "export").and_then(|()| train_cmd::export(&run))
        }
        Command::Eval { run, threads } => train_cmd::eval(&run, cli.backend, threads.max(1)),
        Command::Dashboard { run, dash } => dashboard_cmd::run(&run, &dash.options()),
        Command::DumpStep { preset, out, with_outputs } => {
            search_cmd::dump_step(preset.into(), &out, with_outputs, cli.backend)
        }
        Command::Bench { what: Some(what), .. } => bench::run(what, cli.backend),
        Command::Bench { what: None, suite } => bench::suite::run(&suite, cli.backend),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("qdarts: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
