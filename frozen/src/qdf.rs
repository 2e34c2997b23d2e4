//! `model.qdf`: the frozen model's own file format.
//!
//! ```text
//! magic      8 bytes  "QDARTSF\0"
//! version    u32      1
//! meta_len   u32      then meta_len bytes of UTF-8 JSON: {"genotype": …, "attrs": {…}}
//! count      u32      tensors
//! tensor × count:
//!   name_len u16, name (UTF-8, unique)
//!   dtype    u8       0 i8, 1 u8, 2 i32, 3 f32
//!   rank     u8       ≤ 6, then rank × u32 dims
//!   axis     i8       -1 per tensor, else the channel axis (< rank)
//!   nq       u32      1 per tensor, else dims[axis]; then nq × f32 scale, nq × i32 zero point
//!                     (scales are positive; an i8 weight channel may have a negative scale,
//!                     which negates its integers: a flipped channel that holds −128)
//!   data_len u64      = product(dims) · size(dtype), then the data
//! checksum   u64      FNV-1a of every byte before it
//! ```
//!
//! Little-endian throughout. The loader checks every length against what is left of the file
//! before it allocates, every field against its range, and the checksum; it returns an error
//! naming the offset and the problem, never panics.

use std::collections::BTreeMap;

use qdarts_genotypes::Genotype;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The file's first bytes.
pub const MAGIC: &[u8; 8] = b"QDARTSF\0";
/// The version this build writes and reads.
pub const VERSION: u32 = 1;
/// Most tensors a file may hold.
pub const MAX_TENSORS: usize = 1 << 16;
/// Most elements of one tensor.
pub const MAX_ELEMENTS: u64 = 1 << 30;
/// Highest rank.
pub const MAX_RANK: usize = 6;

/// Element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    /// Signed 8-bit (weights, signed activations).
    I8,
    /// Unsigned 8-bit (affine activations).
    U8,
    /// 32-bit (biases, fixed-point multipliers).
    I32,
    /// 32-bit float (only for metadata tensors; never in the integer path).
    F32,
}

impl DType {
    fn code(self) -> u8 {
        match self {
            DType::I8 => 0,
            DType::U8 => 1,
            DType::I32 => 2,
            DType::F32 => 3,
        }
    }

    fn from_code(c: u8) -> Option<Self> {
        Some(match c {
            0 => DType::I8,
            1 => DType::U8,
            2 => DType::I32,
            3 => DType::F32,
            _ => return None,
        })
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::I8 | DType::U8 => 1,
            DType::I32 | DType::F32 => 4,
        }
    }

    /// The integer range of a zero point of this type.
    fn zero_point_range(self) -> (i64, i64) {
        match self {
            DType::I8 => (-128, 127),
            DType::U8 => (0, 255),
            DType::I32 | DType::F32 => (i64::from(i32::MIN), i64::from(i32::MAX)),
        }
    }
}

/// A tensor of a frozen model, with its quantization parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct QTensor {
    /// Stable name (a layer path).
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub dims: Vec<u32>,
    /// Channel axis of per-channel parameters.
    pub axis: Option<u8>,
    /// Step per channel (one per tensor).
    pub scale: Vec<f32>,
    /// Zero point per channel.
    pub zero_point: Vec<i32>,
    /// Little-endian data.
    pub data: Vec<u8>,
}

impl QTensor {
    /// Elements.
    pub fn numel(&self) -> u64 {
        self.dims.iter().map(|&d| u64::from(d)).product()
    }
}

/// Metadata: the genotype and free-form attributes (e.g. input shape, class count).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Meta {
    /// The genotype the model was built from.
    pub genotype: Genotype,
    /// Other attributes.
    #[serde(default)]
    pub attrs: BTreeMap<String, serde_json::Value>,
}

/// A whole `.qdf` file.
#[derive(Debug, Clone, PartialEq)]
pub struct QdfFile {
    /// Metadata.
    pub meta: Meta,
    /// Tensors, in file order.
    pub tensors: Vec<QTensor>,
}

/// Why a `.qdf` file was refused.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum QdfError {
    /// The file ends early.
    #[error("truncated at byte {offset}: {what} needs {need} bytes, {left} left")]
    Truncated {
        /// Where.
        offset: usize,
        /// Which field.
        what: &'static str,
        /// Bytes needed.
        need: u64,
        /// Bytes left.
        left: usize,
    },
    /// A field out of range or inconsistent with another.
    #[error("byte {offset}: {message}")]
    Invalid {
        /// Where.
        offset: usize,
        /// What is wrong.
        message: String,
    },
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

