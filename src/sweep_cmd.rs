//! `qdarts sweep`: a sweep file expanded into numbered trials in `results/<sweep>/`, the
//! Slurm and Kubernetes files that run them, and a local runner (N trials at a time); and
//! `qdarts search|train --sweep DIR [--trial N]`, which runs one trial and resumes it when its
//! folder already holds a checkpoint.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use qdarts_engine::Progress;
use qdarts_engine::config::Experiment;
use qdarts_record::write_atomic;
use qdarts_search::config::ExperimentConfig;
use qdarts_search::{prepare_search, run_prepared};
use qdarts_sweep::emit::{K8sOptions, SlurmOptions, TaskCommand, k8s_manifest, slurm_script};
use qdarts_sweep::local::{self, finished, trial_status};
use qdarts_sweep::{SweepDir, SweepSpec, TrialKind, trial_index};
use qdarts_train::{TrainConfig, prepare_train, resolve_genotype, run_train_prepared};

use crate::backend::{Backend, BackendKind};
use crate::search_cmd::{progress_bar, show};

/// Scheduler files `qdarts sweep --emit` writes into the sweep folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Emit {
    /// `sweep.sbatch`: a Slurm array script, one task per trial.
    Slurm,
    /// `job.yaml`: a Kubernetes Indexed Job, one completion index per trial.
    K8s,
}

/// `qdarts sweep` options.
#[derive(Debug, Clone, clap::Args)]
pub struct SweepArgs {
    /// A sweep file (SWEEP.toml), or a sweep folder made from one.
    pub path: PathBuf,
    /// Write a scheduler file into the sweep folder (repeatable).
    #[arg(long, value_enum)]
    pub emit: Vec<Emit>,
    /// Run the trials on this machine, `--jobs` at a time (finished trials are skipped,
    /// interrupted ones resumed).
    #[arg(long)]
    pub local: bool,
    /// Trials at once with --local (each gets an equal share of the cores).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub jobs: u32,
    /// The qdarts binary the scheduler runs [default: this one].
    #[arg(long, value_name = "PATH")]
    pub exe: Option<PathBuf>,
    /// CPUs per trial (Slurm --cpus-per-task, Kubernetes cpu request; the trial's threads).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub cpus: u32,
    /// GPUs per trial [default: 0 on --backend flex, else 1].
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=64))]
    pub gpus: Option<u32>,
    /// Slurm: time limit per task.
    #[arg(long, default_value = "04:00:00")]
    pub time: String,
    /// Slurm: partition.
    #[arg(long)]
    pub partition: Option<String>,
    /// Slurm: memory per task, e.g. 16G.
    #[arg(long)]
    pub mem: Option<String>,
    /// Slurm: at most this many tasks at once (0: no limit).
    #[arg(long, default_value_t = 0)]
    pub max_running: u32,
    /// Kubernetes: image with qdarts on PATH and the working tree.
    #[arg(long, default_value = "qdarts:latest")]
    pub image: String,
    /// Kubernetes: working directory in the image.
    #[arg(long, default_value = "/work")]
    pub workdir: String,
    /// Kubernetes: persistent volume claim mounted on the results folder.
    #[arg(long, default_value = "qdarts-results")]
    pub claim: String,
    /// Kubernetes: memory request per pod.
    #[arg(long, default_value = "8Gi")]
    pub memory: String,
    /// Kubernetes: pods at once [default: all trials].
    #[arg(long)]
    pub parallelism: Option<u32>,
}

/// Checks one trial's config the way the run will read it; a training trial's genotype too.
fn check_trial(kind: TrialKind, base: &Path, text: &str, set: &[String]) -> Result<()> {
    match kind {
        TrialKind::Search => {
            ExperimentConfig::parse(text, base, set)?;
        }
        TrialKind::Train => {
            let cfg = TrainConfig::parse(text, base, set)?;
            resolve_genotype(&cfg.genotype)
                .with_context(|| format!("genotype `{}`", cfg.genotype))?;
        }
    }
    Ok(())
}

/// Makes (or reopens) the sweep folder of a sweep file, every trial checked first.
fn make_sweep(path: &Path) -> Result<SweepDir> {
    let spec = SweepSpec::load(path)?;
    let spec_text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let base_text = std::fs::read_to_string(&spec.config)
        .with_context(|| format!("{}: `config` = {}", path.display(), spec.config.display()))?;
    for t in &spec.trials {
        let mut set = t.set.clone();
        set.push("name=\"trial\"".into());
        check_trial(spec.kind, &spec.config, &base_text, &set)
            .with_context(|| format!("{}: trial {} ({})", path.display(), t.trial, t.label))?;
    }
    Ok(SweepDir::create(&spec, &spec_text, &base_text)?)
}

