//! The timing harness of the benchmarks: repetitions after a warm-up with median, min and max,
//! forcing lazy backends to finish, the peak memory of a step, and CSV output.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;
use burn::tensor::{Device, Tensor};
use serde::Serialize;

/// Median, min and max seconds of timed runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    /// Median.
    pub median: f64,
    /// Fastest.
    pub min: f64,
    /// Slowest.
    pub max: f64,
}

impl Timing {
    /// The timing of the runs `seconds` (at least one).
    pub fn of(mut seconds: Vec<f64>) -> Self {
        seconds.sort_by(f64::total_cmp);
        Timing {
            median: seconds[seconds.len() / 2],
            min: seconds[0],
            max: seconds[seconds.len() - 1],
        }
    }
}

/// Runs `f` once untimed, then `reps` times timed.
pub fn time_reps(reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<Timing> {
    f()?; // warm-up
    let mut t = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = Instant::now();
        f()?;
        t.push(start.elapsed().as_secs_f64());
    }
    Ok(Timing::of(t))
}

/// Forces the lazy work of a result to finish (a one-element read back).
pub fn settle(t: Tensor<4>) -> f32 {
    t.slice([0..1, 0..1, 0..1, 0..1]).into_scalar::<f32>()
}

/// Peak memory of a step: on flex, the largest live host heap during the step (all tensors
/// live there); elsewhere, the bytes the device's memory pool holds after the step (the pool
/// grows to the peak and keeps its pages), when the backend reports it. LibTorch allocates
/// with its own allocators, which neither counter sees: nothing is reported there.
#[derive(Debug)]
pub struct MemProbe {
    host: bool,
    unknown: bool,
}

impl MemProbe {
    /// Starts measuring.
    pub fn start(device: &Device) -> Self {
        let unknown = crate::backend::allocates_outside_rust(device);
        let host = !unknown && device.memory_pool_usage().is_none();
        if host {
            crate::alloc::reset_peak();
        }
        MemProbe { host, unknown }
    }

    /// The peak since [`MemProbe::start`], when known.
    pub fn finish(self, device: &Device) -> Option<u64> {
        if self.unknown {
            None
        } else if self.host {
            Some(crate::alloc::peak_bytes() as u64)
        } else {
            device.memory_pool_usage().map(|u| u.bytes_reserved)
        }
    }
}

/// Runs `f` while another thread reads what the device's memory pool holds
/// (`bytes_reserved`) every millisecond; returns `f`'s result and the most read, or `None`
/// where the device has no pool. A sample, not a high-water mark: a peak held for less than
/// a millisecond can be missed (a supernet's peak, its activations at the end of the forward
/// pass, falls only as the backward pass frees them).
pub fn sampled_pool_peak<R>(device: &Device, f: impl FnOnce() -> R) -> (R, Option<u64>) {
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let sampler = scope.spawn(|| {
            let mut most = None::<u64>;
            loop {
                let done = stop.load(Ordering::Acquire);
                if let Some(u) = device.memory_pool_usage() {
                    most = most.max(Some(u.bytes_reserved));
                }
                if done {
                    return most;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        let out = f();
        stop.store(true, Ordering::Release);
        (out, sampler.join().unwrap_or(None))
    })
}

/// Writes one CSV row per record, the header from the record's field names (`None`: an
/// empty field; a text with a comma or a quote is quoted), synced to disk.
pub fn write_csv<R: Serialize>(path: &Path, rows: impl IntoIterator<Item = R>) -> Result<()> {
    let mut w = csv::Writer::from_path(path)?;
    for row in rows {
        w.serialize(row)?;
    }
    let f = w.into_inner().map_err(|e| e.into_error())?;
    f.sync_all()?;
    Ok(())
}
