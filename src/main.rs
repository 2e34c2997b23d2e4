//! `qdarts`: quantization-aware differentiable architecture search.
//!
//! Exit codes: 0 success; 1 error (message on stderr); 2 invalid command line; 3 the command is
//! not available in this version yet.

mod backend;
mod bench;
mod dashboard_cmd;
mod debug_log;
mod search_cmd;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use backend::Backend;

/// Exit code of a command that this version does not provide yet.
const EXIT_NOT_AVAILABLE: u8 = 3;

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
        /// Experiment config (TOML).
        #[arg(long, default_value = "experiments/default.toml")]
        config: PathBuf,
        /// Override a config key, e.g. `--set search.epochs=5`.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        overrides: Vec<String>,
        /// Continue an interrupted run.
        #[arg(long, value_name = "RUN_DIR")]
        resume: Option<PathBuf>,
        /// Show the dashboard while searching (logs go to the run's debug.log).
        #[arg(long)]
        dashboard: bool,
        #[command(flatten)]
        dash: DashArgs,
        /// Folder of the dataset files (sets `data.path`).
        #[arg(long, value_name = "DIR")]
        data: Option<PathBuf>,
        /// Dataset (sets `data.dataset`).
        #[arg(long, value_parser = ["fashion-mnist", "mnist", "cifar10"])]
        dataset: Option<String>,
    },
    /// Train the discrete network of a genotype with quantization-aware training.
    Train {
        /// Training config (TOML).
        #[arg(long)]
        config: PathBuf,
    },
    /// Freeze a trained run into an integer-only model.
    Freeze {
        /// Run folder.
        run: PathBuf,
    },
    /// Export a frozen model (.qdf, ONNX QDQ).
    Export {
        /// Run folder.
        run: PathBuf,
    },
    /// Evaluate the fake-quant and the integer model on the test set.
    Eval {
        /// Run folder.
        run: PathBuf,
    },
    /// Watch a run record in the terminal (live, finished or copied).
    Dashboard {
        /// Run folder, e.g. results/default-20261122-014901.
        run: PathBuf,
        #[command(flatten)]
        dash: DashArgs,
    },
    /// Benchmarks; prints a table.
    Bench {
        #[command(subcommand)]
        what: bench::BenchCommand,
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

fn not_available(what: &str) -> ExitCode {
    eprintln!(
        "qdarts: `{what}` is not available in this version yet; available now: `qdarts search`, `qdarts dashboard`, `qdarts bench`"
    );
    ExitCode::from(EXIT_NOT_AVAILABLE)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Search { config, mut overrides, resume, dashboard, dash, data, dataset } => {
            if let Some(d) = dataset {
                overrides.push(format!("data.dataset=\"{d}\""));
            }
            if let Some(p) = data {
                let p = p.display().to_string().replace('\\', "\\\\").replace('"', "\\\"");
                overrides.push(format!("data.path=\"{p}\""));
            }
            search_cmd::run(&search_cmd::SearchArgs {
                config: &config,
                overrides: &overrides,
                resume: resume.as_deref(),
                backend: cli.backend,
                dashboard,
                dash: dash.options(),
            })
        }
        Command::Train { .. } => return not_available("train"),
        Command::Freeze { .. } => return not_available("freeze"),
        Command::Export { .. } => return not_available("export"),
        Command::Eval { .. } => return not_available("eval"),
        Command::Dashboard { run, dash } => dashboard_cmd::run(&run, &dash.options()),
        Command::Bench { what } => bench::run(what, cli.backend),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("qdarts: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