/// Runs `qdarts sweep`.
pub fn sweep(args: &SweepArgs, backend: Backend) -> Result<()> {
    let sweep =
        if args.path.is_dir() { SweepDir::open(&args.path)? } else { make_sweep(&args.path)? };
    let kind = sweep.file.kind.command();
    println!(
        "sweep `{}`: {} {kind} trials in {}",
        sweep.file.name,
        sweep.len(),
        sweep.root().display()
    );
    for (n, t) in sweep.file.trials.iter().enumerate() {
        println!(
            "  {:>w$}  {:<40}  {}  {}",
            n,
            t.label,
            sweep.trial_dir(n).display(),
            trial_status(&sweep, n),
            w = sweep.width()
        );
    }
    let workdir = std::env::current_dir().context("reading the current directory")?;
    let gpus = args.gpus.unwrap_or(u32::from(backend.kind() != BackendKind::Flex)) as usize;
    for emit in &args.emit {
        let (file, text) = match emit {
            Emit::Slurm => {
                let exe = match &args.exe {
                    Some(p) => p.clone(),
                    None => std::env::current_exe().context("finding this binary")?,
                };
                let cmd =
                    TaskCommand { exe, backend: backend.name().into(), workdir: workdir.clone() };
                let opt = SlurmOptions {
                    partition: args.partition.clone(),
                    time: args.time.clone(),
                    cpus: args.cpus as usize,
                    gpus,
                    mem: args.mem.clone(),
                    max_running: args.max_running as usize,
                };
                ("sweep.sbatch", slurm_script(&sweep, &cmd, &opt)?)
            }
            Emit::K8s => {
                let opt = K8sOptions {
                    image: args.image.clone(),
                    workdir: args.workdir.clone(),
                    claim: args.claim.clone(),
                    parallelism: args.parallelism.map_or(sweep.len(), |p| p as usize),
                    cpus: args.cpus as usize,
                    gpus,
                    memory: args.memory.clone(),
                };
                // Inside the image the sweep is found from the working directory.
                let rel = sweep.root().strip_prefix(&workdir).unwrap_or(sweep.root());
                ("job.yaml", k8s_manifest(&sweep, rel, backend.name(), &opt)?)
            }
        };
        let path = sweep.root().join(file);
        write_atomic(&path, text.as_bytes())?;
        println!("wrote {}", path.display());
    }
    if args.local {
        run_local(&sweep, args.jobs as usize, backend)?;
    } else if args.emit.is_empty() {
        eprintln!(
            "run a trial with `qdarts {kind} --sweep {} --trial N`, all of them with --local, or \
             write scheduler files with --emit slurm / --emit k8s",
            sweep.root().display()
        );
    }
    Ok(())
}

/// Runs the trials as child processes of this binary, `jobs` at a time
/// ([`qdarts_sweep::local::run_local`]).
fn run_local(sweep: &SweepDir, jobs: usize, backend: Backend) -> Result<()> {
    let exe = std::env::current_exe().context("finding this binary")?;
    let kind = sweep.file.kind.command();
    let mut command = |n: usize| {
        let mut cmd = Command::new(&exe);
        cmd.args(["--backend", backend.name()])
            .args(backend.device_args())
            .args([kind, "--sweep"])
            .arg(sweep.root())
            .args(["--trial", &n.to_string()]);
        cmd
    };
    local::run_local(sweep, jobs, &mut command, &mut |line| eprintln!("{line}"))?;
    eprintln!(
        "all {} trials finished; compare them with `qdarts compare {}`",
        sweep.len(),
        sweep.root().display()
    );
    Ok(())
}

/// Runs one trial of a sweep (`qdarts search|train --sweep DIR [--trial N]`).
pub fn run_trial(
    dir: &Path,
    trial: Option<usize>,
    want: TrialKind,
    backend: Backend,
) -> Result<()> {
    let sweep = SweepDir::open(dir)?;
    if sweep.file.kind != want {
        bail!(
            "{} is a sweep of {} trials: run them with `qdarts {} --sweep {}`",
            dir.display(),
            sweep.file.kind.command(),
            sweep.file.kind.command(),
            dir.display()
        );
    }
    let n = trial_index(trial, |v| std::env::var(v).ok())?;
    let label = sweep.trial(n)?.label.clone();
    let set = sweep.trial_overrides(n)?;
    let run_dir = sweep.trial_dir(n);
    if finished(&run_dir)? {
        eprintln!("trial {n} ({label}) has finished already: {}", run_dir.display());
        println!("{}", run_dir.display());
        return Ok(());
    }
    let base = sweep.base_config();
    let device = backend.device()?;
    let bar = progress_bar();
    let parent = local::sweep_parent();
    let mut on_progress = |p: &Progress| {
        show(&bar, p);
        if local::orphaned(parent) {
            eprintln!(
                "trial {n}: its sweep is gone; stopping after this step (a checkpoint is kept)"
            );
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    };
    let existed = run_dir.exists();
    eprintln!(
        "trial {n} ({label}): {} {}",
        if existed { "resuming" } else { "starting" },
        run_dir.display()
    );
    let context = || format!("{}: trial {n} ({label})", dir.display());
    match want {
        TrialKind::Search => {
            let cfg = ExperimentConfig::load(&base, &set).with_context(context)?;
            let prepared = prepare_search(&cfg, &device).with_context(context)?;
            let run = local::open_trial_dir(&run_dir)?;
            let out =
                crate::run_loop(&mut on_progress, |p| run_prepared(prepared, run, existed, p))
                    .with_context(context)?;
            bar.finish_and_clear();
            if out.finished {
                println!("{}", out.genotype.to_darts_text());
                crate::search_cmd::warn_collapse(&out.genotype);
            }
        }
        TrialKind::Train => {
            let cfg = TrainConfig::load(&base, &set).with_context(context)?;
            let genotype = resolve_genotype(&cfg.genotype).with_context(context)?;
            let prepared = prepare_train(&cfg, &genotype, &device).with_context(context)?;
            let run = local::open_trial_dir(&run_dir)?;
            crate::run_loop(&mut on_progress, |p| run_train_prepared(prepared, &run, existed, p))
                .with_context(context)?;
            bar.finish_and_clear();
        }
    }
    eprintln!("trial {n}: {}", trial_status(&sweep, n));
    println!("{}", run_dir.display());
    Ok(())
}
