//! Shared by the integration tests that run on every backend compiled in.

use burn::tensor::Device;

/// Flex, and the GPU backends compiled in (`--features wgpu`, `--features cuda`; wgpu runs on
/// Mesa's software Vulkan driver where there is no GPU).
pub fn devices() -> Vec<(&'static str, Device)> {
    #[allow(unused_mut)]
    let mut all = vec![("flex", Device::flex())];
    #[cfg(feature = "wgpu")]
    all.push(("wgpu", Device::wgpu(burn::tensor::DeviceKind::DefaultDevice)));
    #[cfg(feature = "cuda")]
    all.push(("cuda", Device::cuda(0)));
    all
}
