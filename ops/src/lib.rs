//! qdarts-ops: fake-quantization primitives and quantized DARTS candidate ops.
//!
//! Burn has no quantization-aware training; [`quant`] builds it from float tensor math with a
//! straight-through estimator, matching PyTorch's and PaddlePaddle's fake-quant kernels number
//! for number (see `tests/golden.rs`).

pub mod arith;
pub mod candidates;
pub mod network;
pub mod qconfig;
pub mod quant;
