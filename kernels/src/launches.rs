//! Kernel launches counted: on a GPU a search step's host time goes mostly into issuing its
//! launches, so `qdarts bench search` reports how many a step issues next to its time.

use burn::tensor::Device;

/// Runs `f`, counting the kernels the CubeCL runtimes launch meanwhile (every thread of the
/// process): `(f(), Some(launches))` when `device` is a CubeCL device, `(f(), None)`
/// otherwise (flex and LibTorch do not launch kernels through CubeCL).
pub fn counted<R>(device: &Device, f: impl FnOnce() -> R) -> (R, Option<u64>) {
    let (out, kinds) = counted_by_kernel(device, f);
    (out, kinds.map(|k| k.iter().map(|(_, n)| n).sum()))
}

/// [`counted`] by kernel: each kernel's name (CubeCL's, e.g. the kernel function's path) and
/// its launches, most launched first, ties by name.
pub fn counted_by_kernel<R>(
    device: &Device,
    f: impl FnOnce() -> R,
) -> (R, Option<Vec<(&'static str, u64)>>) {
    #[cfg(feature = "cube")]
    if crate::support::on_cube(device) {
        use std::collections::HashMap;
        use std::sync::{Arc, Mutex};

        use cubecl::logging::{LaunchObservation, LaunchObserver};

        #[derive(Default)]
        struct Count(Mutex<HashMap<&'static str, u64>>);

        impl LaunchObserver for Count {
            fn launched(&self, kernel: &'static str) {
                let mut seen = self.0.lock().unwrap_or_else(|e| e.into_inner());
                *seen.entry(kernel).or_default() += 1;
            }
        }

        let count = Arc::new(Count::default());
        let watching = LaunchObservation::new(count.clone());
        let out = f();
        drop(watching);
        let seen = std::mem::take(&mut *count.0.lock().unwrap_or_else(|e| e.into_inner()));
        let mut kinds: Vec<(&'static str, u64)> = seen.into_iter().collect();
        kinds.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        return (out, Some(kinds));
    }
    let _ = device;
    (f(), None)
}
