//! The cuda backend (built with `--features cuda`, kernels through NVRTC: vendor/README.md).
//! Where no NVIDIA GPU can be used (CI), `--backend cuda` must refuse cleanly: exit code 1, the
//! missing driver named, no panic, no run folder. Where one can, a short search runs on it.

#![cfg(feature = "cuda")]
// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use std::process::Command;

/// Whether this machine has an NVIDIA GPU that its driver answers for.
fn nvidia_gpu() -> bool {
    Command::new("nvidia-smi").arg("-L").output().is_ok_and(|o| o.status.success())
}

#[test]
fn cuda_runs_a_search_or_refuses_cleanly() {
    let dir = std::env::temp_dir().join(format!("qdarts-cuda-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let results = format!("record.results_dir=\"{}\"", dir.display());
    let out = Command::new(env!("CARGO_BIN_EXE_qdarts"))
        .args(["--backend", "cuda", "search", "--set", "search.epochs=1"])
        .args(["--set", "data.limit=128", "--set", &results])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    if nvidia_gpu() {
        assert!(out.status.success(), "{stderr}");
        let run = std::fs::read_dir(&dir).unwrap().next().unwrap().unwrap().path();
        let genotype = std::fs::read_to_string(run.join("genotype.txt")).unwrap();
        assert!(genotype.starts_with("Genotype(normal="), "{genotype}");
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("the cuda backend could not start"), "{stderr}");
        assert!(stderr.contains("NVIDIA GPU and its driver"), "{stderr}");
        assert!(!dir.exists(), "a run folder was made for a backend that never started");
    }
}

#[test]
fn a_device_the_backend_cannot_use_is_refused() {
    for (args, want) in [
        (&["--backend", "cuda", "--device", "cpu"][..], "it takes `cuda:N`"),
        (&["--backend", "cuda", "--device", "cuda:x"], "expected `cpu`, `cuda` or `cuda:N`"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_qdarts"))
            .args(args)
            .args(["bench", "quant"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(want), "{stderr}");
    }
}
