//! `qdarts search`: read the experiment, run the search with a progress bar on stderr, or with
//! the dashboard (the search on a worker thread, logs to `debug.log`); print where the run
//! record is.

use std::io::IsTerminal;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use qdarts_engine::Progress;
use qdarts_engine::checkpoint::damaged_message;
use qdarts_engine::config::Experiment;
use qdarts_engine::{LoopState, RunError, RunKind};
use qdarts_record::{RunDir, RunLayout, choose_checkpoint};
use qdarts_search::config::ExperimentConfig;
use qdarts_search::{SearchOutcome, prepare_search, run_prepared, run_search};
use qdarts_tui::{Exit, SearchControl, SearchPhase};

use crate::backend::Backend;
use crate::debug_log::DebugLog;

/// What `qdarts search` was asked to do.
#[derive(Debug)]
pub struct SearchArgs<'a> {
    /// Experiment config.
    pub config: &'a Path,
    /// `--set` overrides.
    pub overrides: &'a [String],
    /// `--resume` folder.
    pub resume: Option<&'a Path>,
    /// `--extend-epochs` (0: none).
    pub extend_epochs: usize,
    /// Backend.
    pub backend: Backend,
    /// `--dashboard`.
    pub dashboard: bool,
    /// Dashboard settings.
    pub dash: qdarts_tui::Options,
}

/// The config a run reads: the `--config` file, or a resumed run's own `config.toml`.
pub(crate) fn config_source(config: &Path, resume: Option<&Path>) -> PathBuf {
    resume.map_or_else(|| config.to_path_buf(), |dir| RunLayout::new(dir).config())
}

