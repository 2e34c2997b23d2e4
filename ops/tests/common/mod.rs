//! Shared by the integration tests that run on every backend compiled in.

use burn::tensor::Device;

/// Flex, and the other backends compiled in (`--features wgpu`, `--features cuda`,
/// `--features tch`; wgpu runs on Mesa's software Vulkan driver where there is no GPU, tch on
/// LibTorch's CPU device). cuda is left out, with a note, on a machine where it cannot start
/// (no NVIDIA GPU or driver), unless `QDARTS_REQUIRE_CUDA` is set, as on a GPU machine's
/// check (`scripts/gpu_check.sh`), where that is a failure.
pub fn devices() -> Vec<(&'static str, Device)> {
    #[allow(unused_mut)]
    let mut all = vec![("flex", Device::flex())];
    #[cfg(feature = "wgpu")]
    all.push(("wgpu", Device::wgpu(burn::tensor::DeviceKind::DefaultDevice)));
    #[cfg(feature = "cuda")]
    if let Some(d) = cuda() {
        all.push(("cuda", d));
    }
    #[cfg(feature = "tch")]
    #[allow(deprecated)]
    all.push(("tch", Device::libtorch()));
    all
}

/// CUDA device 0 when it starts (one element goes there and back), else `None` with a note.
#[cfg(feature = "cuda")]
fn cuda() -> Option<Device> {
    use std::sync::OnceLock;
    static STARTS: OnceLock<bool> = OnceLock::new();
    let starts = *STARTS.get_or_init(|| {
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let ok = std::panic::catch_unwind(|| {
            burn::tensor::Tensor::<1>::zeros([1], &Device::cuda(0)).into_data()
        })
        .is_ok();
        std::panic::set_hook(hook);
        if !ok {
            assert!(
                std::env::var_os("QDARTS_REQUIRE_CUDA").is_none(),
                "QDARTS_REQUIRE_CUDA is set but the cuda backend does not start"
            );
            eprintln!("note: cuda does not start here (no NVIDIA GPU or driver): not tested");
        }
        ok
    });
    starts.then(|| Device::cuda(0))
}

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
