//! Will a run fit in memory? The search and the training estimate what their network needs
//! for the configured shape and batch before they build it, and a start that cannot fit is
//! refused with the estimate, what is available and the keys to lower, before any run folder
//! exists (rather than an allocation failure, which aborts, or the OOM killer).
//!
//! The estimates are calibrated on measured peaks (`qdarts bench search`, maximum RSS of
//! `qdarts train`) and err low, so that a refusal means the run cannot fit: a run estimated
//! to fit may still come close.

use qdarts_genotypes::Primitive;

use crate::RunError;

/// Memory the process itself takes besides the network: the binary, the data, buffers.
const OVERHEAD: u64 = 128 << 20;

/// What a run's network needs, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryNeed {
    /// Parameters with their gradients, optimizer state and working copies.
    pub parameters: u64,
    /// Activations kept for the backward pass at the configured batch.
    pub activations: u64,
}

impl MemoryNeed {
    /// Parameters, activations and the process's own overhead.
    pub fn total(&self) -> u64 {
        self.parameters.saturating_add(self.activations).saturating_add(OVERHEAD)
    }
}

/// Memory the process may still take, and which limit says so: the least of the machine's
/// available memory (`MemAvailable`), the address-space limit (`ulimit -v`) less what the
/// process maps now, and the cgroup's limit less its usage. `None` where none can be read.
pub fn available() -> Option<(u64, &'static str)> {
    let read = |p: &str| std::fs::read_to_string(p).ok();
    let mut best: Option<(u64, &'static str)> = None;
    let mut offer = |bytes: u64, source: &'static str| {
        if best.is_none_or(|(b, _)| bytes < b) {
            best = Some((bytes, source));
        }
    };
    let kib_field = |text: &str, key: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(key))?;
        line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|k| k << 10)
    };
    if let Some(avail) = read("/proc/meminfo").and_then(|t| kib_field(&t, "MemAvailable:")) {
        offer(avail, "the machine's available memory");
    }
    let limit = read("/proc/self/limits").and_then(|t| {
        let line = t.lines().find(|l| l.starts_with("Max address space"))?;
        line.split_whitespace().nth(3)?.parse::<u64>().ok()
    });
    let mapped = read("/proc/self/status").and_then(|t| kib_field(&t, "VmSize:"));
    if let (Some(limit), Some(mapped)) = (limit, mapped) {
        offer(limit.saturating_sub(mapped), "under the address-space limit, ulimit -v");
    }
    let cg = |f: &str| read(&format!("/sys/fs/cgroup/{f}"))?.trim().parse::<u64>().ok();
    if let (Some(max), Some(used)) = (cg("memory.max"), cg("memory.current")) {
        offer(max.saturating_sub(used), "under the cgroup's memory limit");
    }
    best
}

/// `bytes` in GiB with two decimals.
pub fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / f64::from(1u32 << 30))
}

/// Refuses a start on the CPU backend whose estimated need exceeds what is available: the
/// message gives both, what the estimate is made of, and the config keys (`keys`) that lower
/// it. On other devices nothing is checked (their memory is not read).
pub fn check_fits(
    device: &burn::tensor::Device,
    what: &str,
    need: MemoryNeed,
    keys: &str,
) -> Result<(), RunError> {
    if *device != burn::tensor::Device::flex() {
        return Ok(());
    }
    let Some((avail, source)) = available() else { return Ok(()) };
    if need.total() <= avail {
        return Ok(());
    }
    Err(RunError::Memory(format!(
        "{what} needs about {} ({} of parameters and optimizer state, {} of activations), \
         but only {} is free ({source}): lower {keys}",
        gib(need.total()),
        gib(need.parameters),
        gib(need.activations),
        gib(avail),
    )))
}

/// Weights of one candidate at `c` channels (skip_connect counted as the FactorizedReduce of a
/// reduction edge).
pub fn op_weights(p: Primitive, c: u64) -> u64 {
    let sep = |k: u64| 2 * (c * k * k + c * c);
    let dil = |k: u64| c * k * k + c * c;
    match p {
        Primitive::SepConv3x3 => sep(3),
        Primitive::SepConv5x5 => sep(5),
        Primitive::SepConv7x7 => sep(7),
        Primitive::DilConv3x3 => dil(3),
        Primitive::DilConv5x5 => dil(5),
        Primitive::Conv7x1_1x7 => 14 * c * c,
        Primitive::SkipConnect => c * c,
        Primitive::None | Primitive::MaxPool3x3 | Primitive::AvgPool3x3 => 0,
    }
}
