//! The run folder (`results/<run>/`): a lock against a second writer, CSV files appended and
//! flushed a row at a time (a crash loses at most the row being written), files replaced
//! atomically (temp + rename).

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use thiserror::Error;

/// A run folder that cannot be used.
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
    #[error("{path} is held by process {pid}, which is still running: wait for it or stop it")]
    Locked {
        /// The lock file.
        path: PathBuf,
        /// Its owner.
        pid: u32,
    },
    /// The folder is not a run.
    #[error("{0}")]
    NotARun(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> RecordError + '_ {
    move |cause| RecordError::Io { path: path.into(), cause }
}

/// UTC `YYYYmmdd-HHMMSS` from the system clock (days-to-civil, Howard Hinnant).
pub fn utc_stamp() -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
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
fn alive(pid: u32) -> bool {
    if cfg!(target_os = "linux") { Path::new(&format!("/proc/{pid}")).exists() } else { true }
}

/// A run folder held by this process.
#[derive(Debug)]
pub struct RunDir {
    root: PathBuf,
}

impl RunDir {
    /// Creates `<parent>/<name>-<UTC time>` (with a numeric suffix if taken) and takes its lock.
    pub fn create(parent: &Path, name: &str) -> Result<Self, RecordError> {
        fs::create_dir_all(parent).map_err(io(parent))?;
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

    /// Takes the lock of an existing run folder. A lock left by a process that is gone (killed)
    /// is taken over; a live owner is an error.
    pub fn open(dir: &Path) -> Result<Self, RecordError> {
        if !dir.is_dir() {
            return Err(RecordError::NotARun(format!("{} is not a folder", dir.display())));
        }
        let lock = dir.join("lock");
        for _ in 0..2 {
            match OpenOptions::new().write(true).create_new(true).open(&lock) {
                Ok(mut f) => {
                    writeln!(f, "{}", std::process::id()).map_err(io(&lock))?;
                    f.sync_all().map_err(io(&lock))?;
                    return Ok(RunDir { root: dir.to_path_buf() });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let text = fs::read_to_string(&lock).unwrap_or_default();
                    match text.trim().parse::<u32>() {
                        Ok(pid) if pid != std::process::id() && alive(pid) => {
                            return Err(RecordError::Locked { path: lock, pid });
                        }
                        _ => fs::remove_file(&lock).map_err(io(&lock))?,
                    }
                }
                Err(e) => return Err(RecordError::Io { path: lock, cause: e }),
            }
        }
        Err(RecordError::NotARun(format!("{}: could not take the lock", lock.display())))
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// A file in the folder.
    pub fn file(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    /// Replaces a file atomically: write a temp file, sync, rename.
    pub fn write_atomic(&self, name: &str, bytes: &[u8]) -> Result<(), RecordError> {
        write_atomic(&self.file(name), bytes)
    }

    /// Opens (or creates, with its header) an append-only CSV file.
    pub fn csv(&self, name: &str, header: &str) -> Result<Csv, RecordError> {
        Csv::open(&self.file(name), header)
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = fs::remove_file(self.root.join("lock"));
    }
}

/// Writes `path` atomically (temp file in the same folder, fsync, rename).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), RecordError> {
    let tmp = path.with_extension("tmp");
    let mut f = File::create(&tmp).map_err(io(&tmp))?;
    f.write_all(bytes).map_err(io(&tmp))?;
    f.sync_all().map_err(io(&tmp))?;
    fs::rename(&tmp, path).map_err(io(path))
}

/// An append-only CSV file: one `write_all` per row, flushed.
#[derive(Debug)]
pub struct Csv {
    file: File,
    path: PathBuf,
}

impl Csv {
    /// Opens for appending; writes the header into a new or empty file. A torn last line (no
    /// newline, from a killed writer) is cut off first.
    pub fn open(path: &Path, header: &str) -> Result<Self, RecordError> {
        if let Ok(text) = fs::read(path)
            && !text.is_empty()
            && !text.ends_with(b"\n")
        {
            let keep = text.iter().rposition(|&b| b == b'\n').map(|i| i + 1).unwrap_or(0);
            write_atomic(path, &text[..keep])?;
        }
        let mut file = OpenOptions::new().create(true).append(true).open(path).map_err(io(path))?;
        if file.metadata().map_err(io(path))?.len() == 0 {
            file.write_all(format!("{header}\n").as_bytes()).map_err(io(path))?;
        }
        Ok(Csv { file, path: path.into() })
    }

    /// Appends one row (fields already formatted; commas in text fields must be quoted by the
    /// caller with [`quote`]).
    pub fn row(&mut self, fields: &[String]) -> Result<(), RecordError> {
        let line = format!("{}\n", fields.join(","));
        self.file.write_all(line.as_bytes()).map_err(io(&self.path))?;
        self.file.flush().map_err(io(&self.path))
    }
}

/// Quotes a CSV text field (RFC 4180) when it holds a comma, quote or newline.
pub fn quote(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// A `quant_error.csv` row: `epoch,step,layer,kind,bits,scale,zero_point,mse,sqnr_db,clip_frac`.
pub fn quant_row(epoch: usize, step: usize, q: &qdarts_ops::quant::QuantStats) -> Vec<String> {
    vec![
        epoch.to_string(),
        step.to_string(),
        quote(&q.path),
        q.role.to_string(),
        q.bits.to_string(),
        format!("{:e}", q.scale),
        format!("{}", q.zero_point),
        format!("{:e}", q.mse),
        format!("{:.3}", q.sqnr_db),
        format!("{:.6}", q.clip_frac),
    ]
}

/// Keeps the header and the rows written before a checkpoint: those whose first field (the
/// epoch) is below `epoch`, and, when `step` is given, those of `epoch` itself whose second
/// field (the global step) is at most `step`. What a resumed run keeps of a CSV file written
/// after its last checkpoint.
pub fn truncate_csv_to(path: &Path, epoch: usize, step: Option<usize>) -> Result<(), RecordError> {
    let Ok(text) = fs::read_to_string(path) else { return Ok(()) };
    let mut out = String::new();
    for (i, line) in text.split_inclusive('\n').enumerate() {
        if !line.ends_with('\n') {
            break;
        }
        let mut fields = line.split(',').map(|f| f.trim().parse::<usize>().ok());
        let (e, s) = (fields.next().flatten(), fields.next().flatten());
        let keep = i == 0
            || match (e, step) {
                (Some(e), _) if e < epoch => true,
                (Some(e), Some(step)) if e == epoch => s.is_some_and(|s| s <= step),
                _ => false,
            };
        if keep {
            out.push_str(line);
        }
    }
    write_atomic(path, out.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("qdarts-record-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_second_writer_is_refused_while_the_first_lives() {
        let parent = scratch("lock");
        let run = RunDir::create(&parent, "t").unwrap();
        // Our own pid in the lock reads as "taken over" for this process; pid 1 is always alive.
        fs::write(run.file("lock"), "1\n").unwrap();
        let err = RunDir::open(run.path()).unwrap_err();
        assert!(matches!(err, RecordError::Locked { pid: 1, .. }), "{err}");
        // A lock from a process that is gone is taken over.
        fs::write(run.file("lock"), "4000000000\n").unwrap();
        assert!(RunDir::open(run.path()).is_ok());
    }

    #[test]
    fn csv_rows_append_and_a_torn_last_line_is_cut() {
        let d = scratch("csv");
        let p = d.join("m.csv");
        {
            let mut c = Csv::open(&p, "epoch,loss").unwrap();
            c.row(&["0".into(), "1.5".into()]).unwrap();
        }
        // A killed writer left half a row.
        OpenOptions::new().append(true).open(&p).unwrap().write_all(b"1,0.7").unwrap();
        let mut c = Csv::open(&p, "epoch,loss").unwrap();
        c.row(&["1".into(), "0.75".into()]).unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), "epoch,loss\n0,1.5\n1,0.75\n");
        truncate_csv_to(&p, 1, None).unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), "epoch,loss\n0,1.5\n");
        // Mid-epoch: rows of the epoch up to the step stay.
        let q = d.join("s.csv");
        fs::write(&q, "epoch,step,v\n0,1,a\n0,2,b\n1,3,c\n1,4,d\n1,5,e\n2,6,f\n").unwrap();
        truncate_csv_to(&q, 1, Some(4)).unwrap();
        assert_eq!(fs::read_to_string(&q).unwrap(), "epoch,step,v\n0,1,a\n0,2,b\n1,3,c\n1,4,d\n");
        assert_eq!(quote("a,b"), "\"a,b\"");
    }

    #[test]
    fn utc_stamps_have_the_documented_shape() {
        let s = utc_stamp();
        assert_eq!(s.len(), 15);
        assert_eq!(&s[8..9], "-");
        assert!(s[..8].chars().all(|c| c.is_ascii_digit()) && s.starts_with("20"));
    }
}
