//! qdarts-record: the run record (`results/<run>/`) as one schema. The file names
//! ([`RunLayout`]), the typed rows of every table with their headers ([`rows`]), the writers
//! (append-only tables, atomic files, checkpoint swaps, a lock against a second writer:
//! [`RunDir`]), the cut back to a checkpoint on resume, and the readers (whole tables, or a
//! [`Tail`] that follows a live run). The search and training loops write through it and the
//! dashboard reads through it; nothing else spells a run file's name.
//!
//! No Burn here: a run folder can be read anywhere serde and csv build.

mod checksum;
mod layout;
mod quant_error;
pub mod rows;
mod run_dir;
pub mod scratch;
mod table;
mod tail;

use std::path::{Path, PathBuf};

use thiserror::Error;

pub use checksum::{
    CHECKSUMS, CheckpointChoice, Damaged, Verified, choose_checkpoint, verify_checkpoint,
    write_checksums,
};
pub use layout::{CheckpointPart, RunLayout};
pub use quant_error::{QuantError, QuantErrorRow, TensorRole};
pub use rows::{
    AlphaRow, BitRow, BitSite, CellType, ChangeRow, CostRow, Decision, GenotypeRow, MetricsRow,
    NanAction, NanEventRow, NanSite, Phase, Plan, SelectionRow, Table, Verdict,
};
pub use run_dir::{RunDir, lock_owner, utc_stamp, write_atomic};
pub use table::{
    TableWriter, encode_row, header_line, parse_line, read_table, split_line, truncate_table,
    truncate_to,
};
pub use tail::{Polled, Tail};

/// A run folder or file that cannot be used.
#[derive(Debug, Error)]
pub enum RecordError {
    /// File-system error on a path.
    #[error("{path}: {cause}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        cause: std::io::Error,
    },
    /// Another live process holds the run.
    #[error("{path} is held by {}, which is still running: wait for it or stop it", holder(*pid))]
    Locked {
        /// The lock file.
        path: PathBuf,
        /// Its owner.
        pid: u32,
    },
    /// The folder is not a run.
    #[error("{0}")]
    NotARun(String),
    /// A row or file could not be written in its format.
    #[error("{path}: cannot encode: {message}")]
    Encode {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// A file does not hold what its format says.
    #[error("{path}: {message}")]
    Decode {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

fn holder(pid: u32) -> String {
    if pid == 0 { "another process".into() } else { format!("process {pid}") }
}

pub(crate) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> RecordError + '_ {
    move |cause| RecordError::Io { path: path.into(), cause }
}

/// Writes the run's plan (`plan.json`).
pub fn write_plan(run: &RunLayout, plan: &Plan) -> Result<(), RecordError> {
    let path = run.plan();
    let json = serde_json::to_vec(plan)
        .map_err(|e| RecordError::Encode { path: path.clone(), message: e.to_string() })?;
    write_atomic(&path, &json)
}

/// Reads the run's plan; `None` when it is missing or does not parse (a run that is starting,
/// or one from before plans were written).
pub fn read_plan(run: &RunLayout) -> Option<Plan> {
    serde_json::from_slice(&std::fs::read(run.plan()).ok()?).ok()
}

/// Epochs of a run that have their validation row, and the epochs its plan asks for (`None`
/// without a plan): a run is finished when the first reaches the second. A `metrics.csv`
/// that cannot be read is an error, not "no epochs" (a missing one is none yet).
pub fn epochs_done(run: &RunLayout) -> Result<(usize, Option<usize>), RecordError> {
    let rows: Vec<MetricsRow> = read_table(&run.table::<MetricsRow>())?;
    let done = rows.iter().filter(|r| r.phase == Phase::Val).count();
    Ok((done, read_plan(run).map(|p| p.epochs)))
}
