//! The quantization core: specs, observers, fake quantization with straight-through gradients
//! (composite, or the fused kernel), LSQ, and error statistics.

pub mod bitmix;
pub mod error;
pub mod fake_quant;
pub mod hold;
pub mod lsq;
pub mod observer;
mod observer_kind;
pub mod pass;
pub mod quantizer;
mod range;
pub mod spec;
pub mod stats;

pub use bitmix::BitMix;
pub use error::SpecError;
pub use fake_quant::{
    FakeQuantImpl, Grid, LearnableGrid, Quantized, fake_quant, fake_quant_fused,
    fake_quant_learnable, fake_quant_with, fused_available, quantize, round_with,
};
pub use hold::{Hold, HoldTape};
pub use pass::{QuantPass, SiteKey};
pub use quantizer::{FakeQuantizer, IntTensor, freeze_observers};
pub use spec::{Granularity, ObserverKind, QuantSpec, RawQuantSpec, RoundMode};
pub use stats::{ErrorTape, QuantError, Row, TensorRole};
