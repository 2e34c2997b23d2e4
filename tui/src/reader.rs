//! `RunReader`: follows a run folder. Each poll reads what the search appended to its CSV files
//! and applies it to the `DashboardState`; a file that was rewritten (resume, rollback) makes
//! it rebuild the state from the start. Malformed rows are counted and skipped.

use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::csv::{Tail, split_line};
use crate::state::{DashboardState, Plan, Row, RunStatus, Source};

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
    dir: PathBuf,
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
        if !["config.toml", "metrics.csv", "lock"].iter().any(|f| dir.join(f).exists()) {
            return Err(not_a_run(
                "not a qdarts run folder (no config.toml or metrics.csv); runs live in results/",
            ));
        }
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let mut reader = RunReader {
            dir: dir.to_path_buf(),
            tails: Vec::new(),
            state: DashboardState::new(name),
        };
        reader.restart();
        Ok(reader)
    }

    fn restart(&mut self) {
        let name = std::mem::take(&mut self.state.run_name);
        self.state = DashboardState::new(name);
        self.tails = Source::ALL.iter().map(|(s, f)| (*s, Tail::new(self.dir.join(f)))).collect();
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
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
            batches.push((*source, tail.header().map(<[String]>::to_vec), polled.lines));
        }
        let mut changed = false;
        for (source, header, lines) in batches {
            changed |= !lines.is_empty();
            self.apply(source, header.as_deref(), &lines);
        }
        Ok(Some(changed))
    }

    fn apply(&mut self, source: Source, header: Option<&[String]>, lines: &[String]) {
        let Some(header) = header else { return };
        for line in lines {
            match split_line(line) {
                Some(fields) if fields.len() == header.len() => {
                    self.state.apply(source, Row::new(header, &fields));
                }
                _ => self.state.skipped_rows += 1,
            }
        }
    }

    /// The plan, the final genotype and the lock; returns whether they changed.
    fn poll_meta(&mut self) -> bool {
        let before =
            (self.state.plan, self.state.status.clone(), self.state.final_genotype.clone());
        if let Ok(text) = std::fs::read_to_string(self.dir.join("plan.json"))
            && let Ok(v) = serde_json::from_str::<serde_json::Value>(&text)
            && let (Some(e), Some(s)) = (v["epochs"].as_u64(), v["steps_per_epoch"].as_u64())
        {
            self.state.plan = Some(Plan { epochs: e as usize, steps_per_epoch: s as usize });
        } else if let Some(epochs) = self.configured_epochs()
            && let Some(first) = self.state.val.first()
        {
            // No plan.json (a run from an older qdarts): the first validation row ends epoch 0.
            self.state.plan = Some(Plan { epochs, steps_per_epoch: first.step });
        }
        self.state.final_genotype = std::fs::read_to_string(self.dir.join("genotype.txt"))
            .ok()
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty());
        self.state.status = self.lock_owner().map_or_else(
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
        let text = std::fs::read_to_string(self.dir.join("config.toml")).ok()?;
        let doc: toml::Table = toml::from_str(&text).ok()?;
        doc.get("search")?.get("epochs")?.as_integer().and_then(|e| usize::try_from(e).ok())
    }

    /// The process that holds the run's lock, if it is alive.
    fn lock_owner(&self) -> Option<u32> {
        let pid: u32 = std::fs::read_to_string(self.dir.join("lock")).ok()?.trim().parse().ok()?;
        let alive = if cfg!(target_os = "linux") {
            Path::new(&format!("/proc/{pid}")).exists()
        } else {
            true
        };
        alive.then_some(pid)
    }
}
