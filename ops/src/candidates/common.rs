//! What every candidate op shares: the quantized activation type, the build context, and the
//! visitor over quantizers.

use burn::tensor::{Device, Tensor};

use crate::qconfig::{QuantConfig, Site};
use crate::quant::{FakeQuantizer, Grid, QuantStats, SpecError, TensorRole};

/// An activation and the grid its values lie on (`None`: float).
#[derive(Debug, Clone)]
pub struct QTensor {
    /// The (fake-quantized) values, `[N, C, H, W]`.
    pub value: Tensor<4>,
    /// Their quantization grid.
    pub grid: Option<Grid>,
}

impl QTensor {
    /// A float activation.
    pub fn float(value: Tensor<4>) -> Self {
        QTensor { value, grid: None }
    }

    /// The activation's shape.
    pub fn dims(&self) -> [usize; 4] {
        self.value.dims()
    }
}

/// Applies an optional quantizer; `None` leaves the tensor float.
pub fn quantize_opt(q: &Option<FakeQuantizer>, x: Tensor<4>) -> QTensor {
    match q {
        Some(q) => {
            let (value, grid) = q.forward_with_grid(x);
            QTensor { value, grid: Some(grid) }
        }
        None => QTensor::float(x),
    }
}

/// Where an op is built: the quantization config, the op type (for per-op overrides), its layer
/// path and its device.
#[derive(Debug, Clone)]
pub struct Ctx<'a> {
    /// Quantization config.
    pub cfg: &'a QuantConfig,
    /// Op type name, e.g. `sep_conv_3x3`.
    pub op: &'a str,
    /// Layer path of the op, e.g. `cells.3.edges.5.sep_conv_3x3`.
    pub path: String,
    /// Device.
    pub device: &'a Device,
}

impl<'a> Ctx<'a> {
    /// A context for a sub-layer at `path.name`.
    pub fn child(&self, name: &str) -> Ctx<'a> {
        Ctx { path: format!("{}.{name}", self.path), ..self.clone() }
    }

    /// The quantizer of a site at `path.name` (`None` when the config leaves it float).
    pub fn quantizer(
        &self,
        site: Site,
        name: &str,
        channels: usize,
    ) -> Result<Option<FakeQuantizer>, SpecError> {
        let role = match site {
            Site::Weight => TensorRole::Weight,
            Site::Act => TensorRole::Act,
            Site::Mix => TensorRole::Mix,
        };
        let path = format!("{}.{name}", self.path);
        self.cfg
            .spec_for(self.op, site)?
            .map(|s| FakeQuantizer::new(s, path, role, channels, self.device))
            .transpose()
    }

    /// The per-tensor quantizer of a folded BatchNorm weight at `path.name`.
    pub fn bn_quantizer(&self, name: &str) -> Result<Option<FakeQuantizer>, SpecError> {
        let path = format!("{}.{name}", self.path);
        self.cfg
            .bn_weight(self.op)?
            .map(|s| FakeQuantizer::new(s, path, TensorRole::Weight, 1, self.device))
            .transpose()
    }
}

/// A module that owns quantizers: the visitor that collects their error rows.
pub trait QuantSites {
    /// Every quantizer of the module, in a stable order.
    fn quantizers(&self) -> Vec<&FakeQuantizer>;

    /// Sets what every quantizer does with its rounding (see [`crate::quant::hold`]).
    fn set_hold(&self, mode: crate::quant::HoldMode) {
        for q in self.quantizers() {
            q.set_hold(mode);
        }
    }

    /// Turns error recording on or off for every quantizer.
    fn set_recording(&self, on: bool) {
        for q in self.quantizers() {
            q.set_recording(on);
        }
    }

    /// The error rows of every quantizer that recorded a tensor.
    fn quant_stats(&self) -> Result<Vec<QuantStats>, SpecError> {
        let mut rows = Vec::new();
        for q in self.quantizers() {
            rows.extend(q.last_stats()?);
        }
        Ok(rows)
    }
}

/// Collects the quantizers of optional sites.
pub fn sites<'a>(
    qs: impl IntoIterator<Item = &'a Option<FakeQuantizer>>,
) -> Vec<&'a FakeQuantizer> {
    qs.into_iter().flatten().collect()
}
