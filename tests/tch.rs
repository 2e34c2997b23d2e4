//! The tch backend (LibTorch) end to end, built with `--features tch` against the PyTorch that
//! `scripts/setup_torch.sh` installs: the search step against the PyTorch reference's
//! fixtures, a one-epoch default search on LibTorch's CPU device, and a clear error where
//! LibTorch's CUDA device is asked for without a GPU. CI runs them on the CPU.

#![cfg(feature = "tch")]
// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use std::process::Command;
use std::sync::{Mutex, MutexGuard, PoisonError};

mod common;
use common::one_epoch_search;

fn qdarts() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_qdarts"));
    c.current_dir(env!("CARGO_MANIFEST_DIR"));
    c
}

/// One LibTorch process at a time: two at once on a small machine make LibTorch's OpenMP
/// threads spin against each other (a 3 s step took 179 s on 2 cores).
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(PoisonError::into_inner)
}

#[test]
fn the_search_step_matches_pytorch_on_tch() {
    let _one = one_at_a_time();
    let out = qdarts().args(["--backend", "tch", "parity"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("2 fixture(s) within bounds on tch-cpu"), "{stdout}");
    assert!(!stdout.contains("FAILED"), "{stdout}");
}

#[test]
fn a_default_search_epoch_runs_on_tch() {
    let _one = one_at_a_time();
    // The default's 1280 images, half for the weights: 20 steps of 32, then one validation row.
    let (run, top1) = one_epoch_search("tch", &["--backend", "tch"], &[], 20);
    // One epoch on 640 images learns something: well above the 10 % of chance.
    assert!(top1 > 0.2, "top-1 {top1}");
    assert!(run.join("checkpoint").is_dir());
    let _ = std::fs::remove_dir_all(run.parent().unwrap());
}

/// LibTorch's CUDA device on a machine without an NVIDIA GPU (or with `CUDA_VISIBLE_DEVICES`
/// hiding it): exit code 1, a message naming the missing driver, no run folder, no abort.
#[test]
fn tch_cuda_without_a_gpu_is_a_clear_error() {
    let _one = one_at_a_time();
    let dir = qdarts_record::scratch::scratch_path("tch-none");
    let results = format!("record.results_dir=\"{}\"", dir.display());
    let out = qdarts()
        .args(["--backend", "tch", "--device", "cuda:0", "search", "--set", &results])
        .env("CUDA_VISIBLE_DEVICES", "")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("the tch backend could not start on cuda:0"), "{stderr}");
    assert!(stderr.contains("libcuda.so"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!dir.exists(), "a run folder was made for a device that never started");
}