pub(crate) fn progress_bar() -> ProgressBar {
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template(
            "epoch {prefix} [{bar:30}] {pos}/{len} {msg} ({elapsed}, eta {eta})",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar
}

pub(crate) fn show(bar: &ProgressBar, p: &Progress) {
    bar.set_length(p.steps as u64);
    bar.set_prefix(format!("{}/{}", p.epoch + 1, p.epochs));
    bar.set_position(p.step as u64);
    bar.set_message(format!("loss {:.3} top1 {:.1}%", p.loss, 100.0 * p.top1));
}

/// The collapse warning of a derived genotype, on stderr.
pub(crate) fn warn_collapse(g: &qdarts_genotypes::Genotype) {
    if let Some(alert) = g.collapse_alert() {
        eprintln!("warning: {alert}");
    }
}

fn report(out: &SearchOutcome) {
    if out.finished {
        println!("{}", out.genotype.to_darts_text());
        warn_collapse(&out.genotype);
        eprintln!("run record: {}", out.run_dir.display());
    } else {
        eprintln!(
            "stopped cleanly; continue with: qdarts search --resume {}",
            out.run_dir.display()
        );
    }
}

/// The config of a resumed run: the one it started with (plus `--extend-epochs`); notes when
/// the run has no checkpoint to resume from.
pub(crate) fn resumed_config<C>(
    dir: &Path,
    kind: RunKind,
    load: impl Fn(&Path) -> Result<C, qdarts_engine::ConfigError>,
) -> Result<C> {
    if !dir.is_dir() {
        bail!("{}: no such run folder", dir.display());
    }
    RunKind::expect(dir, kind)?;
    let layout = RunLayout::new(dir);
    let cfg = load(&layout.config())?;
    let choice = choose_checkpoint(&layout);
    let damaged = damaged_message(&choice.damaged);
    match &choice.dir {
        None if choice.damaged.is_empty() => eprintln!(
            "note: {} has no checkpoint yet: the run starts over from step 0",
            dir.display()
        ),
        None => bail!("{}: no checkpoint to resume from: {damaged}", dir.display()),
        Some(good) if !choice.damaged.is_empty() => {
            let step = |d: &Path| LoopState::read_in(d).map(|s| s.step).ok();
            let name = good.file_name().map_or_else(String::new, |n| n.to_string_lossy().into());
            let at = step(good).map_or_else(|| "?".into(), |s| s.to_string());
            let cost = match (step(&choice.damaged[0].dir), step(good)) {
                (Some(lost), Some(s)) if lost >= s => {
                    let n = lost - s;
                    format!(", {n} step{} earlier", if n == 1 { "" } else { "s" })
                }
                _ => String::new(),
            };
            eprintln!("note: {damaged}; resuming from {name}/ at step {at}{cost}");
        }
        Some(_) => {}
    }
    Ok(cfg)
}

/// Runs `qdarts search`.
pub fn run(args: &SearchArgs<'_>) -> Result<()> {
    // A resumed run continues with the config it was started with.
    let cfg = match args.resume {
        Some(dir) => {
            let mut cfg = resumed_config(dir, RunKind::Search, |p| ExperimentConfig::load(p, &[]))?;
            cfg.search.epochs += args.extend_epochs;
            cfg
        }
        None => ExperimentConfig::load(args.config, args.overrides)?,
    };
    let source = config_source(args.config, args.resume);
    let device = args.backend.device()?;
    if args.dashboard {
        return with_dashboard(cfg, device, args);
    }
    let bar = progress_bar();
    let mut on_progress = |p: &Progress| {
        show(&bar, p);
        ControlFlow::Continue(())
    };
    let resume = args.resume;
    let out = crate::run_loop(&mut on_progress, |p| run_search(&cfg, &device, resume, p))
        .with_context(|| format!("search `{}` ({}) failed", cfg.name, source.display()))?;
    bar.finish_and_clear();
    report(&out);
    Ok(())
}

/// Runs `qdarts dump-step`: a search step's inputs (and, asked for, qdarts's outputs) for the
/// PyTorch reference, for the supernet and hyperparameters of `spec`.
pub fn dump_step(
    spec: &qdarts_search::parity::StepSpec,
    out: &Path,
    with_outputs: bool,
    backend: Backend,
) -> Result<()> {
    use qdarts_search::parity::{compute, prepare, write_inputs};
    let device = backend.device()?.autodiff();
    let state = prepare(spec, &device)?;
    write_inputs(out, spec, &state).with_context(|| format!("writing {}", out.display()))?;
    if with_outputs {
        let outputs = compute(spec, state)?;
        let path = out.join("qdarts.safetensors");
        qdarts_engine::tensors::write(&path, &outputs, &Default::default())?;
    }
    println!("{}", out.display());
    Ok(())
}

/// Runs `qdarts parity`: every fixture folder's step on `backend`, against its expected
/// outputs; an error when a quantity is off its bound. `batched`: with the cells in waves
/// (LSQ fixtures are skipped, and none left is an error).
pub fn parity(
    fixtures: &[PathBuf],
    write_outputs: Option<&Path>,
    batched: bool,
    backend: Backend,
) -> Result<()> {
    use qdarts_search::parity::{batch_inputs, check_fixture, compute, read_inputs};
    let mut dirs = Vec::new();
    for f in fixtures {
        if f.join("spec.json").is_file() {
            dirs.push(f.clone());
            continue;
        }
        let entries =
            std::fs::read_dir(f).with_context(|| format!("reading fixtures {}", f.display()))?;
        let mut found: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.join("spec.json").is_file())
            .collect();
        if found.is_empty() {
            bail!("{}: no fixture folder (one with spec.json) there", f.display());
        }
        found.sort();
        dirs.extend(found);
    }
    let device = backend.device()?.autodiff();
    let mut failed = Vec::new();
    let mut checked = 0;
    let how = if batched { ", cells in waves" } else { "" };
    for dir in &dirs {
        let (spec, mut state) = read_inputs(dir, &device)
            .with_context(|| format!("reading fixture {}", dir.display()))?;
        if batched {
            if spec.preset == qdarts_ops::qconfig::Preset::Lsq {
                println!("{}: skipped (--batched-cells runs no LSQ fixture)", dir.display());
                continue;
            }
            state = batch_inputs(dir, &spec, state)
                .with_context(|| format!("batching the cells of fixture {}", dir.display()))?;
        }
        checked += 1;
        let ours = compute(&spec, state)?;
        if let Some(root) = write_outputs {
            let name = dir.file_name().map_or_else(|| "fixture".into(), |n| n.to_os_string());
            let out = root.join(name);
            std::fs::create_dir_all(&out)
                .with_context(|| format!("--write-outputs: creating {}", out.display()))?;
            let path = out.join("qdarts.safetensors");
            qdarts_engine::tensors::write(&path, &ours, &Default::default())
                .with_context(|| format!("--write-outputs: writing {}", path.display()))?;
        }
        let checks = check_fixture(dir, spec.preset, &ours)
            .with_context(|| format!("reading the expected outputs of {}", dir.display()))?;
        println!("{} on {}{how}", dir.display(), backend.label());
        println!("  {:<48} {:>11} {:>11} {:>9}", "quantity", "max |diff|", "relative", "bound");
        for c in checks {
            let flag = if c.ok { "" } else { "  FAILED" };
            println!(
                "  {:<48} {:>11.3e} {:>11.3e} {:>9.1e}{flag}",
                c.quantity, c.max_abs, c.rel, c.bound
            );
            if !c.ok {
                failed.push(format!("{}: {}", dir.display(), c.quantity));
            }
        }
    }
    if !failed.is_empty() {
        bail!("parity failed on {}{how}: {}", backend.label(), failed.join("; "));
    }
    if checked == 0 {
        bail!("parity: no fixture but LSQ ones among {} to run with --batched-cells", dirs.len());
    }
    println!("parity: {checked} fixture(s) within bounds on {}{how}", backend.label());
    Ok(())
}

/// The worker's status as the dashboard sees it.
#[derive(Debug)]
struct Shared {
    status: Mutex<(String, SearchPhase)>,
    stop: AtomicBool,
    /// A progress bar once the dashboard is closed and the search goes on.
    bar: Mutex<Option<ProgressBar>>,
}

