//! `debug.log` in the run folder: what a run with the dashboard would otherwise print, one
//! time-stamped line at a time (the dashboard owns the terminal).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::{Mutex, PoisonError};

use anyhow::{Context, Result};
use qdarts_record::utc_stamp;

/// An append-only log file.
#[derive(Debug)]
pub struct DebugLog {
    file: Mutex<File>,
}

impl DebugLog {
    /// Opens (appends to) `path`.
    pub fn open(path: &Path) -> Result<Self> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))?;
        Ok(DebugLog { file: Mutex::new(file) })
    }

    /// Appends one line. A log that cannot be written must not stop the search.
    pub fn line(&self, msg: &str) {
        let mut f = self.file.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = writeln!(f, "{} {msg}", utc_stamp());
        let _ = f.flush();
    }
}
