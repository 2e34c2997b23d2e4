//! Kernel launches counted: on a GPU a search step's host time goes mostly into issuing its
//! launches, so `qdarts bench search` reports how many a step issues next to its time.

use burn::tensor::Device;

/// Runs `f`, counting the kernels the CubeCL runtimes launch meanwhile (every thread of the
/// process): `(f(), Some(launches))` when `device` is a CubeCL device, `(f(), None)`
/// otherwise (flex and LibTorch do not launch kernels through CubeCL).
pub fn counted<R>(device: &Device, f: impl FnOnce() -> R) -> (R, Option<u64>) {
    #[cfg(feature = "cube")]
    if crate::support::on_cube(device) {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicU64, Ordering};

        use cubecl::logging::{LaunchObservation, LaunchObserver};

        #[derive(Default)]
        struct Count(AtomicU64);

        impl LaunchObserver for Count {
            fn launched(&self, _kernel: &'static str) {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
        }

        let count = Arc::new(Count::default());
        let watching = LaunchObservation::new(count.clone());
        let out = f();
        drop(watching);
        return (out, Some(count.0.load(Ordering::Relaxed)));
    }
    let _ = device;
    (f(), None)
}
