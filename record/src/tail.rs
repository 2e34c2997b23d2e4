//! Following a table that another process appends to: read what was appended since the last
//! poll, hand on complete lines only (a row being written stays for the next poll), and notice
//! when the file was replaced or cut back (a resumed or rolled-back run rewrites its tables).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crate::table::split_line;

/// What a poll of one file found.
#[derive(Debug, Default, PartialEq)]
pub struct Polled {
    /// Complete lines appended since the last poll (the header is kept aside).
    pub lines: Vec<String>,
    /// The file was replaced or cut back: everything read from it before is stale.
    pub reset: bool,
}

/// One table being followed.
#[derive(Debug)]
pub struct Tail {
    path: PathBuf,
    /// Bytes up to the end of the last complete line handed on.
    committed: u64,
    /// The file's identity (inode) when it was last read.
    identity: Option<u64>,
    header: Option<csv::StringRecord>,
}

#[cfg(unix)]
fn identity(meta: &std::fs::Metadata) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    Some(meta.ino())
}

#[cfg(not(unix))]
fn identity(_meta: &std::fs::Metadata) -> Option<u64> {
    None
}

impl Tail {
    /// Follows `path` (which need not exist yet).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Tail { path: path.into(), committed: 0, identity: None, header: None }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The column names, once the header line was read.
    pub fn header(&self) -> Option<&csv::StringRecord> {
        self.header.as_ref()
    }

    /// Reads what was appended. A file that does not exist yet is not an error.
    pub fn poll(&mut self) -> std::io::Result<Polled> {
        let mut out = Polled::default();
        let mut file = match File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if self.committed > 0 {
                    self.restart();
                    out.reset = true;
                }
                return Ok(out);
            }
            Err(e) => return Err(e),
        };
        let meta = file.metadata()?;
        let id = identity(&meta);
        if (self.identity.is_some() && id != self.identity) || meta.len() < self.committed {
            self.restart();
            out.reset = true;
        }
        self.identity = id;
        file.seek(SeekFrom::Start(self.committed))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let Some(end) = bytes.iter().rposition(|&b| b == b'\n') else { return Ok(out) };
        self.committed += end as u64 + 1;
        for raw in bytes[..end].split(|&b| b == b'\n') {
            let line = String::from_utf8_lossy(raw).trim_end_matches('\r').to_string();
            if self.header.is_none() {
                self.header = Some(split_line(&line).unwrap_or_default());
            } else {
                out.lines.push(line);
            }
        }
        Ok(out)
    }

    fn restart(&mut self) {
        self.committed = 0;
        self.header = None;
        self.identity = None;
    }
}
