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
#![allow(unsafe_code)] // a GlobalAlloc implementation is unsafe by definition

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicUsize, Ordering};

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
        // SAFETY: forwarded contract.
        let p = unsafe { MiMalloc.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded contract.
        let p = unsafe { MiMalloc.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded contract.
        unsafe { MiMalloc.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded contract.
        let p = unsafe { MiMalloc.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            grew(new_size);
        }
        p
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

#[cfg(test)]
mod tests {
    use super::*;

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
