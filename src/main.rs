//! `qdarts`: quantization-aware differentiable architecture search.
//!
//! Exit codes: 0 success; 1 error (message on stderr); 2 invalid command line.

// The doc comments of the command-line structs are clap's `--help` text, where `<run>` is a
// placeholder, not an HTML tag.
#![allow(rustdoc::invalid_html_tags)]

mod alloc;
mod backend;
mod bench;
mod check_cmd;
mod cli;
mod compare_cmd;
mod dashboard_cmd;
mod debug_log;
mod kill_point;
mod search_cmd;
mod sweep_cmd;
mod train_cmd;

use std::ops::ControlFlow;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

use backend::{Backend, BackendKind};
use cli::{Cli, Command, DataArgs, RunArgs, SearchCli, TrainCli};
use qdarts_engine::Progress;
use qdarts_sweep::TrialKind;

/// `--data`/`--dataset` as config overrides.
fn data_overrides(overrides: &mut Vec<String>, data: DataArgs) {
    if let Some(d) = data.dataset {
        overrides.push(format!("data.dataset={}", toml_string(&d)));
    }
    if let Some(p) = data.data {
        overrides.push(format!("data.path={}", toml_string(&p.display().to_string())));
    }
}

/// Commands that run on the CPU only (the integer runtime and file exports) refuse another
/// backend rather than ignore it.
pub(crate) fn cpu_only(backend: Backend, command: &str) -> anyhow::Result<()> {
    if backend.kind() == BackendKind::Flex {
        Ok(())
    } else {
        anyhow::bail!(
            "`{command}` runs on the CPU (the integer model, or a file), not on a device: drop \
             --backend {}",
            backend.name()
        )
    }
}

/// Runs `f` on a worker thread of rayon's global pool while the calling thread waits.
///
/// Burn's flex operations and qdarts' kernels each split their work over rayon's pool. Started
/// from a thread outside the pool, every such operation hands its work over and puts the
/// calling thread to sleep until the pool is done; a default-shape search step runs thousands
/// of them, and the default search takes about a third longer that way than on a worker
/// (`docs/results/2026-11-25-rayon-worker.md`), where the thread that starts an operation works
/// on it too. The records are the same bit for bit (`search/tests/threads.rs`).
pub(crate) fn on_rayon_worker<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    rayon::scope(|_| f())
}

/// A search or training loop: `run` on a rayon worker ([`on_rayon_worker`]) with `progress`,
/// each finished step noted first for the message of a failed allocation
/// ([`alloc::note_step`]) and checked against a test's kill point ([`kill_point::check`]).
pub(crate) fn run_loop<R: Send>(
    progress: &mut (impl FnMut(&Progress) -> ControlFlow<()> + Send),
    run: impl FnOnce(&mut dyn FnMut(&Progress) -> ControlFlow<()>) -> R + Send,
) -> R {
    on_rayon_worker(|| {
        let mut noted = |p: &Progress| {
            alloc::note_step(p.epoch, p.step, p.steps);
            kill_point::check(p);
            progress(p)
        };
        run(&mut noted)
    })
}

/// The config file of a search or training: `given`, else `default`, a path relative to the
/// folder qdarts runs in. A default that is not there is refused with the way out (run from the
/// checkout, or `--config`), not with the bare "No such file" of the read; a resumed run reads
/// its own folder's config, so it needs none.
fn default_config(
    given: Option<PathBuf>,
    default: &str,
    resuming: bool,
) -> anyhow::Result<PathBuf> {
    if let Some(path) = given {
        return Ok(path);
    }
    let path = PathBuf::from(default);
    if !resuming && !path.exists() {
        let here = std::env::current_dir().map_or_else(|_| ".".into(), |d| d.display().to_string());
        anyhow::bail!(
            "{default}: not found in {here}: the default --config is read from the folder qdarts \
             runs in; run it from the qdarts checkout, or give --config FILE"
        );
    }
    Ok(path)
}

