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

/// The environment variable that names a kernel (part of its name, e.g. `copy_kernel`) whose
/// launches [`counted_by_kernel`] reports on standard error, each with its call sites in this
/// workspace and in Burn's autodiff and backend (innermost first): which line of the model a launch
/// comes from, forward or backward.
pub const TRACE: &str = "QDARTS_LAUNCH_TRACE";

/// The frames of the current call stack in this workspace's crates (not this file) and in
/// Burn's autodiff and backend, innermost first, as `path:line` joined by ` <- `.
#[cfg(feature = "cube")]
fn call_sites() -> String {
    let trace = std::backtrace::Backtrace::force_capture().to_string();
    let ours = [
        "/search/src/",
        "/ops/src/",
        "/kernels/src/",
        "/src/bench/",
        "burn-autodiff-",
        "burn-backend-",
    ];
    let sites: Vec<&str> = trace
        .lines()
        .filter_map(|l| l.trim().strip_prefix("at "))
        .filter(|at| ours.iter().any(|p| at.contains(p)) && !at.contains("launches.rs"))
        .map(|at| at.rsplit_once(':').map_or(at, |(path_line, _col)| path_line))
        // A registry crate by its own name: `burn-autodiff-0.22.1/src/…`.
        .map(|at| {
            at.split_once("/registry/src/")
                .and_then(|(_, r)| r.split_once('/'))
                .map_or(at, |(_, p)| p)
        })
        .collect();
    sites.join(" <- ")
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

        /// Launches per kernel, and the kernel name (part of it) whose launches are traced.
        struct Count {
            seen: Mutex<HashMap<&'static str, u64>>,
            trace: Option<String>,
        }

        impl LaunchObserver for Count {
            fn launched(&self, kernel: &'static str) {
                if self.trace.as_ref().is_some_and(|want| kernel.contains(want.as_str())) {
                    eprintln!("launch {kernel} from {}", call_sites());
                }
                let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
                *seen.entry(kernel).or_default() += 1;
            }
        }

        let trace = std::env::var(TRACE).ok().filter(|k| !k.is_empty());
        let count = Arc::new(Count { seen: Mutex::default(), trace });
        let watching = LaunchObservation::new(count.clone());
        let out = f();
        drop(watching);
        let seen = std::mem::take(&mut *count.seen.lock().unwrap_or_else(|e| e.into_inner()));
        let mut kinds: Vec<(&'static str, u64)> = seen.into_iter().collect();
        kinds.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        return (out, Some(kinds));
    }
    let _ = device;
    (f(), None)
}
