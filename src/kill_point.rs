//! A kill at a named step, for the tests of resuming: `QDARTS_TEST_KILL_AT=EPOCH:STEP` (the
//! epoch from 0, the step within it from 1, as a run's progress counts them) aborts the process
//! right after that step, as a kill would: no checkpoint, the lock and every row written so far
//! left behind. The tests of `--resume` stop a run there rather than after a sleep.

use std::sync::atomic::{AtomicU64, Ordering};

use qdarts_engine::Progress;

use crate::alloc;

/// The environment variable.
pub const KILL_ENV: &str = "QDARTS_TEST_KILL_AT";

/// [`alloc::position`] of the step to abort after, plus one; 0: none.
static KILL_AT: AtomicU64 = AtomicU64::new(0);

/// Reads [`KILL_ENV`]; call it first in `main`. A malformed value is an error naming it.
pub fn from_env() -> anyhow::Result<()> {
    if let Some((epoch, step)) = alloc::step_from_env(KILL_ENV)? {
        KILL_AT.store(alloc::position(epoch, step) + 1, Ordering::Relaxed);
    }
    Ok(())
}

/// Aborts the process if `p` is the step [`KILL_ENV`] names.
pub fn check(p: &Progress) {
    let clip = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
    let at = KILL_AT.load(Ordering::Relaxed);
    if at != 0 && alloc::position(clip(p.epoch), clip(p.step)) + 1 == at {
        std::process::abort();
    }
}
