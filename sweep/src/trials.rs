//! The sweep folder `<results_dir>/<sweep>/`:
//!
//! | file | what |
//! |---|---|
//! | `trials.json` | the numbered trials (written last: its presence means the folder is complete) |
//! | `base.toml` | the base config as it was when the sweep was made (trials apply to this copy) |
//! | `sweep.toml` | the sweep file as it was |
//! | `trial-000/`, … | each trial's run folder (a search or training run record) |
//! | `logs/trial-000.log`, … | each trial's stdout and stderr (local runs and Slurm) |
//!
//! A trial's run folder has a fixed name, so a trial started again (a requeued Slurm task, a
//! restarted pod, a second local run) finds it and resumes it from its last checkpoint.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::spec::{SweepSpec, Trial, TrialKind};
use crate::{SweepError, invalid, io_err};

const TRIALS: &str = "trials.json";
const BASE: &str = "base.toml";
const SPEC: &str = "sweep.toml";
const LOGS: &str = "logs";

/// `trials.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepFile {
    /// Sweep name.
    pub name: String,
    /// What the trials run.
    pub kind: TrialKind,
    /// The base config's path as the sweep file gave it (its text is in `base.toml`).
    pub config: String,
    /// The trials.
    pub trials: Vec<Trial>,
}

/// An existing sweep folder.
#[derive(Debug, Clone)]
pub struct SweepDir {
    root: PathBuf,
    /// Its `trials.json`.
    pub file: SweepFile,
}

fn write(path: &Path, text: &str) -> Result<(), SweepError> {
    qdarts_record::write_atomic(path, text.as_bytes()).map_err(|e| SweepError::Other(e.to_string()))
}

impl SweepDir {
    /// Makes the sweep folder of `spec` (with the base config's text), or reuses it when it
    /// already holds this very sweep; a folder holding a different sweep is an error.
    pub fn create(
        spec: &SweepSpec,
        spec_text: &str,
        base_text: &str,
    ) -> Result<SweepDir, SweepError> {
        let root = spec.results_dir.join(&spec.name);
        let file = SweepFile {
            name: spec.name.clone(),
            kind: spec.kind,
            config: spec.config.display().to_string(),
            trials: spec.trials.clone(),
        };
        let trials_path = root.join(TRIALS);
        if trials_path.exists() {
            let old = Self::open(&root)?;
            let old_base =
                std::fs::read_to_string(old.base_config()).map_err(io_err(&old.base_config()))?;
            if old.file != file || old_base != base_text {
                return Err(invalid(
                    &root,
                    format!(
                        "holds a different sweep (its trials.json or base.toml differ from {}): \
                         give the sweep another `name`, or remove the folder",
                        spec.path.display()
                    ),
                ));
            }
            return Ok(old);
        }
        if root.is_dir() && std::fs::read_dir(&root).map_err(io_err(&root))?.next().is_some() {
            return Err(invalid(
                &root,
                "exists and is not a sweep folder (no trials.json): give the sweep another `name`",
            ));
        }
        std::fs::create_dir_all(root.join(LOGS)).map_err(io_err(&root))?;
        write(&root.join(BASE), base_text)?;
        write(&root.join(SPEC), spec_text)?;
        let json = serde_json::to_string_pretty(&file)
            .map_err(|e| invalid(&trials_path, e.to_string()))?;
        write(&trials_path, &format!("{json}\n"))?;
        Ok(SweepDir { root, file })
    }

    /// Opens a sweep folder.
    pub fn open(root: &Path) -> Result<SweepDir, SweepError> {
        let path = root.join(TRIALS);
        if !path.exists() {
            return Err(invalid(
                root,
                "is not a sweep folder (no trials.json); make one with `qdarts sweep SWEEP.toml`",
            ));
        }
        let text = std::fs::read_to_string(&path).map_err(io_err(&path))?;
        let file: SweepFile =
            serde_json::from_str(&text).map_err(|e| invalid(&path, e.to_string()))?;
        for (i, t) in file.trials.iter().enumerate() {
            if t.trial != i {
                return Err(invalid(&path, format!("trial {i} is numbered {}", t.trial)));
            }
        }
        Ok(SweepDir { root: root.to_path_buf(), file })
    }

    /// The folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Number of trials.
    pub fn len(&self) -> usize {
        self.file.trials.len()
    }

    /// Whether the sweep has no trials (never, for a sweep made by [`SweepDir::create`]).
    pub fn is_empty(&self) -> bool {
        self.file.trials.is_empty()
    }

    /// `base.toml`.
    pub fn base_config(&self) -> PathBuf {
        self.root.join(BASE)
    }

    /// Trial `n`, or an error naming the range.
    pub fn trial(&self, n: usize) -> Result<&Trial, SweepError> {
        self.file.trials.get(n).ok_or_else(|| {
            invalid(
                &self.root,
                format!("has trials 0..{}; there is no trial {n}", self.len().saturating_sub(1)),
            )
        })
    }

    /// Digits of the trial numbers in folder and log names (at least 3).
    pub fn width(&self) -> usize {
        self.len().saturating_sub(1).to_string().len().max(3)
    }

    /// The run folder of trial `n`.
    pub fn trial_dir(&self, n: usize) -> PathBuf {
        self.root.join(format!("trial-{n:0w$}", w = self.width()))
    }

    /// The log file of trial `n`.
    pub fn log(&self, n: usize) -> PathBuf {
        self.logs().join(format!("trial-{n:0w$}.log", w = self.width()))
    }

    /// The logs folder.
    pub fn logs(&self) -> PathBuf {
        self.root.join(LOGS)
    }

    /// The run name of trial `n` (the `name` key of its config).
    pub fn run_name(&self, n: usize) -> String {
        format!("{}-trial-{n:0w$}", self.file.name, w = self.width())
    }

    /// The overrides of trial `n` plus the run name and results folder the sweep gives it.
    pub fn trial_overrides(&self, n: usize) -> Result<Vec<String>, SweepError> {
        let mut set = self.trial(n)?.set.clone();
        set.push(format!("name={}", toml::Value::String(self.run_name(n))));
        set.push(format!(
            "record.results_dir={}",
            toml::Value::String(self.root.display().to_string())
        ));
        Ok(set)
    }
}

/// The trial to run: `--trial`, else Slurm's `SLURM_ARRAY_TASK_ID`, else Kubernetes'
/// `JOB_COMPLETION_INDEX` (read through `env`).
pub fn trial_index(
    arg: Option<usize>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<usize, SweepError> {
    if let Some(n) = arg {
        return Ok(n);
    }
    for var in ["SLURM_ARRAY_TASK_ID", "JOB_COMPLETION_INDEX"] {
        if let Some(v) = env(var) {
            return v
                .trim()
                .parse()
                .map_err(|_| SweepError::Other(format!("{var}={v:?} is not a trial number")));
        }
    }
    Err(SweepError::Other(
        "which trial? give --trial N (or run under a Slurm array, SLURM_ARRAY_TASK_ID, or a \
         Kubernetes Indexed Job, JOB_COMPLETION_INDEX)"
            .into(),
    ))
}