/// `s` as a TOML string value (quotes, backslashes, newlines and control characters escaped),
/// for a `key=value` override.
fn toml_string(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

/// The backend of the command, its device and pools chosen: the flags after the command over
/// those before it. A command that runs no model refuses them rather than ignore them.
fn chosen_backend(cli: &Cli) -> anyhow::Result<Backend> {
    let on = match cli.command.backend_args() {
        Some(after) => after.clone().over(cli.on.clone()),
        None if cli.command.cpu_only() || !cli.on.given() => cli.on.clone(),
        None => anyhow::bail!(
            "`{}` runs no model: --backend, --device and --memory-pools do nothing there; drop them",
            cli.command.name()
        ),
    };
    let kind = on.backend.unwrap_or(BackendKind::Flex);
    Backend::choose(kind, on.device.as_deref(), on.memory_pools)
}

/// A command line that asks for what cannot be done together: exit code 2, like clap's own.
#[derive(Debug)]
struct Usage(&'static str);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for Usage {}

fn main() -> ExitCode {
    alloc::keep_freed_memory();
    if let Err(e) = alloc::inject_from_env().and_then(|()| kill_point::from_env()) {
        return finish(Err(e));
    }
    if let Err(e) = backend::capture_cuda_sources_from_env() {
        return finish(Err(e));
    }
    let cli = Cli::parse();
    finish(chosen_backend(&cli).and_then(|backend| run_command(cli.command, backend)))
}

/// Runs `command` on `backend`.
fn run_command(command: Command, backend: Backend) -> anyhow::Result<()> {
    match command {
        Command::Search(args) => search(args, backend),
        Command::Train(args) => train(args, backend),
        Command::Freeze { run, .. } => train_cmd::freeze_cmd(&run, backend),
        Command::Export { run } => {
            cpu_only(backend, "export").and_then(|()| train_cmd::export(&run))
        }
        Command::Eval { run, threads, .. } => train_cmd::eval(&run, backend, threads.max(1)),
        Command::Check { run } => cpu_only(backend, "check").and_then(|()| check_cmd::check(&run)),
        Command::Dashboard { run, dash } => dashboard_cmd::run(&run, &dash.options()),
        Command::DumpStep { preset, channels, layers, nodes, batch, out, with_outputs, .. } => {
            let spec = qdarts_search::parity::StepSpec {
                channels: channels.into(),
                layers: layers.into(),
                nodes: nodes.into(),
                batch: batch.into(),
                ..qdarts_search::parity::StepSpec::small(preset.into())
            };
            search_cmd::dump_step(&spec, &out, with_outputs, backend)
        }
        Command::Parity { fixtures, write_outputs, batched_cells, .. } => {
            search_cmd::parity(&fixtures, write_outputs.as_deref(), batched_cells, backend)
        }
        Command::Sweep { args, .. } => sweep_cmd::sweep(&args, backend),
        Command::Compare {
            runs,
            baseline,
            csv,
            allow_differing_keys,
            score,
            paired,
            equivalence_margin,
            plot,
        } => {
            let out = compare_cmd::Outputs { csv: csv.as_deref(), plot: plot.as_deref() };
            let options = qdarts_sweep::compare::Options {
                score: score.into(),
                paired,
                margin: equivalence_margin.map(|points| points / 100.0),
            };
            compare_cmd::compare(&runs, &baseline, allow_differing_keys, options, out)
        }
        Command::Plot { run, out, cells } => compare_cmd::plot(&run, out.as_deref(), cells),
        Command::Sample { random, seed, config, out } => {
            compare_cmd::sample(random as usize, seed, &config, &out)
        }
        Command::Bench { what: Some(what), .. } => bench::run(what, backend),
        Command::Bench { what: None, suite, .. } => bench::suite::run(&suite, backend),
    }
}

/// `qdarts search`: a new run, a resumed one, or a sweep's trial.
fn search(args: SearchCli, backend: Backend) -> anyhow::Result<()> {
    let SearchCli { run, dashboard, dash, data, trial, .. } = args;
    if let Some(dir) = trial.sweep {
        if dashboard {
            return Err(Usage(
                "--dashboard does not go with --sweep; attach one with `qdarts dashboard <trial folder>`",
            )
            .into());
        }
        return sweep_cmd::run_trial(&dir, trial.trial, TrialKind::Search, backend);
    }
    let extend_epochs = run.extra_epochs();
    let RunArgs { config, mut overrides, resume, .. } = run;
    data_overrides(&mut overrides, data);
    let config = default_config(config, "experiments/default.toml", resume.is_some())?;
    search_cmd::run(&search_cmd::SearchArgs {
        config: &config,
        overrides: &overrides,
        resume: resume.as_deref(),
        extend_epochs,
        backend,
        dashboard,
        dash: dash.options(),
    })
}

/// `qdarts train`: a new training run, a resumed one, or a sweep's trial.
fn train(args: TrainCli, backend: Backend) -> anyhow::Result<()> {
    let TrainCli { run, genotype, data, trial, .. } = args;
    if let Some(dir) = trial.sweep {
        if genotype.is_some() {
            return Err(
                Usage("--genotype does not go with --sweep: the sweep's trials set it").into()
            );
        }
        return sweep_cmd::run_trial(&dir, trial.trial, TrialKind::Train, backend);
    }
    let extend_epochs = run.extra_epochs();
    let RunArgs { config, mut overrides, resume, .. } = run;
    data_overrides(&mut overrides, data);
    if let Some(g) = genotype {
        overrides.push(format!("genotype={}", toml_string(&g)));
    }
    let config = default_config(config, "experiments/train-default.toml", resume.is_some())?;
    train_cmd::train(&train_cmd::TrainArgs {
        config: &config,
        overrides: &overrides,
        resume: resume.as_deref(),
        extend_epochs,
        backend,
    })
}

fn finish(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("qdarts: error: {e:#}");
            if e.downcast_ref::<Usage>().is_some() { ExitCode::from(2) } else { ExitCode::FAILURE }
        }
    }
}
