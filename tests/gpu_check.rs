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

/// `gpu_check.sh --artefacts <a stand-in> --dry-run ARGS --out /tmp/qdarts-gpu-check-TAG`, which
/// must exit 0: what it prints.
fn dry_run(tag: &str, args: &[&str]) -> String {
    let dir = qdarts_record::scratch::scratch_path(&format!("gpu-check-{tag}"));
    let a = artefacts(&dir);
    let out = format!("/tmp/qdarts-gpu-check-{tag}");
    let mut all = vec!["--artefacts", a.as_str(), "--dry-run"];
    all.extend_from_slice(args);
    all.extend(["--out", out.as_str()]);
    let o = gpu_check(&all);
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    text(&o)
}

#[test]
fn bad_arguments_exit_2_naming_the_argument() {
    let dir = qdarts_record::scratch::scratch_path("gpu-check-args");
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
    let t = dry_run("dry", &["--rounds", "2", "--backends", "cuda,wgpu", "--skip", "search,quant"]);
    let lines: Vec<String> = t.lines().map(str::to_string).collect();
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
    assert_eq!(order, [round, round].concat(), "{t}");
    assert!(lines.iter().any(|l| l.contains("--backend cuda parity")), "{t}");
    assert!(lines.iter().any(|l| l.contains("--csv /tmp/qdarts-gpu-check-dry/step-wgpu-r2.csv")));
    assert!(!lines.iter().any(|l| l.contains(" search --set")), "search was skipped");
    assert!(!lines.iter().any(|l| l.contains("bench quant")), "quant was skipped");
}

#[test]
fn a_dry_run_with_adaptive_times_the_default_pools_beside_exclusive_pages() {
    let t = dry_run(
        "pools",
        &[
            "--adaptive",
            "--rounds",
            "2",
            "--backends",
            "wgpu,tch",
            "--skip",
            "tests,parity,search,quant,torch",
        ],
    );
    let steps: Vec<String> = t
        .lines()
        .filter(|l| l.contains("bench search --shape darts"))
        .map(|l| l.trim_end().to_string())
        .collect();
    // Each round: wgpu with the binary's pools, then with CubeCL's default; tch has no CubeCL
    // pools to choose (and no tch binary here).
    assert_eq!(steps.len(), 4, "{t}");
    for (k, l) in steps.iter().enumerate() {
        let (round, adaptive) = (k / 2 + 1, k % 2 == 1);
        assert_eq!(l.contains("--backend wgpu --memory-pools adaptive bench"), adaptive, "{l}");
        let csv = if adaptive { "wgpu-adaptive" } else { "wgpu" };
        let want = format!("--csv /tmp/qdarts-gpu-check-pools/step-{csv}-r{round}.csv");
        assert!(l.ends_with(&want), "{l}");
    }
}

#[test]
fn a_dry_run_with_kernels_profiles_a_float_and_a_tensorrt_step_in_folders_of_their_own() {
    let t = dry_run(
        "kern",
        &["--kernels", "--backends", "wgpu", "--skip", "tests,parity,search,quant,step,torch"],
    );
    let profiled: Vec<&str> =
        t.lines().map(str::trim_end).filter(|l| l.contains("bench search")).collect();
    assert_eq!(profiled.len(), 2, "{t}");
    for (p, quant) in profiled.iter().zip(["float", "tensorrt"]) {
        let folder = format!("env -C /tmp/qdarts-gpu-check-kern/kernels-wgpu-{quant} ");
        assert!(p.starts_with(&folder), "{p}");
        let step = format!(
            "--backend wgpu bench search --shape default --order first --quant {quant} --reps 1 --warmup 1"
        );
        assert!(p.ends_with(&step), "{p}");
    }
}

/// With `--waves`, the batched cell is timed in every case the check times (tensorrt too) and,
/// with `--kernels`, profiled beside the cells edge by edge.
#[test]
fn a_dry_run_with_waves_times_and_profiles_the_cells_in_waves_too() {
    // A dry run of the waves on wgpu, one round, only the step and the profile: the printed
    // commands that contain `what`.
    let commands = |tag: &str, extra: &[&str], what: &str| -> Vec<String> {
        let mut args = vec!["--waves", "--backends", "wgpu", "--rounds", "1"];
        args.extend_from_slice(&["--skip", "tests,parity,search,quant,torch"]);
        args.extend_from_slice(extra);
        let t = dry_run(tag, &args);
        t.lines().map(str::trim_end).filter(|l| l.contains(what)).map(str::to_string).collect()
    };
    let timed = commands("waves", &[], "bench search --shape darts");
    assert_eq!(timed.len(), 2, "{timed:?}");
    assert!(!timed[0].contains("--batched-cells"), "{}", timed[0]);
    assert!(timed[1].contains("--batched-cells"), "{}", timed[1]);
    assert!(!timed[1].contains("--quant"), "every case the check times: {}", timed[1]);
    let profiled = commands("waves-k", &["--kernels"], "bench search --shape default");
    assert_eq!(profiled.len(), 4, "{profiled:?}");
    for (p, (form, quant)) in profiled.iter().zip([
        ("wgpu", "float"),
        ("wgpu-waves", "float"),
        ("wgpu", "tensorrt"),
        ("wgpu-waves", "tensorrt"),
    ]) {
        let folder = format!("env -C /tmp/qdarts-gpu-check-waves-k/kernels-{form}-{quant} ");
        assert!(p.starts_with(&folder), "{p}");
        assert_eq!(p.contains("--batched-cells"), form.ends_with("waves"), "{p}");
    }
    let timed = commands("waves-q", &["--quant", "tensorrt"], "bench search --shape darts");
    assert_eq!(timed.len(), 2, "{timed:?}");
    assert!(timed[1].contains("--quant tensorrt --batched-cells"), "{}", timed[1]);
}

