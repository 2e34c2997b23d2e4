//! Shared by the integration tests that run on every backend compiled in.

use burn::tensor::Device;
/// Flex, and the other backends compiled into this build.
pub use qdarts_kernels::devices::compiled as devices;

/// Whether the fused fake-quant kernel is written for the backend of `devices()`'s entry
/// `name`: flex and the CubeCL runtimes; LibTorch runs the composite form.
pub fn has_fused(name: &str) -> bool {
    name != "tch"
}

/// The entries of [`devices`] that have the fused kernel.
#[allow(dead_code)] // Not every test file that shares this module uses it.
pub fn fused_devices() -> Vec<(&'static str, Device)> {
    devices().into_iter().filter(|(n, _)| has_fused(n)).collect()
}