impl QdfFile {
    /// The file's bytes. Errors only when a tensor is inconsistent (what `read` would refuse).
    pub fn write(&self) -> Result<Vec<u8>, QdfError> {
        let mut out = Vec::new();
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        let meta = serde_json::to_vec(&self.meta).map_err(|e| invalid(0, e.to_string()))?;
        out.extend_from_slice(
            &u32::try_from(meta.len()).map_err(|_| invalid(0, "metadata too large"))?.to_le_bytes(),
        );
        out.extend_from_slice(&meta);
        out.extend_from_slice(
            &u32::try_from(self.tensors.len())
                .map_err(|_| invalid(0, "too many tensors"))?
                .to_le_bytes(),
        );
        for t in &self.tensors {
            check_tensor(t, out.len())?;
            let name = t.name.as_bytes();
            out.extend_from_slice(&(name.len() as u16).to_le_bytes());
            out.extend_from_slice(name);
            out.push(t.dtype.code());
            out.push(t.dims.len() as u8);
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.push(t.axis.map_or(-1i8, |a| a as i8) as u8);
            out.extend_from_slice(&(t.scale.len() as u32).to_le_bytes());
            for s in &t.scale {
                out.extend_from_slice(&s.to_le_bytes());
            }
            for z in &t.zero_point {
                out.extend_from_slice(&z.to_le_bytes());
            }
            out.extend_from_slice(&(t.data.len() as u64).to_le_bytes());
            out.extend_from_slice(&t.data);
        }
        let sum = fnv1a(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        Ok(out)
    }

    /// Reads and validates a file.
    pub fn read(bytes: &[u8]) -> Result<Self, QdfError> {
        if bytes.len() < MAGIC.len() + 8 {
            return Err(QdfError::Truncated {
                offset: 0,
                what: "header",
                need: 16,
                left: bytes.len(),
            });
        }
        if &bytes[..8] != MAGIC {
            return Err(invalid(0, "not a qdarts model file (bad magic)"));
        }
        let (body, sum) = bytes.split_at(bytes.len() - 8);
        let mut r = Reader { bytes: body, pos: 8 };
        let version = r.u32("version")?;
        if version != VERSION {
            return Err(invalid(
                8,
                format!("version {version}; this qdarts reads version {VERSION}"),
            ));
        }
        let stored =
            u64::from_le_bytes(sum.try_into().map_err(|_| invalid(body.len(), "checksum"))?);
        if stored != fnv1a(body) {
            return Err(invalid(body.len(), "checksum mismatch: the file is corrupt"));
        }
        let meta_len = r.u32("metadata length")? as usize;
        let at = r.pos;
        let meta_bytes = r.take(meta_len as u64, "metadata")?;
        let meta: Meta = serde_json::from_slice(meta_bytes)
            .map_err(|e| invalid(at, format!("metadata: {e}")))?;
        meta.genotype.validate().map_err(|e| invalid(at, format!("metadata genotype: {e}")))?;
        let count = r.u32("tensor count")? as usize;
        if count > MAX_TENSORS {
            return Err(invalid(r.pos - 4, format!("{count} tensors (at most {MAX_TENSORS})")));
        }
        let mut tensors = Vec::with_capacity(count.min(1024));
        let mut names = std::collections::HashSet::new();
        for _ in 0..count {
            let start = r.pos;
            let name_len = r.u16("name length")?;
            let name = std::str::from_utf8(r.take(u64::from(name_len), "name")?)
                .map_err(|_| invalid(start, "tensor name is not UTF-8"))?
                .to_string();
            let dtype = DType::from_code(r.u8("dtype")?)
                .ok_or_else(|| invalid(r.pos - 1, format!("tensor `{name}`: unknown dtype")))?;
            let rank = usize::from(r.u8("rank")?);
            if rank > MAX_RANK {
                return Err(invalid(
                    r.pos - 1,
                    format!("tensor `{name}`: rank {rank} (at most {MAX_RANK})"),
                ));
            }
            let dims = (0..rank).map(|_| r.u32("dimension")).collect::<Result<Vec<_>, _>>()?;
            let axis = match r.u8("axis")? as i8 {
                -1 => None,
                a if a >= 0 => Some(a as u8),
                a => return Err(invalid(r.pos - 1, format!("tensor `{name}`: axis {a}"))),
            };
            let nq = r.u32("parameter count")?;
            r.need(u64::from(nq) * 8, "scales and zero points")?;
            let scale = (0..nq).map(|_| r.f32("scale")).collect::<Result<Vec<_>, _>>()?;
            let zero_point = (0..nq).map(|_| r.i32("zero point")).collect::<Result<Vec<_>, _>>()?;
            let data_len = r.u64("data length")?;
            let data = r.take(data_len, "tensor data")?.to_vec();
            let t = QTensor { name, dtype, dims, axis, scale, zero_point, data };
            check_tensor(&t, start)?;
            if !names.insert(t.name.clone()) {
                return Err(invalid(start, format!("tensor `{}` appears twice", t.name)));
            }
            tensors.push(t);
        }
        if r.pos != body.len() {
            return Err(invalid(
                r.pos,
                format!("{} unexpected bytes after the last tensor", body.len() - r.pos),
            ));
        }
        Ok(QdfFile { meta, tensors })
    }
}

fn invalid(offset: usize, message: impl Into<String>) -> QdfError {
    QdfError::Invalid { offset, message: message.into() }
}

/// The rules a tensor must follow, on write and on read.
fn check_tensor(t: &QTensor, at: usize) -> Result<(), QdfError> {
    let bad = |m: String| Err(invalid(at, format!("tensor `{}`: {m}", t.name)));
    if t.name.is_empty() || t.name.len() > usize::from(u16::MAX) {
        return bad("empty or too long name".into());
    }
    if t.dims.len() > MAX_RANK {
        return bad(format!("rank {}", t.dims.len()));
    }
    let numel = t.dims.iter().try_fold(1u64, |n, &d| n.checked_mul(u64::from(d)));
    let Some(numel) = numel.filter(|&n| n <= MAX_ELEMENTS) else {
        return bad(format!("shape {:?} has more than {MAX_ELEMENTS} elements", t.dims));
    };
    if t.data.len() as u64 != numel * t.dtype.size() as u64 {
        return bad(format!("{} data bytes for shape {:?} of {:?}", t.data.len(), t.dims, t.dtype));
    }
    let channels = match t.axis {
        None => 1,
        Some(a) if usize::from(a) < t.dims.len() => t.dims[usize::from(a)] as usize,
        Some(a) => return bad(format!("axis {a} for rank {}", t.dims.len())),
    };
    if t.scale.len() != channels || t.zero_point.len() != channels {
        return bad(format!(
            "{} scales and {} zero points for {channels} channel(s)",
            t.scale.len(),
            t.zero_point.len()
        ));
    }
    // An int8 weight channel may carry a negative scale: its integers are negated when used
    // (a BN weight γ < 0 on a channel holding −128, whose negation is not an int8).
    let signed_ok = t.dtype == DType::I8;
    if let Some(s) =
        t.scale.iter().find(|s| !(s.is_finite() && (**s > 0.0 || (signed_ok && **s < 0.0))))
    {
        let what = if signed_ok { "a non-zero finite number" } else { "a positive finite number" };
        return bad(format!("scale {s} is not {what}"));
    }
    let (lo, hi) = t.dtype.zero_point_range();
    if let Some(z) = t.zero_point.iter().find(|z| !(lo..=hi).contains(&i64::from(**z))) {
        return bad(format!("zero point {z} outside {lo}..={hi} of {:?}", t.dtype));
    }
    Ok(())
}

/// A cursor that checks every length against the bytes left before it reads.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn need(&self, n: u64, what: &'static str) -> Result<(), QdfError> {
        let left = self.bytes.len() - self.pos;
        if n > left as u64 {
            return Err(QdfError::Truncated { offset: self.pos, what, need: n, left });
        }
        Ok(())
    }

    fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8], QdfError> {
        self.need(n, what)?;
        let s = &self.bytes[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], QdfError> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, QdfError> {
        Ok(self.array::<1>(what)?[0])
    }
    fn u16(&mut self, what: &'static str) -> Result<u16, QdfError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    fn u32(&mut self, what: &'static str) -> Result<u32, QdfError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    fn i32(&mut self, what: &'static str) -> Result<i32, QdfError> {
        Ok(i32::from_le_bytes(self.array(what)?))
    }
    fn u64(&mut self, what: &'static str) -> Result<u64, QdfError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }
    fn f32(&mut self, what: &'static str) -> Result<f32, QdfError> {
        Ok(f32::from_le_bytes(self.array(what)?))
    }
}
