//! IDX files (MNIST, Fashion-MNIST), raw or gzip-compressed.
//!
//! Layout: a 4-byte magic `0x00 0x00 <type> <ndim>` (type `0x08` = unsigned byte), `ndim`
//! big-endian u32 dimensions, then the data in row-major order.

use std::io::Read;
use std::path::Path;

use flate2::read::GzDecoder;

use crate::error::DataError;

/// The decoded array of an IDX file of unsigned bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdxArray {
    /// Dimensions, e.g. `[60000, 28, 28]`.
    pub dims: Vec<usize>,
    /// Row-major data.
    pub data: Vec<u8>,
}

/// Reads an IDX file, gunzipping it when it starts with the gzip magic.
pub fn read_idx_file(path: &Path) -> Result<IdxArray, DataError> {
    let bytes = std::fs::read(path).map_err(|cause| DataError::Io { path: path.into(), cause })?;
    parse_idx(&bytes, path)
}

/// Parses IDX bytes (raw or gzip); `path` names the source in errors.
pub fn parse_idx(bytes: &[u8], path: &Path) -> Result<IdxArray, DataError> {
    let raw;
    let bytes = if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        GzDecoder::new(bytes)
            .read_to_end(&mut out)
            .map_err(|e| DataError::format(path, format!("corrupt gzip stream: {e}")))?;
        raw = out;
        &raw[..]
    } else {
        bytes
    };
    if bytes.len() < 4 {
        return Err(DataError::format(path, "truncated: shorter than the 4-byte IDX magic"));
    }
    if bytes[0] != 0 || bytes[1] != 0 {
        return Err(DataError::format(
            path,
            format!(
                "not an IDX file: magic {:02x}{:02x}{:02x}{:02x}",
                bytes[0], bytes[1], bytes[2], bytes[3]
            ),
        ));
    }
    if bytes[2] != 0x08 {
        return Err(DataError::format(
            path,
            format!("IDX element type 0x{:02x} is not unsigned byte (0x08)", bytes[2]),
        ));
    }
    let ndim = bytes[3] as usize;
    if ndim == 0 {
        return Err(DataError::format(path, "IDX file with zero dimensions"));
    }
    let header = 4 + 4 * ndim;
    if bytes.len() < header {
        return Err(DataError::format(
            path,
            format!("truncated: header needs {header} bytes, file has {}", bytes.len()),
        ));
    }
    let dims: Vec<usize> = bytes[4..header]
        .chunks(4)
        .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]) as usize)
        .collect();
    let n = dims
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| DataError::format(path, format!("dimensions {dims:?} overflow")))?;
    let have = bytes.len() - header;
    if have < n {
        return Err(DataError::format(
            path,
            format!("truncated: dimensions {dims:?} need {n} data bytes, file has {have}"),
        ));
    }
    if have > n {
        return Err(DataError::format(path, format!("{} trailing bytes after the data", have - n)));
    }
    Ok(IdxArray { dims, data: bytes[header..].to_vec() })
}