/// `scripts/cubecl_profile.py` on a log written in CubeCL 0.11's formats at the "full" level
/// (cubecl-runtime's `logging/server.rs` per launch: `| {duration:<10?} | {name}: {id}
/// CubeCount {count:?}`, the kernel id's Display spanning lines; `logging/profiling.rs` for the
/// summary tables, whose name cells span lines too): launches summed per kernel, the summaries
/// (which repeat them) and unmeasured launches left out, `--drop-first` dropping the first
/// steps' launches and `--last` keeping the last launches. Skipped without python3.
#[test]
fn the_kernel_profile_sums_launches_per_kernel_and_skips_the_summaries() {
    if Command::new("python3").arg("--version").output().is_err() {
        qdarts_record::scratch::tool_missing("there is no python3");
        return;
    }
    let dir = qdarts_record::scratch::scratch("kernel-profile");
    let log = dir.join("kernels.log");
    let id = |name: &str, x: u32| {
        format!(
            "{name}: {name}Info {{\n    n: 1,\n    dtype: Float (\n        F32,\n    ),\n}} CubeCount ({x}, 2, 1)"
        )
    };
    let launch = |t: &str, name: &str, x: u32| format!("| {t:<10} | {}", id(name, x));
    let lines = [
        launch("1.5ms", "reduce_kernel_f32", 4),
        launch("500µs", "reduce_kernel_f32", 2),
        launch("300µs", "conv2d_im2col", 1024),
        launch("not measured", "conv2d_im2col", 1024),
        "|⎺⎺⎺⎺⎺⎺⎺⎺⎺⎺⎺⎺⎺⎺⎺⎺⎺⎺⎺⎺⎺⎺⎺⎺⎺⎺⎺⎺⎺⎺⎺⎺⎺⎺⎺⎺⎺⎺| ".to_string(),
        "| Name | Duration | Num Computed | Ratio |".to_string(),
        format!("| {} | 2ms      | 2            | 88 %  |", id("reduce_kernel_f32", 4)),
        "| Total             | 2.25ms   | 3            | 100 % |".to_string(),
        launch("1s", "matmul", 16),
    ];
    std::fs::write(&log, lines.join("\n") + "\n").expect("log");
    let profile = |args: &[&str]| {
        Command::new("python3")
            .arg(root().join("scripts/cubecl_profile.py"))
            .arg(&log)
            .args(args)
            .output()
            .expect("python3 runs")
    };
    let csv = dir.join("k.csv");
    let o = profile(&["--steps", "2", "--csv", csv.to_str().expect("utf-8 path")]);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(out.starts_with("4 launches of 3 kernels, 1002.3 ms of kernel time"), "{out}");
    assert!(out.contains("per step (over 2 steps): 501.1 ms, 2 launches"), "{out}");
    let rows = std::fs::read_to_string(&csv).expect("csv");
    let rows: Vec<&str> = rows.lines().collect();
    assert_eq!(rows[0], "kernel,launches,total_s,share,mean_s,max_s,min_cubes");
    assert_eq!(rows[1], "matmul,1,1.000000000,0.997705,1.000000000,1.000000000,32");
    assert_eq!(rows[2], "reduce_kernel_f32,2,0.002000000,0.001995,0.001000000,0.001500000,4");
    assert_eq!(rows[3], "conv2d_im2col,1,0.000300000,0.000299,0.000300000,0.000300000,2048");
    assert_eq!(rows.len(), 4);

    // The last of two steps: the second half of the four launches.
    let o = profile(&["--steps", "2", "--drop-first", "1"]);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(out.starts_with("2 launches of 2 kernels, 1000.3 ms of kernel time"), "{out}");
    assert!(out.contains("per step (over 1 step): 1000.3 ms, 2 launches"), "{out}");

    let o = profile(&["--drop-first", "1"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--drop-first K needs --steps N"), "{}", text(&o));

    // The last two launches (the unmeasured one is not a launch it counts).
    let o = profile(&["--last", "2"]);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(out.starts_with("2 launches of 2 kernels, 1000.3 ms of kernel time"), "{out}");
    let o = profile(&["--last", "5"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("4 launches, fewer than --last 5"), "{}", text(&o));
    let o = profile(&["--last", "2", "--steps", "2"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--last N needs N of at least 1, and no --steps"), "{}", text(&o));

    std::fs::write(&log, "no timings here\n").expect("log");
    let o = profile(&[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("no kernel timings"), "{}", text(&o));
    std::fs::remove_dir_all(&dir).ok();
}

/// `scripts/gpu_build.sh` refuses bad arguments before it builds or writes anything.
#[test]
fn gpu_build_refuses_bad_arguments_before_building() {
    let dir = qdarts_record::scratch::scratch_path("gpu-build-args");
    let out = dir.join("artefacts");
    let out = out.to_str().expect("utf-8 path");
    for (args, says) in [
        (vec!["--tests", "golden,nope"], "--tests: 'nope' is none of golden fused"),
        (vec!["--tests"], "--tests needs a list"),
        (vec!["--tests-only", "--no-tests"], "leaves nothing to build"),
        (vec!["--frobnicate"], "unknown argument '--frobnicate'"),
    ] {
        let o = Command::new("bash")
            .arg(root().join("scripts/gpu_build.sh"))
            .args(["--out", out])
            .args(&args)
            .current_dir(root())
            .output()
            .expect("bash runs");
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(text(&o).contains(says), "{args:?}: {}", text(&o));
        assert!(!Path::new(out).exists(), "{args:?} made {out}");
    }
}
