//! The process allocator: mimalloc, wrapped to count live heap bytes and their peak.
//!
//! mimalloc keeps freed pages for reuse; the system allocator hands large tensor buffers back to
//! the kernel and faults them in again on the next step, which cost ~10% of a flex search step.
//! The counters give `qdarts bench` the peak host memory of a search step (on flex, all tensors
//! live on the host heap).
//!
//! mimalloc itself, by default, purges freed memory a second after it is freed (gives it back
//! to the kernel, which zeroes it again when it is touched next). A search step frees and
//! re-allocates gigabytes of activations and gradients each step, so with purging on, half of a
//! flex step went to the kernel zeroing pages (`perf`: 47 % of samples in `clear_page_erms`).
//! [`keep_freed_memory`] turns purging off: the process keeps its peak heap mapped and reuses it.
//!
//! An allocation that fails (the address-space limit of `ulimit -v`, a cgroup limit, a machine
//! without swap and overcommit off) would make Rust abort with a bare "memory allocation of N
//! bytes failed" and a core dump. The memory estimate refuses a shape that cannot fit before
//! the run starts, but it errs low by up to a quarter, and other processes take memory while a
//! run goes on. So a failed allocation ends the process here instead: one line on stderr that
//! says how much was asked for, at which step of the run ([`note_step`]), and what to lower,
//! and exit status 1. Nothing else runs after it (no destructor, no further write), so the run
//! folder is as a kill at that point leaves it: its last checkpoint resumes it.
#![allow(unsafe_code)] // a GlobalAlloc implementation is unsafe by definition

use std::alloc::{GlobalAlloc, Layout};
use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use mimalloc::MiMalloc;

/// mimalloc with live/peak byte counters.
#[derive(Debug)]
pub struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

#[global_allocator]
static GLOBAL: Counting = Counting;

fn grew(n: usize) {
    let now = LIVE.fetch_add(n, Ordering::Relaxed) + n;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every call forwards to mimalloc with the caller's layout and pointer unchanged; the
// counters are plain atomics and never touch the memory.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if injected(layout.size()) {
            return out_of_memory(layout.size());
        }
        // SAFETY: forwarded contract.
        let p = unsafe { MiMalloc.alloc(layout) };
        if p.is_null() {
            return out_of_memory(layout.size());
        }
        grew(layout.size());
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if injected(layout.size()) {
            return out_of_memory(layout.size());
        }
        // SAFETY: forwarded contract.
        let p = unsafe { MiMalloc.alloc_zeroed(layout) };
        if p.is_null() {
            return out_of_memory(layout.size());
        }
        grew(layout.size());
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded contract.
        unsafe { MiMalloc.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if injected(new_size) {
            return out_of_memory(new_size);
        }
        // SAFETY: forwarded contract.
        let p = unsafe { MiMalloc.realloc(ptr, layout, new_size) };
        if p.is_null() {
            return out_of_memory(new_size);
        }
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        grew(new_size);
        p
    }
}

/// Epoch (0-based), step within it (1-based) and steps per epoch of the last step the run
/// finished; `u32::MAX` epoch before the first.
static AT_EPOCH: AtomicU32 = AtomicU32::new(u32::MAX);
static AT_STEP: AtomicU32 = AtomicU32::new(0);
static AT_STEPS: AtomicU32 = AtomicU32::new(0);

/// Records that the run finished `step` of `steps` in `epoch` (0-based), for the message of a
/// later allocation failure.
pub fn note_step(epoch: usize, step: usize, steps: usize) {
    let clip = |v: usize| u32::try_from(v).unwrap_or(u32::MAX - 1);
    AT_STEP.store(clip(step), Ordering::Relaxed);
    AT_STEPS.store(clip(steps), Ordering::Relaxed);
    AT_EPOCH.store(clip(epoch), Ordering::Relaxed);
}

/// The environment variable that injects an allocation failure, for the tests of this path:
/// `EPOCH:STEP` (as [`note_step`] counts them) makes the first allocation of at least
/// [`INJECT_MIN_BYTES`] after that step fail, as the operating system's refusal would.
pub const INJECT_ENV: &str = "QDARTS_INJECT_ALLOC_FAILURE";

/// Allocations smaller than this are never failed by the injection (the tensors of the smallest
/// test network are larger).
pub const INJECT_MIN_BYTES: usize = 16 << 10;

/// `(epoch << 32 | step) + 1` after which allocations fail; 0: no injection.
static INJECT_AFTER: AtomicU64 = AtomicU64::new(0);

/// Reads [`INJECT_ENV`]; call it first in `main`. A malformed value is an error naming it.
pub fn inject_from_env() -> anyhow::Result<()> {
    if let Some((epoch, step)) = step_from_env(INJECT_ENV)? {
        INJECT_AFTER.store(position(epoch, step) + 1, Ordering::Relaxed);
    }
    Ok(())
}

/// The `EPOCH:STEP` the environment variable `name` gives, if it is set; a malformed value is
/// an error naming it.
pub fn step_from_env(name: &str) -> anyhow::Result<Option<(u32, u32)>> {
    let Some(v) = std::env::var_os(name) else { return Ok(None) };
    let v = v.to_string_lossy().into_owned();
    let parsed =
        v.split_once(':').and_then(|(e, s)| Some((e.parse::<u32>().ok()?, s.parse::<u32>().ok()?)));
    match parsed {
        Some(at) => Ok(Some(at)),
        None => anyhow::bail!("{name}={v}: expected EPOCH:STEP, two integers"),
    }
}

