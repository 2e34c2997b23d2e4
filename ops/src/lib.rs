//! qdarts-ops: fake-quantization primitives and quantized DARTS candidate ops.
//!
//! Burn has no quantization-aware training; [`quant`] builds it from float tensor math with a
//! straight-through estimator, matching PyTorch's and PaddlePaddle's fake-quant kernels number
//! for number (see `tests/golden.rs`).

pub mod arith;
pub mod candidates;
pub mod channel;
pub mod cost;
pub mod depthwise;
mod lanes;
pub mod network;
pub mod plane;
pub mod pointwise;
pub mod pool;
pub mod qconfig;
pub mod quant;
pub mod reduce;

use burn::tensor::Device;

/// Serializes seeding and use of the backend's process-wide generator.
static SEED_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Seeds `device`'s generator and runs `draw` (which draws initial weights or random inputs)
/// while no other seeded block of this process can interleave its draws: the backend's
/// generator is one per process, and two searches (or two tests) in one process would
/// otherwise take numbers from each other. Blocks must not nest.
pub fn seeded<T>(device: &Device, seed: u64, draw: impl FnOnce() -> T) -> T {
    let _guard = SEED_LOCK.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    device.seed(seed);
    draw()
}
