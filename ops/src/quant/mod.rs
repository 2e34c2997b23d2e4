//! The quantization core: specs, observers, fake-quant kernels with straight-through gradients,
//! LSQ, and error statistics.

pub mod bitmix;
pub mod error;
pub mod fused;
pub mod hold;
pub mod kernel;
pub mod lsq;
pub mod observer;
mod observer_kind;
pub mod quantizer;
pub mod spec;
pub mod stats;

pub use bitmix::BitMix;
pub use error::SpecError;
pub use hold::HoldMode;
pub use kernel::{
    FakeQuantImpl, Grid, LearnableGrid, Quantized, fake_quant, fake_quant_learnable,
    fake_quant_ste, fake_quant_with, quantize, round_with,
};
pub use quantizer::{FakeQuantizer, IntTensor, freeze_observers};
pub use spec::{Granularity, ObserverKind, QuantSpec, RawQuantSpec, RoundMode};
pub use stats::{QuantStats, TensorRole};