/// `(epoch << 32) | step`: one number per step, in the order a run takes them.
pub fn position(epoch: u32, step: u32) -> u64 {
    (u64::from(epoch) << 32) | u64::from(step)
}

/// Whether the injected failure applies to an allocation of `size` bytes now.
fn injected(size: usize) -> bool {
    let after = INJECT_AFTER.load(Ordering::Relaxed);
    if after == 0 || size < INJECT_MIN_BYTES {
        return false;
    }
    let epoch = AT_EPOCH.load(Ordering::Relaxed);
    epoch != u32::MAX && position(epoch, AT_STEP.load(Ordering::Relaxed)) + 1 >= after
}

/// Set by the first failure: a second one (the message's own write failing) returns null and
/// lets Rust abort.
static FAILED: AtomicBool = AtomicBool::new(false);

/// Ends the process after a failed allocation of `size` bytes with one line on stderr and exit
/// status 1 (see the module's notes); returns null only when already ending.
fn out_of_memory(size: usize) -> *mut u8 {
    if FAILED.swap(true, Ordering::SeqCst) {
        return std::ptr::null_mut();
    }
    let mut line = StackLine::default();
    let _ = write!(
        line,
        "qdarts: error: out of memory: an allocation of {:.1} MiB failed ",
        size as f64 / f64::from(1u32 << 20)
    );
    let epoch = AT_EPOCH.load(Ordering::Relaxed);
    let live = LIVE.load(Ordering::Relaxed) >> 20;
    if epoch == u32::MAX {
        let _ = write!(line, "before the first step ended ({live} MiB live)");
    } else {
        let (step, steps) = (AT_STEP.load(Ordering::Relaxed), AT_STEPS.load(Ordering::Relaxed));
        let _ = write!(
            line,
            "in epoch {} after step {step} of {steps} ({live} MiB live); the run folder is as \
             its last checkpoint left it, and --resume continues from there",
            u64::from(epoch) + 1
        );
    }
    let _ = writeln!(
        line,
        "; free memory, or lower the batch size or the model's size (init_channels, layers, \
         nodes)"
    );
    let _ = std::io::stderr().write_all(line.bytes());
    std::process::exit(1)
}

/// A line formatted without allocating (the allocator is what failed).
struct StackLine {
    buf: [u8; 512],
    len: usize,
}

impl Default for StackLine {
    fn default() -> Self {
        StackLine { buf: [0; 512], len: 0 }
    }
}

impl StackLine {
    fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl std::fmt::Write for StackLine {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let n = s.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

/// mimalloc's `mi_option_purge_delay` (`include/mimalloc.h` of the libmimalloc-sys the lockfile
/// pins, v3: the 16th option); -1 is "never purge".
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Never give freed memory back to the kernel (see the module's notes); call it first in `main`.
pub fn keep_freed_memory() {
    // SAFETY: sets one integer option of the allocator; any value is valid for this option.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
}

/// mimalloc's current purge delay in milliseconds (-1: never).
#[cfg(test)]
fn purge_delay() -> std::ffi::c_long {
    // SAFETY: reads one integer option of the allocator.
    unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) }
}

/// Restarts the peak at the current live size; returns that size.
pub fn reset_peak() -> usize {
    let now = LIVE.load(Ordering::Relaxed);
    PEAK.store(now, Ordering::Relaxed);
    now
}

/// The largest live size since the last [`reset_peak`].
pub fn peak_bytes() -> usize {
    PEAK.load(Ordering::Relaxed)
}

/// The process's peak resident set size so far (`VmHWM` in `/proc/self/status`), where the
/// system reports one: the measure a Python process gives of itself with `ru_maxrss`, so the
/// two compare like for like. It counts what the heap counters leave out (the binary, its
/// libraries, freed pages the allocator keeps mapped).
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib = status.lines().find_map(|l| l.strip_prefix("VmHWM:"))?;
    kib.trim().strip_suffix("kB")?.trim().parse::<u64>().ok().map(|k| k * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peak_rss_counts_memory_that_was_touched() {
        let Some(before) = peak_rss_bytes() else {
            eprintln!("skipped: no /proc/self/status VmHWM here");
            return;
        };
        let mb = 256usize << 20;
        let mut v = vec![0u8; mb];
        for i in (0..mb).step_by(4096) {
            v[i] = (i % 251) as u8 + 1;
        }
        std::hint::black_box(&v);
        let after = peak_rss_bytes().expect("VmHWM read once, so again");
        assert!(
            after >= before && after >= mb as u64,
            "peak RSS {after} after touching {mb} bytes"
        );
    }

    #[test]
    fn the_option_set_is_mimallocs_purge_delay_and_it_is_turned_off() {
        // Option 15 holds the pinned mimalloc's default purge delay, 1000 ms (`src/options.c`;
        // unless the environment overrides it), until `keep_freed_memory` sets "never".
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            assert_eq!(purge_delay(), 1000, "option {MI_OPTION_PURGE_DELAY} is not purge_delay");
        }
        keep_freed_memory();
        assert_eq!(purge_delay(), -1);
    }
}
