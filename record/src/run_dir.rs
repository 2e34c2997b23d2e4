//! The run folder held by a writer: a lock against a second writer, files replaced
//! atomically (temp + fsync + rename), tables appended a row at a time, and checkpoints
//! swapped in whole.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::ops::Deref;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::checksum::{verify_checkpoint, write_checksums};
use crate::layout::RunLayout;
use crate::rows::Table;
use crate::table::{TableWriter, truncate_table};
use crate::{RecordError, io_err};

/// UTC `YYYYmmdd-HHMMSS` from the system clock (days-to-civil, Howard Hinnant).
pub fn utc_stamp() -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}{m:02}{d:02}-{:02}{:02}{:02}", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// Whether a process id is alive (Linux `/proc`; elsewhere assume it is).
pub(crate) fn alive(pid: u32) -> bool {
    if cfg!(target_os = "linux") { Path::new(&format!("/proc/{pid}")).exists() } else { true }
}

/// The process that holds a run folder's lock, if any (for display: it reads the pid the
/// holder wrote, and checks that the process lives, without touching the lock itself).
pub fn lock_owner(run: &RunLayout) -> Option<u32> {
    let pid: u32 = fs::read_to_string(run.lock()).ok()?.trim().parse().ok()?;
    alive(pid).then_some(pid)
}

/// Writes `path` atomically (temp file in the same folder, fsync, rename). Each write has its
/// own temp file (process and a per-process count in its name), so two processes writing the
/// same file at once (`qdarts freeze` twice) each rename a whole file: the last one wins,
/// and no reader ever sees a mix. A failed write removes its temp file.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), RecordError> {
    static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = path.file_name().map_or_else(String::new, |s| s.to_string_lossy().into_owned());
    let tmp = path.with_file_name(format!(".{name}.{}.{n}.tmp", std::process::id()));
    let written = File::create(&tmp).and_then(|mut f| {
        f.write_all(bytes)?;
        f.sync_all()
    });
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(RecordError::Io { path: tmp, cause: e });
    }
    fs::rename(&tmp, path).map_err(|e| {
        let _ = fs::remove_file(&tmp);
        RecordError::Io { path: path.into(), cause: e }
    })
}

/// A run folder held by this process: an exclusive OS lock (`flock`) on its `lock` file,
/// released when the process ends, however it ends.
#[derive(Debug)]
pub struct RunDir {
    layout: RunLayout,
    /// The locked file; closing it releases the lock.
    lock: File,
}

impl Deref for RunDir {
    type Target = RunLayout;

    fn deref(&self) -> &RunLayout {
        &self.layout
    }
}

impl RunDir {
    /// Creates `<parent>/<name>-<UTC time>` (with a numeric suffix if taken) and takes its lock.
    pub fn create(parent: &Path, name: &str) -> Result<Self, RecordError> {
        if parent.exists() && !parent.is_dir() {
            return Err(RecordError::NotARun(format!(
                "{}: the results folder (record.results_dir) is a file, not a folder",
                parent.display()
            )));
        }
        fs::create_dir_all(parent).map_err(io_err(parent))?;
        let stamp = utc_stamp();
        for n in 0..1000 {
            let dir = if n == 0 {
                parent.join(format!("{name}-{stamp}"))
            } else {
                parent.join(format!("{name}-{stamp}-{n}"))
            };
            match fs::create_dir(&dir) {
                Ok(()) => return Self::open(&dir),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(RecordError::Io { path: dir, cause: e }),
            }
        }
        Err(RecordError::NotARun(format!("{}: no free run folder name", parent.display())))
    }

    /// Takes the lock of an existing run folder: an exclusive OS advisory lock on its `lock`
    /// file, taken atomically (two processes can never both hold it) and released by the OS
    /// when the holder exits, killed or not. A live holder is an error that names its pid.
    pub fn open(dir: &Path) -> Result<Self, RecordError> {
        if !dir.is_dir() {
            return Err(RecordError::NotARun(format!("{} is not a folder", dir.display())));
        }
        let layout = RunLayout::new(dir);
        let path = layout.lock();
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io_err(&path))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let pid = fs::read_to_string(&path)
                    .ok()
                    .and_then(|t| t.split_whitespace().next().and_then(|p| p.parse().ok()))
                    .unwrap_or(0);
                return Err(RecordError::Locked { path, pid });
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(RecordError::Io { path, cause: e });
            }
        }
        // Held: say who holds it, for `qdarts dashboard` and the error above.
        file.set_len(0).map_err(io_err(&path))?;
        writeln!(file, "{}", std::process::id()).map_err(io_err(&path))?;
        file.sync_all().map_err(io_err(&path))?;
        Ok(RunDir { layout, lock: file })
    }

    /// The paths of the folder.
    pub fn layout(&self) -> &RunLayout {
        &self.layout
    }

    /// Opens (or creates, with its header) one of the run's tables for appending.
    pub fn writer<T: Table>(&self) -> Result<TableWriter<T>, RecordError> {
        TableWriter::open(&self.table::<T>())
    }

    /// Cuts a table back to what a checkpoint at `epoch` (and global `step`) had seen.
    pub fn truncate<T: Table>(&self, epoch: usize, step: usize) -> Result<(), RecordError> {
        truncate_table::<T>(&self.table::<T>(), epoch, step)
    }

    /// Deletes a table (a run restarted from step 0).
    pub fn remove<T: Table>(&self) -> Result<(), RecordError> {
        let path = self.table::<T>();
        match fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(RecordError::Io { path, cause: e })
            }
            _ => Ok(()),
        }
    }

    /// Writes a checkpoint folder with `fill` into `checkpoint.tmp`, adds the checksums of its
    /// files as read back, then swaps it in for `checkpoint`. The checkpoint it replaces becomes
    /// `checkpoint.prev` if it verifies (else it is dropped and `checkpoint.prev` stays), so
    /// that one damaged checkpoint never leaves a run without a good one. A fill or a read-back
    /// that fails leaves both as they were.
    pub fn replace_checkpoint<E: From<RecordError>>(
        &self,
        fill: impl FnOnce(&Path) -> Result<(), E>,
    ) -> Result<(), E> {
        let tmp = self.checkpoint_new();
        let dest = self.checkpoint();
        let prev = self.checkpoint_prev();
        remove_dir_if_any(&tmp)?;
        fs::create_dir_all(&tmp).map_err(io_err(&tmp))?;
        fill(&tmp)?;
        // The checksums are taken from the files read back from disk: a part that did not
        // reach the disk whole fails here, before anything is swapped.
        write_checksums(&tmp)?;
        if dest.exists() {
            if verify_checkpoint(&dest).is_ok() {
                remove_dir_if_any(&prev)?;
                fs::rename(&dest, &prev).map_err(io_err(&dest))?;
            } else {
                remove_dir_if_any(&dest)?;
            }
        }
        fs::rename(&tmp, &dest).map_err(io_err(&dest))?;
        Ok(())
    }
}

fn remove_dir_if_any(dir: &Path) -> Result<(), RecordError> {
    match fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(RecordError::Io { path: dir.into(), cause: e })
        }
        _ => Ok(()),
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        // The file stays (deleting it could let a process that opened it just before lock a
        // file no one else sees); emptied, it names no holder. Closing it releases the lock.
        // Nothing to report to on drop: the OS releases the lock anyway.
        let _ = self.lock.set_len(0);
    }
}
