//! qdarts-ops: fake-quantization primitives and quantized DARTS candidate ops.
//!
//! Burn has no quantization-aware training; [`quant`] builds it from float tensor math with a
//! straight-through estimator, matching PyTorch's and PaddlePaddle's fake-quant kernels number
//! for number (see `tests/golden.rs`). The float kernels it runs on (the flex convolutions,
//! pools and BatchNorm statistics, the fused fake-quant) live in `qdarts-kernels`.

pub mod arith;
pub mod buffer;
pub mod candidates;
pub mod cost;
pub mod network;
pub mod qconfig;
pub mod quant;

pub use qdarts_kernels::devices::{random, seeded};
pub use qdarts_kernels::scale::scale;
