//! `QIdentity`: `skip_connect` at stride 1. The output shares the input's grid: nothing to
//! quantize.

use burn::module::Module;

use super::common::QTensor;

/// The identity.
#[derive(Module, Debug)]
pub struct QIdentity {
    /// Layer path (for reports).
    pub path: String,
}

impl QIdentity {
    /// # Shapes
    /// - x: `[N, C, H, W]`; output: the same tensor and grid.
    pub fn forward(&self, x: QTensor) -> QTensor {
        x
    }
}