impl SearchControl for Shared {
    fn status(&self) -> (String, SearchPhase) {
        self.status.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

impl Shared {
    fn set(&self, text: String, phase: SearchPhase) {
        *self.status.lock().unwrap_or_else(PoisonError::into_inner) = (text, phase);
    }
}

fn with_dashboard(
    cfg: ExperimentConfig,
    device: burn::tensor::Device,
    args: &SearchArgs<'_>,
) -> Result<()> {
    if !std::io::stdout().is_terminal() {
        bail!(
            "--dashboard needs a terminal on stdout; run without it and attach with `qdarts dashboard <run>`"
        );
    }
    // The data is read and checked before the run folder exists.
    let source = config_source(args.config, args.resume);
    let prepared = prepare_search(&cfg, &device)
        .with_context(|| format!("search `{}` ({}) failed", cfg.name, source.display()))?;
    let run = match args.resume {
        Some(dir) => RunDir::open(dir)?,
        None => RunDir::create(&cfg.record.results_dir, &cfg.name)?,
    };
    let dir: PathBuf = run.root().to_path_buf();
    let log = DebugLog::open(&run.debug_log())?;
    log.line(&format!(
        "search `{}` on {} ({})",
        cfg.name,
        args.backend.label(),
        if args.resume.is_some() { "resumed" } else { "new run" }
    ));
    let shared = Shared {
        status: Mutex::new(("starting".into(), SearchPhase::Running)),
        stop: AtomicBool::new(false),
        bar: Mutex::new(None),
    };
    let resume = args.resume.is_some();
    std::thread::scope(|scope| {
        let worker = std::thread::Builder::new()
            .name("search".into())
            .spawn_scoped(scope, || {
                let mut on_progress = |p: &Progress| {
                    shared.set("running".into(), SearchPhase::Running);
                    if p.step == p.steps {
                        log.line(&format!(
                            "epoch {}/{} trained: loss {:.4}, top1 {:.2}%",
                            p.epoch + 1,
                            p.epochs,
                            p.loss,
                            100.0 * p.top1
                        ));
                    }
                    if let Some(bar) = &*shared.bar.lock().unwrap_or_else(PoisonError::into_inner) {
                        show(bar, p);
                    }
                    if shared.stop.load(Ordering::Relaxed) {
                        log.line(&format!("stop requested: stopping after step {}", p.step));
                        ControlFlow::Break(())
                    } else {
                        ControlFlow::Continue(())
                    }
                };
                let out =
                    crate::run_loop(&mut on_progress, |p| run_prepared(prepared, run, resume, p));
                match &out {
                    Ok(o) if o.finished => {
                        log.line(&format!("finished: {}", o.genotype.to_darts_text()));
                        if let Some(alert) = o.genotype.collapse_alert() {
                            log.line(&format!("warning: {alert}"));
                        }
                        shared.set("finished".into(), SearchPhase::Done);
                    }
                    Ok(_) => {
                        log.line("stopped cleanly (checkpoint written)");
                        shared.set("stopped".into(), SearchPhase::Done);
                    }
                    Err(e) => {
                        log.line(&format!("failed: {e}"));
                        shared.set(format!("failed: {e}"), SearchPhase::Failed);
                    }
                }
                out
            })
            .context("starting the search thread")?;
        watch(&dir, args, &shared, &log, worker)
    })
}

/// Shows the dashboard on the running search, then waits for it and reports.
fn watch(
    dir: &Path,
    args: &SearchArgs<'_>,
    shared: &Shared,
    log: &DebugLog,
    worker: std::thread::ScopedJoinHandle<'_, Result<SearchOutcome, RunError>>,
) -> Result<()> {
    let exit = qdarts_tui::run(dir, &args.dash, Some(shared as &dyn SearchControl));
    match &exit {
        Ok(Exit::StopSearch) => {
            log.line("dashboard closed: stop the search");
            shared.stop.store(true, Ordering::Relaxed);
            eprintln!("stopping the search after its current step…");
        }
        Ok(Exit::KeepRunning) => {
            log.line("dashboard closed: the search runs on");
            eprintln!("dashboard closed; the search runs on ({})", dir.display());
            *shared.bar.lock().unwrap_or_else(PoisonError::into_inner) = Some(progress_bar());
        }
        Ok(Exit::Closed) => log.line("dashboard closed"),
        Err(e) => {
            // Without its dashboard the search stops cleanly rather than run on unseen.
            log.line(&format!("dashboard failed: {e}; stopping the search"));
            shared.stop.store(true, Ordering::Relaxed);
        }
    }
    let out = worker.join().map_err(|_| anyhow::anyhow!("the search thread panicked"))?;
    if let Some(bar) = &*shared.bar.lock().unwrap_or_else(PoisonError::into_inner) {
        bar.finish_and_clear();
    }
    exit.with_context(|| format!("dashboard on {}", dir.display()))?;
    let out = out.with_context(|| format!("search `{}` failed", dir.display()))?;
    report(&out);
    Ok(())
}
