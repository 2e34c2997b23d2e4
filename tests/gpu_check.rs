//! `scripts/gpu_check.sh` where there is no GPU: its arguments and, as `--dry-run` prints
//! them, the commands it would run (the GPU machine runs the same script for real).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn gpu_check(args: &[&str]) -> Output {
    Command::new("bash")
        .arg(root().join("scripts/gpu_check.sh"))
        .args(args)
        .current_dir(root())
        // No GPU, whatever the machine: nvidia-smi is not on this PATH.
        .env("PATH", "/usr/bin:/bin")
        .output()
        .expect("bash runs")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// An artefacts folder with a stand-in binary: a dry run only checks that it is there.
fn artefacts(dir: &Path) -> String {
    std::fs::create_dir_all(dir).expect("temp folder");
    let bin = dir.join("qdarts");
    std::fs::write(&bin, "#!/bin/sh\nexit 0\n").expect("stand-in binary");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    dir.to_str().expect("utf-8 path").to_string()
}

#[test]
fn bad_arguments_exit_2_naming_the_argument() {
    let dir = std::env::temp_dir().join(format!("qdarts-gpu-check-args-{}", std::process::id()));
    let a = artefacts(&dir);
    for (args, says) in [
        (vec!["--rounds", "0"], "--rounds must be a positive integer"),
        (vec!["--step-timeout", "x"], "--step-timeout must be a positive integer"),
        (vec!["--skip", "tests,warp"], "--skip: 'warp' is none of"),
        (vec!["--backends", "cuda,rocm"], "--backends: 'rocm' is none of"),
        (vec!["--layers", "2"], "--layers must be at least 3"),
        (vec!["--frobnicate"], "unknown argument '--frobnicate'"),
        (vec!["--reps"], "--reps needs a value"),
    ] {
        let mut all = vec!["--artefacts", a.as_str()];
        all.extend(&args);
        let o = gpu_check(&all);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(text(&o).contains(says), "{args:?}: {}", text(&o));
    }
    let o = gpu_check(&["--artefacts", "/nonexistent/qdarts-artefacts"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("/nonexistent/qdarts-artefacts: no such folder"), "{}", text(&o));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_dry_run_interleaves_pytorch_and_each_backend_round_by_round() {
    let dir = std::env::temp_dir().join(format!("qdarts-gpu-check-dry-{}", std::process::id()));
    let a = artefacts(&dir);
    let o = gpu_check(&[
        "--artefacts",
        &a,
        "--dry-run",
        "--rounds",
        "2",
        "--backends",
        "cuda,wgpu",
        "--skip",
        "search,quant",
        "--out",
        "/tmp/qdarts-gpu-check-dry",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let lines: Vec<String> = text(&o).lines().map(str::to_string).collect();
    let order: Vec<&str> = lines
        .iter()
        .filter_map(|l| {
            if l.contains("torch_reference.py bench") {
                Some("torch")
            } else if l.contains("--backend wgpu bench search") {
                Some("wgpu")
            } else {
                None
            }
        })
        .collect();
    // Without a GPU, cuda is only checked to refuse; each round: PyTorch's four cases, then wgpu.
    let round = ["torch", "torch", "torch", "torch", "wgpu"];
    assert_eq!(order, [round, round].concat(), "{}", text(&o));
    assert!(lines.iter().any(|l| l.contains("--backend cuda parity")), "{}", text(&o));
    assert!(lines.iter().any(|l| l.contains("--csv /tmp/qdarts-gpu-check-dry/step-wgpu-r2.csv")));
    assert!(!lines.iter().any(|l| l.contains(" search --set")), "search was skipped");
    assert!(!lines.iter().any(|l| l.contains("bench quant")), "quant was skipped");
    std::fs::remove_dir_all(&dir).ok();
}
