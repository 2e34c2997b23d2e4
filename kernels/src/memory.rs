//! How the CubeCL runtimes pool GPU memory for a supernet.
//!
//! CubeCL 0.11's default pools (`MemoryConfiguration::Adaptive`) carve allocations out of
//! shared pages. Each allocation walks the slices of the pages in turn, merging free
//! neighbours and renumbering the slices behind a split, and frees are seen only by that walk,
//! so its cost grows with the number of live tensors. A DARTS supernet keeps thousands alive
//! from its forward pass to its backward pass (every candidate op's intermediates, on all 112
//! edges at the DARTS shape), and its step issues tens of thousands of launches, each
//! allocating its output: on a GPU the step took about twice its kernel time, and a profile of
//! the same step on a CPU (wgpu on Mesa's driver) put most of the runtime thread's own time in
//! the pools' page walks.
//! `MemoryConfiguration::ExclusivePages` gives each allocation a page of its own from size
//! buckets, found by a scan of that bucket without merging or renumbering; what it bought:
//! `docs/results/2026-11-28-gpu-h100-memory-pools.md`.
//!
//! CubeCL 0.11.3's exclusive pages still looked at every page of the bucket and of every larger
//! bucket before allocating, and let a small allocation take a large free page;
//! `vendor/cubecl-server` bounds the look to the pages handed out last and a sweep of 64 from a
//! cursor, in the size's own bucket (`vendor/README.md` says how and why;
//! `docs/results/2026-11-29-exclusive-pages.md` what it changed).
//!
//! [`prefer_exclusive_pages`] asks for exclusive pages on the devices started after the call;
//! the qdarts binary calls it before it starts a GPU device. The kernels' tests do not: their
//! devices keep CubeCL's default, which the kernels must work with as well.

/// The device kinds this build can start with exclusive pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuRuntime {
    /// CUDA through CubeCL (feature `cuda`): every CUDA device started afterwards.
    Cuda,
    /// wgpu's default adapter (feature `wgpu`), as `Device::wgpu(DeviceKind::DefaultDevice)`
    /// names it.
    WgpuDefault,
}

/// Asks the runtime for exclusive pages (see the module docs) on the devices of `runtime` that
/// start after this call (a device that already started keeps its pools). Returns `false` when
/// the runtime is not compiled in; for cuda, when the setting was made before (the first call
/// wins); for wgpu, when the default adapter's device already started or no adapter could be
/// opened (the device's own start then reports why).
pub fn prefer_exclusive_pages(runtime: GpuRuntime) -> bool {
    match runtime {
        #[cfg(feature = "cuda")]
        GpuRuntime::Cuda => {
            cubecl_cuda::set_memory_configuration(cubecl::MemoryConfiguration::ExclusivePages)
        }
        #[cfg(feature = "wgpu")]
        GpuRuntime::WgpuDefault => {
            use cubecl::wgpu::{
                AutoGraphicsApi, RuntimeOptions, WgpuBackend, WgpuDevice, WgpuDeviceKind,
                try_init_setup,
            };
            let device = WgpuDevice::new(WgpuDeviceKind::DefaultDevice).on(WgpuBackend::Auto);
            let options = RuntimeOptions {
                memory_config: cubecl::MemoryConfiguration::ExclusivePages,
                ..Default::default()
            };
            try_init_setup::<AutoGraphicsApi>(&device, options).is_ok()
        }
        #[allow(unreachable_patterns)]
        _ => false,
    }
}
