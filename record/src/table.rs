//! Writing and reading the CSV tables: rows appended and flushed one `write` at a time (a crash
//! loses at most the row being written), a torn last line cut off when a writer reopens the
//! file, whole-file and line-by-line readers, and the cut back to a checkpoint on resume.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};

use crate::rows::Table;
use crate::{RecordError, io_err, write_atomic};

fn csv_writer() -> csv::Writer<Vec<u8>> {
    csv::WriterBuilder::new()
        .has_headers(false)
        .terminator(csv::Terminator::Any(b'\n'))
        .from_writer(Vec::new())
}

fn encode_with(
    path: &Path,
    write: impl FnOnce(&mut csv::Writer<Vec<u8>>) -> csv::Result<()>,
) -> Result<Vec<u8>, RecordError> {
    let mut w = csv_writer();
    let bad = |e: String| RecordError::Encode { path: path.into(), message: e };
    write(&mut w).map_err(|e| bad(e.to_string()))?;
    w.into_inner().map_err(|e| bad(e.to_string()))
}

/// One row as its CSV line (with the newline).
pub fn encode_row<T: Table>(row: &T) -> Result<Vec<u8>, RecordError> {
    encode_with(Path::new(T::FILE), |w| w.serialize(row))
}

/// The header line of a table (with the newline).
pub fn header_line<T: Table>() -> String {
    T::COLUMNS.join(",") + "\n"
}

/// An append-only table of a run: one `write_all` per row, flushed.
#[derive(Debug)]
pub struct TableWriter<T> {
    file: File,
    path: PathBuf,
    row: PhantomData<fn(&T)>,
}

impl<T: Table> TableWriter<T> {
    /// Opens `path` for appending; writes the header into a new or empty file. A torn last
    /// line (no newline, from a killed writer) is cut off first.
    pub fn open(path: &Path) -> Result<Self, RecordError> {
        if let Ok(text) = fs::read(path)
            && !text.is_empty()
            && !text.ends_with(b"\n")
        {
            let keep = text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
            write_atomic(path, &text[..keep])?;
        }
        let mut file =
            OpenOptions::new().create(true).append(true).open(path).map_err(io_err(path))?;
        if file.metadata().map_err(io_err(path))?.len() == 0 {
            file.write_all(header_line::<T>().as_bytes()).map_err(io_err(path))?;
        }
        Ok(TableWriter { file, path: path.into(), row: PhantomData })
    }

    /// Appends one row.
    pub fn push(&mut self, row: &T) -> Result<(), RecordError> {
        let line = encode_row(row)?;
        self.file.write_all(&line).map_err(io_err(&self.path))?;
        self.file.flush().map_err(io_err(&self.path))
    }
}

/// Every complete row of a table, in file order; `Ok(vec![])` when the file does not exist.
/// A row that does not parse is an error naming the file and the line.
pub fn read_table<T: Table>(path: &Path) -> Result<Vec<T>, RecordError> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(RecordError::Io { path: path.into(), cause: e }),
    };
    // A torn last line (a writer killed mid-row) is not a row yet.
    let end = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let mut reader = csv::ReaderBuilder::new().from_reader(&bytes[..end]);
    let headers = reader
        .headers()
        .map_err(|e| RecordError::Decode { path: path.into(), message: e.to_string() })?
        .clone();
    let mut rows = Vec::new();
    for (i, record) in reader.records().enumerate() {
        let decode = |e: csv::Error| RecordError::Decode {
            path: path.into(),
            message: format!("line {}: {e}", i + 2),
        };
        rows.push(record.map_err(decode)?.deserialize(Some(&headers)).map_err(decode)?);
    }
    Ok(rows)
}

/// Splits one CSV line (no newline) into fields; `None` when a quote is left open (an odd
/// number of quote characters: a row cut inside a quoted field).
pub fn split_line(line: &str) -> Option<csv::StringRecord> {
    if line.bytes().filter(|&b| b == b'"').count() % 2 == 1 {
        return None;
    }
    if line.is_empty() {
        return Some(csv::StringRecord::from(vec![""]));
    }
    let mut reader = csv::ReaderBuilder::new().has_headers(false).from_reader(line.as_bytes());
    reader.records().next()?.ok()
}

/// Parses a line of a table under the header read from its file (columns matched by name,
/// so a reordered or extended file still reads); `None` for a malformed row.
pub fn parse_line<T: Table>(header: &csv::StringRecord, line: &str) -> Option<T> {
    let record = split_line(line)?;
    if record.len() != header.len() {
        return None;
    }
    record.deserialize(Some(header)).ok()
}

/// Keeps the header and the rows written before a checkpoint: rows whose epoch (first field)
/// is below `epoch`, and, when `step` is given, rows of `epoch` itself whose global step
/// (second field) is at most `step`. What a resumed run keeps of a table written after its
/// last checkpoint. A missing file is left missing.
pub fn truncate_to(path: &Path, epoch: usize, step: Option<usize>) -> Result<(), RecordError> {
    let text = match fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(RecordError::Io { path: path.into(), cause: e }),
    };
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

/// [`truncate_to`] for a table, by its kind: a stepped table keeps `epoch`'s rows up to
/// `step`, the others whole epochs only.
pub fn truncate_table<T: Table>(path: &Path, epoch: usize, step: usize) -> Result<(), RecordError> {
    truncate_to(path, epoch, T::STEPPED.then_some(step))
}
