//! From one run to many, without Burn:
//!
//! - [`spec`]: a sweep file (`SWEEP.toml`: a base config, a grid and/or a list of variants,
//!   seeds) expanded into numbered trials;
//! - [`trials`]: the sweep folder (`results/<sweep>/trials.json`, the frozen base config) and
//!   where each trial's run folder lives, with the trial number taken from Slurm's or
//!   Kubernetes' environment;
//! - [`emit`]: a Slurm array script and a Kubernetes Indexed Job manifest that run the trials;
//! - [`compare`]: the run records of many runs side by side, grouped by config, with
//!   mean ± std over seeds and how often each edge was chosen; methods against a baseline,
//!   genotype by genotype, finished runs only, sides trained alike;
//! - [`stats`]: the tests `compare --baseline` reports (bootstrap intervals, Welch, exact
//!   Mann–Whitney, permutation and sign-flip tests, paired t, Wilcoxon, equivalence, Holm, one-
//!   and two-way ANOVA), held to SciPy and statsmodels.

pub mod compare;
pub mod emit;
pub mod local;
pub mod spec;
pub mod stats;
pub mod trials;

use std::path::PathBuf;

use thiserror::Error;

pub use spec::{SweepSpec, Trial, TrialKind};
pub use trials::{SweepDir, trial_index};

/// What can go wrong with a sweep or a comparison; every variant names the file.
#[derive(Debug, Error)]
pub enum SweepError {
    /// A file could not be read or written.
    #[error("{path}: {cause}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        cause: std::io::Error,
    },
    /// A sweep file or trials file is malformed.
    #[error("{path}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A trial's config is refused by the run's own validation.
    #[error("{path}: trial {trial} ({label}): {message}")]
    Trial {
        /// The sweep file.
        path: PathBuf,
        /// Trial number.
        trial: usize,
        /// Its label.
        label: String,
        /// The config error.
        message: String,
    },
    /// Anything else, already phrased.
    #[error("{0}")]
    Other(String),
}

pub(crate) fn io_err(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> SweepError + '_ {
    move |cause| SweepError::Io { path: path.to_path_buf(), cause }
}

pub(crate) fn invalid(path: &std::path::Path, message: impl Into<String>) -> SweepError {
    SweepError::Invalid { path: path.to_path_buf(), message: message.into() }
}
