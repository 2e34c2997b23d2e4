//! A kill at a named step, for the tests of resuming: `QDARTS_TEST_KILL_AT=EPOCH:STEP` (the
//! epoch from 0, the step within it from 1, as a run's progress counts them) aborts the process
//! right after that step, as a kill would: no checkpoint, the lock and every row written so far
//! left behind. The tests of `--resume` stop a run there rather than after a sleep.

use std::sync::atomic::{AtomicU64, Ordering};

use qdarts_engine::Progress;

/// The environment variable.
pub const KILL_ENV: &str = "QDARTS_TEST_KILL_AT";

/// `(epoch << 32 | step) + 1` to abort after; 0: none.
static KILL_AT: AtomicU64 = AtomicU64::new(0);

/// Reads [`KILL_ENV`]; call it first in `main`. A malformed value is an error naming it.
pub fn from_env() -> anyhow::Result<()> {
    let Some(v) = std::env::var_os(KILL_ENV) else { return Ok(()) };
    let v = v.to_string_lossy().into_owned();
    let parsed =
        v.split_once(':').and_then(|(e, s)| Some((e.parse::<u32>().ok()?, s.parse::<u32>().ok()?)));
    let Some((epoch, step)) = parsed else {
        anyhow::bail!("{KILL_ENV}={v}: expected EPOCH:STEP, two integers");
    };
    KILL_AT.store(((u64::from(epoch) << 32) | u64::from(step)) + 1, Ordering::Relaxed);
    Ok(())
}

/// Aborts the process if `p` is the step [`KILL_ENV`] names.
pub fn check(p: &Progress) {
    let at = KILL_AT.load(Ordering::Relaxed);
    if at != 0 && ((p.epoch as u64) << 32 | p.step as u64) + 1 == at {
        std::process::abort();
    }
}
