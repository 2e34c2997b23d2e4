//! Helpers shared by the runtime tests.

use qdarts_frozen::qdf::{DType, QTensor};

/// A per-channel (axis 0) tensor with zero zero points.
pub fn tensor(name: &str, dtype: DType, dims: &[u32], scale: Vec<f32>, data: Vec<u8>) -> QTensor {
    QTensor {
        name: name.into(),
        dtype,
        dims: dims.to_vec(),
        axis: Some(0),
        zero_point: vec![0; scale.len()],
        scale,
        data,
    }
}
