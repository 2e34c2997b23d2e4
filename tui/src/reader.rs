//! `RunReader`: follows a run folder. Each poll reads what the search appended to its CSV files
//! and applies it to the `DashboardState`; a file that was rewritten (resume, rollback) makes
//! it rebuild the state from the start. Malformed rows are counted and skipped.

use std::path::{Path, PathBuf};

use thiserror::Error;

use qdarts_record::{RunLayout, Tail, lock_owner, read_plan};

use crate::state::{DashboardState, Plan, RunStatus, Source};

/// A run folder that cannot be shown.
#[derive(Debug, Error)]
pub enum DashboardError {
    /// No such folder, or not a run.
    #[error("{path}: {message}")]
    NotARun {
        /// The folder.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A file of the run could not be read.
    #[error("{path}: {cause}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        cause: std::io::Error,
    },
    /// The terminal could not be set up or drawn on.
    #[error("terminal: {0}")]
    Terminal(std::io::Error),
}

/// Follows one run folder.
#[derive(Debug)]
pub struct RunReader {
    run: RunLayout,
    tails: Vec<(Source, Tail)>,
    state: DashboardState,
}

impl RunReader {
    /// Opens a run folder: it must exist and hold a `config.toml`, a `metrics.csv` or the lock of
    /// a search that is starting.
    pub fn open(dir: &Path) -> Result<Self, DashboardError> {
        let not_a_run = |message: &str| DashboardError::NotARun {
            path: dir.to_path_buf(),
            message: message.to_string(),
        };
        if !dir.exists() {
            return Err(not_a_run("no such run folder"));
        }
        if !dir.is_dir() {
            return Err(not_a_run("not a folder; give a run folder such as results/default-…"));
        }
        let run = RunLayout::new(dir);
        if !run.looks_like_run() {
            return Err(not_a_run(
                "not a qdarts run folder (no config.toml or metrics.csv); runs live in results/",
            ));
        }
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let mut reader = RunReader { run, tails: Vec::new(), state: DashboardState::new(name) };
        reader.restart();
        Ok(reader)
    }

    fn restart(&mut self) {
        let name = std::mem::take(&mut self.state.run_name);
        self.state = DashboardState::new(name);
        self.tails = Source::ALL.iter().map(|&s| (s, Tail::new(s.path(&self.run)))).collect();
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        self.run.root()
    }

    /// The state as of the last poll.
    pub fn state(&self) -> &DashboardState {
        &self.state
    }

    /// Reads what is new. Returns whether anything changed.
    pub fn poll(&mut self) -> Result<bool, DashboardError> {
        let meta = self.poll_meta();
        match self.poll_rows()? {
            Some(rows) => Ok(meta || rows),
            None => {
                // A rewritten file: the rows already applied may be gone. Start over.
                self.restart();
                self.poll_meta();
                self.poll_rows()?;
                Ok(true)
            }
        }
    }

    /// Applies the new rows of every file; `None` when a file was rewritten.
    fn poll_rows(&mut self) -> Result<Option<bool>, DashboardError> {
        let mut batches = Vec::with_capacity(self.tails.len());
        for (source, tail) in &mut self.tails {
            let polled = tail
                .poll()
                .map_err(|cause| DashboardError::Io { path: tail.path().to_path_buf(), cause })?;
            if polled.reset {
                return Ok(None);
            }
            batches.push((*source, tail.header().cloned(), polled.lines));
        }
        let mut changed = false;
        for (source, header, lines) in batches {
            changed |= !lines.is_empty();
            self.apply(source, header.as_ref(), &lines);
        }
        Ok(Some(changed))
    }

    fn apply(&mut self, source: Source, header: Option<&csv::StringRecord>, lines: &[String]) {
        let Some(header) = header else { return };
        for line in lines {
            self.state.apply(source, header, line);
        }
    }

    /// The plan, the final genotype and the lock; returns whether they changed.
    fn poll_meta(&mut self) -> bool {
        let before =
            (self.state.plan, self.state.status.clone(), self.state.final_genotype.clone());
        if let Some(plan) = read_plan(&self.run) {
            self.state.plan =
                Some(Plan { epochs: plan.epochs, steps_per_epoch: plan.steps_per_epoch });
        } else if let Some(epochs) = self.configured_epochs()
            && let Some(first) = self.state.val.first()
        {
            // No plan.json (a run from an older qdarts): the first validation row ends epoch 0.
            self.state.plan = Some(Plan { epochs, steps_per_epoch: first.step });
        }
        self.state.final_genotype = std::fs::read_to_string(self.run.genotype_text())
            .ok()
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty());
        self.state.status = lock_owner(&self.run).map_or_else(
            || {
                if self.state.final_genotype.is_some() {
                    RunStatus::Finished
                } else {
                    RunStatus::Stopped
                }
            },
            RunStatus::Running,
        );
        before != (self.state.plan, self.state.status.clone(), self.state.final_genotype.clone())
    }

    /// `search.epochs` of the run's `config.toml`.
    fn configured_epochs(&self) -> Option<usize> {
        let text = std::fs::read_to_string(self.run.config()).ok()?;
        let doc: toml::Table = toml::from_str(&text).ok()?;
        doc.get("search")?.get("epochs")?.as_integer().and_then(|e| usize::try_from(e).ok())
    }
}
