//! A sweep's trials run on this machine, N at a time, each a child process writing its log,
//! and the one protocol that keeps a trial's folder to one process:
//!
//! - a trial's folder is held by its run's lock ([`qdarts_record::RunDir`]); the runner does
//!   not start a trial whose folder a live process still holds (a trial of an earlier, killed
//!   sweep), and starts it once that process lets go;
//! - a trial started by the runner carries the runner's process id ([`SWEEP_PARENT`]); when the
//!   runner is gone ([`orphaned`]) the trial stops at its next step, keeping a checkpoint, so
//!   that the sweep started again resumes it rather than racing it;
//! - such a trial, finding its folder still held, waits for it ([`open_trial_dir`]) rather
//!   than failing.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use qdarts_record::{RecordError, RunDir, RunLayout, epochs_done, lock_owner};

use crate::{SweepDir, SweepError};

/// Names, in a trial's environment, the runner process that started it.
pub const SWEEP_PARENT: &str = "QDARTS_SWEEP_PARENT";

/// How long a trial started by the runner waits for its folder's lock.
const PATIENCE: Duration = Duration::from_secs(120);

/// How often the runner looks at its children and at held folders.
const POLL: Duration = Duration::from_millis(200);

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> SweepError + '_ {
    move |cause| SweepError::Io { path: path.to_path_buf(), cause }
}

/// Whether the run in `dir` has run all its epochs; an unreadable record is an error.
pub fn finished(dir: &Path) -> Result<bool, SweepError> {
    let done = epochs_done(&RunLayout::new(dir)).map_err(|e| {
        SweepError::Other(format!("cannot tell whether {} has finished: {e}", dir.display()))
    })?;
    Ok(matches!(done, (d, Some(p)) if d >= p))
}

/// A trial's state in words: not started, started (with its epochs), finished, unreadable.
pub fn trial_status(sweep: &SweepDir, n: usize) -> String {
    let dir = sweep.trial_dir(n);
    if !dir.exists() {
        return "not started".into();
    }
    match epochs_done(&RunLayout::new(&dir)) {
        Ok((d, Some(p))) if d >= p => "finished".into(),
        Ok((d, Some(p))) => format!("started ({d}/{p} epochs)"),
        Ok(_) => "started".into(),
        Err(e) => format!("unreadable: {e}"),
    }
}

/// The runner that started this process, when a runner did ([`SWEEP_PARENT`]).
pub fn sweep_parent() -> Option<u32> {
    std::env::var(SWEEP_PARENT).ok().and_then(|v| v.parse().ok())
}

/// Whether the runner that started this trial (`parent`) is gone: the trial was re-parented.
pub fn orphaned(parent: Option<u32>) -> bool {
    #[cfg(unix)]
    {
        parent.is_some_and(|p| std::os::unix::process::parent_id() != p)
    }
    #[cfg(not(unix))]
    {
        let _ = parent;
        false
    }
}

/// Opens (creating) a trial's folder. Started by the runner, a trial whose folder is still
/// held by a trial of an earlier, killed sweep waits for it (that one stops at its next step)
/// for up to two minutes rather than failing.
pub fn open_trial_dir(dir: &Path) -> Result<RunDir, SweepError> {
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    let patient = sweep_parent().is_some();
    let start = Instant::now();
    loop {
        match RunDir::open(dir) {
            Err(RecordError::Locked { .. }) if patient && start.elapsed() < PATIENCE => {
                std::thread::sleep(POLL);
            }
            other => return other.map_err(|e| SweepError::Other(e.to_string())),
        }
    }
}

/// Runs the sweep's unfinished trials as child processes, `jobs` at a time, each with its
/// share of the cores and its log in the sweep's `logs/`. `command(n)` is the command line of
/// trial `n`; the runner adds its environment (the threads, [`SWEEP_PARENT`]) and output. `say` hears what
/// happens, line by line. An error names the trials that failed.
pub fn run_local(
    sweep: &SweepDir,
    jobs: usize,
    command: &mut dyn FnMut(usize) -> Command,
    say: &mut dyn FnMut(String),
) -> Result<(), SweepError> {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let threads = (cores / jobs.max(1)).max(1);
    std::fs::create_dir_all(sweep.logs()).map_err(io_err(&sweep.logs()))?;
    let mut queue = Vec::new();
    for n in (0..sweep.len()).rev() {
        if !finished(&sweep.trial_dir(n))? {
            queue.push(n);
        }
    }
    if queue.len() < sweep.len() {
        say(format!(
            "{} of {} trials have finished already",
            sweep.len() - queue.len(),
            sweep.len()
        ));
    }
    say(format!("running {} trials, {jobs} at a time, {threads} threads each", queue.len()));
    let mut running: Vec<(usize, Child)> = Vec::new();
    let mut failed: Vec<usize> = Vec::new();
    let mut told: Vec<usize> = Vec::new();
    while !queue.is_empty() || !running.is_empty() {
        let mut held = Vec::new();
        while running.len() < jobs {
            let Some(n) = queue.pop() else { break };
            if let Some(pid) = lock_owner(&RunLayout::new(sweep.trial_dir(n))) {
                if !told.contains(&n) {
                    say(format!(
                        "trial {n}: waiting for process {pid}, which still holds its folder"
                    ));
                    told.push(n);
                }
                held.push(n);
                continue;
            }
            running.push((n, start_trial(sweep, n, command(n), threads)?));
            say(format!("trial {n} ({}) started", sweep.file.trials[n].label));
        }
        queue.extend(held.into_iter().rev());
        std::thread::sleep(POLL);
        let mut i = 0;
        while i < running.len() {
            let (n, child) = &mut running[i];
            let n = *n;
            let waited = child.try_wait().map_err(io_err(&sweep.log(n)))?;
            let Some(status) = waited else {
                i += 1;
                continue;
            };
            if status.success() {
                say(format!("trial {n}: {}", trial_status(sweep, n)));
            } else {
                say(format!("trial {n}: failed ({status}); see {}", sweep.log(n).display()));
                failed.push(n);
            }
            running.swap_remove(i);
        }
    }
    if !failed.is_empty() {
        failed.sort_unstable();
        return Err(SweepError::Other(format!(
            "{} of {} trials failed ({failed:?}); their logs are in {}",
            failed.len(),
            sweep.len(),
            sweep.logs().display()
        )));
    }
    Ok(())
}

/// Starts trial `n` by `cmd`, its output appended to its log.
fn start_trial(
    sweep: &SweepDir,
    n: usize,
    mut cmd: Command,
    threads: usize,
) -> Result<Child, SweepError> {
    let log_path = sweep.log(n);
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(io_err(&log_path))?;
    let err = log.try_clone().map_err(io_err(&log_path))?;
    cmd.env("RAYON_NUM_THREADS", threads.to_string())
        .env(SWEEP_PARENT, std::process::id().to_string())
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err)
        .spawn()
        .map_err(|e| SweepError::Other(format!("starting trial {n}: {e}")))
}
