//! The `qdarts` binary as a user runs it: help, bad input, and a search and a training killed
//! mid-run (aborted at a named step) and resumed, which must end with the same genotype and
//! metrics as an uninterrupted run, with no torn CSV rows.

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

mod common;

use common::{qdarts, tiny_search, write_config};

fn scratch(name: &str) -> PathBuf {
    common::scratch("cli", name)
}

fn config(dir: &Path) -> PathBuf {
    write_config(dir, "tiny.toml", &tiny_search("tiny", 11, 6))
}

fn only_run(dir: &Path) -> PathBuf {
    let runs: Vec<PathBuf> =
        std::fs::read_dir(dir.join("results")).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(runs.len(), 1, "{runs:?}");
    runs[0].clone()
}

fn without_time(csv: &str) -> Vec<String> {
    csv.lines()
        .map(|l| l.rsplit_once(',').map(|(a, _)| a.to_string()).unwrap_or_default())
        .collect()
}

#[test]
fn help_lists_every_subcommand() {
    let out = qdarts().arg("--help").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for cmd in ["search", "train", "freeze", "export", "eval", "dashboard", "bench"] {
        assert!(text.contains(cmd), "{cmd} missing from --help:\n{text}");
    }
}

/// `QDARTS_CUDA_SOURCES` needs the CUDA C++ compiler of a `cuda` build: without one, a clear
/// error before anything runs (with one, `tests/cuda.rs`).
#[cfg(not(feature = "cuda"))]
#[test]
fn cuda_sources_without_a_cuda_build_is_a_clear_error() {
    let dir = scratch("cuda-sources");
    let out = qdarts().env("QDARTS_CUDA_SOURCES", dir.join("cu")).args(["bench", "quant"]).output();
    let out = out.unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("QDARTS_CUDA_SOURCES") && err.contains("--features cuda"), "{err}");
    assert!(!dir.join("cu").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_input_is_a_clear_error_and_a_nonzero_exit() {
    let dir = scratch("bad");
    let p = dir.join("bad.toml");
    std::fs::write(&p, "name = \"x\"\n[data]\ndataset = \"imagenet\"\n").unwrap();
    let out = qdarts().args(["search", "--config"]).arg(&p).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.toml") && err.contains("imagenet"), "{err}");
    let out = qdarts().args(["search", "--config", "/nonexistent.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent.toml"));
    let out = qdarts().args(["search", "--resume", "/nonexistent-run"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let out = qdarts().args(["--backend", "cuda", "bench", "quant"]).output().unwrap();
    assert_ne!(out.status.code(), Some(0));
    let out = qdarts().args(["search", "--frobnicate"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    // The dashboard: a missing run folder, a folder that is not a run, no terminal.
    let out = qdarts().args(["dashboard", "/nonexistent-run"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent-run") && err.contains("no such run folder"), "{err}");
    let out = qdarts().arg("dashboard").arg(&dir).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a qdarts run folder"));
    std::fs::write(dir.join("config.toml"), "").unwrap();
    let out = qdarts().arg("dashboard").arg(&dir).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs a terminal"));
    let out =
        qdarts().args(["search", "--dashboard", "--set", "search.epochs=0"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let out = qdarts().args(["dashboard", "x", "--refresh-ms", "0"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// Run outside the checkout without `--config`, `search` and `train` say where they looked for
/// their default config and how to give one, exit 1, and write no results folder.
#[test]
fn a_missing_default_config_names_the_folder_and_the_flag() {
    let dir = scratch("no-default-config");
    for (cmd, file) in
        [("search", "experiments/default.toml"), ("train", "experiments/train-default.toml")]
    {
        let out = qdarts().current_dir(&dir).arg(cmd).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{cmd}: {err}");
        assert!(err.contains(file) && err.contains("--config FILE"), "{cmd}: {err}");
        // The folder as the process sees it: a temp folder behind a symbolic link reads resolved.
        let seen = dir.canonicalize().unwrap();
        assert!(err.contains(&seen.display().to_string()), "{cmd}: {err}");
    }
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "nothing written in {dir:?}");
}

/// Values from the command line reach the config as TOML strings, whatever they hold: a quote
/// and a newline in `--data` cannot add a key, and the error names the path (`--dataset` is
/// one of three names). A `record.results_dir` that is a file says so.
#[test]
fn command_line_values_cannot_inject_config_and_a_file_is_no_results_folder() {
    let dir = scratch("inject");
    let cfg = config(&dir);
    let out = qdarts()
        .args(["search", "--config"])
        .arg(&cfg)
        .args(["--dataset", "mnist\"\nseed = 9\nx = \"1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("possible values: fashion-mnist, mnist, cifar10"), "{err}");
    let out = qdarts()
        .args(["search", "--config"])
        .arg(&cfg)
        .args(["--dataset", "mnist", "--data", "/no/such\"\nseed = 9"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("/no/such\"\nseed = 9"), "{err}");
    assert!(!dir.join("results").exists());

    std::fs::write(dir.join("taken"), "").unwrap();
    let out = qdarts()
        .args(["search", "--config"])
        .arg(&cfg)
        .arg("--set")
        .arg(format!("record.results_dir={}", dir.join("taken").display()))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("the results folder (record.results_dir) is a file"), "{err}");
}

/// Runs `qdarts <sub> --config <cfg>` twice, each in a fresh folder: once to the end, and once
/// killed in its second epoch, after that epoch's first step (`QDARTS_TEST_KILL_AT=1:1`: the
/// process aborts there, leaving its lock and files as a kill would), then continued with
/// `--resume`. Returns the two run folders.
fn uninterrupted_and_resumed(
    sub: &str,
    name: &str,
    write_config: fn(&Path) -> PathBuf,
) -> [PathBuf; 2] {
    // Uninterrupted.
    let a = scratch(&format!("{name}-uninterrupted"));
    let out = qdarts().args([sub, "--config"]).arg(write_config(&a)).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let run_a = only_run(&a);

    // Killed at a named step, then resumed.
    let b = scratch(&format!("{name}-killed"));
    let out = qdarts()
        .env("QDARTS_TEST_KILL_AT", "1:1")
        .args([sub, "--config"])
        .arg(write_config(&b))
        .output()
        .unwrap();
    assert!(!out.status.success(), "the {sub} run was not killed");
    let run_b = only_run(&b);
    assert!(run_b.join("lock").exists(), "a killed run leaves its lock");

    let out = qdarts().args([sub, "--resume"]).arg(&run_b).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    [run_a, run_b]
}

/// `files` are identical in both runs, and so is `metrics.csv` but for its time column.
fn assert_same_record(run_a: &Path, run_b: &Path, files: &[&str]) {
    let read = |run: &Path, f: &str| std::fs::read_to_string(run.join(f)).unwrap();
    for f in files {
        assert_eq!(read(run_a, f), read(run_b, f), "{f} differs after resume");
    }
    let (ma, mb) = (read(run_a, "metrics.csv"), read(run_b, "metrics.csv"));
    assert_eq!(without_time(&ma), without_time(&mb), "metrics differ after resume");
}

/// Every row of the run's CSV files is whole (as many fields as the header).
fn assert_no_torn_rows(run: &Path, files: &[&str]) {
    for f in files {
        let text = std::fs::read_to_string(run.join(f)).unwrap();
        let fields = text.lines().next().unwrap().split(',').count();
        assert!(text.ends_with('\n'));
        for line in text.lines() {
            if !line.contains('"') {
                assert_eq!(line.split(',').count(), fields, "torn row in {f}: {line}");
            }
        }
    }
}

#[test]
fn a_killed_search_resumes_to_the_same_genotype_and_metrics() {
    let [run_a, run_b] = uninterrupted_and_resumed("search", "search", config);
    let files = [
        "genotype.txt",
        "genotype.json",
        "alphas.csv",
        "genotypes.csv",
        "nan_events.csv",
        "quant_error.csv",
    ];
    assert_same_record(&run_a, &run_b, &files);
    assert_no_torn_rows(&run_b, &["metrics.csv", "quant_error.csv", "alphas.csv"]);
}

const TINY_TRAIN: &str = r#"
name = "tiny-train"
seed = 5
genotype = "DARTS_V2"
[data]
dataset = "fashion-mnist"
limit = 64
test_limit = 32
[model]
init_channels = 2
layers = 3
[train]
epochs = 4
batch_size = 8
steps_per_epoch = 2
[record]
quant_error_every = 1
checkpoint_every = 1
"#;

fn train_config(dir: &Path) -> PathBuf {
    write_config(dir, "tiny-train.toml", TINY_TRAIN)
}

#[test]
fn a_killed_training_resumes_to_the_same_metrics() {
    let [run_a, run_b] = uninterrupted_and_resumed("train", "train", train_config);
    assert_same_record(&run_a, &run_b, &["nan_events.csv", "quant_error.csv"]);
    let ma = std::fs::read_to_string(run_a.join("metrics.csv")).unwrap();
    assert_eq!(ma.lines().filter(|l| l.contains(",val,")).count(), 4, "{ma}");
    assert_no_torn_rows(&run_b, &["metrics.csv", "quant_error.csv"]);
}

#[test]
fn device_flags_are_checked_against_the_backend() {
    for (args, code, want) in [
        (&["--device", "cuda:0"][..], 1, "--device cuda:0 does not go with --backend flex"),
        (&["--device", "gpu"], 1, "--device `gpu`: expected `cpu`, `cuda` or `cuda:N`"),
        (&["--device", "cuda:-1"], 1, "expected `cpu`, `cuda` or `cuda:N`"),
        (&["--backend", "wgpu", "--device", "cpu"], 1, "wgpu"),
        (&["--device", "--backend", "flex"], 2, "a value is required"),
        (
            &["--memory-pools", "adaptive"],
            1,
            "--memory-pools adaptive does not go with --backend flex",
        ),
        (&["--backend", "tch", "--memory-pools", "exclusive"], 1, "does not go with --backend tch"),
        (&["--memory-pools", "shared"], 2, "invalid value 'shared'"),
    ] {
        let out = qdarts().args(args).args(["bench", "quant"]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    // After the command, on a command that runs a model, the same flags are checked the same
    // way; a command that runs no model refuses them instead of ignoring them.
    let out = qdarts().args(["bench", "--device", "cuda:0", "quant"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("--device cuda:0 does not go with --backend flex"), "{err}");
    let out = qdarts().args(["--backend", "flex", "compare", "results"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("`compare` runs no model") && err.contains("drop them"), "{err}");
    let help = qdarts().args(["compare", "--help"]).output().unwrap();
    assert!(!String::from_utf8_lossy(&help.stdout).contains("--backend"));
    // A backend this binary was built without names the feature that adds it.
    #[cfg(not(feature = "tch"))]
    {
        let out = qdarts().args(["--backend", "tch", "bench", "quant"]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains("rebuild with `--features tch`"), "{err}");
    }
}

#[test]
fn dump_step_writes_the_supernet_shape_asked_for() {
    let d = scratch("dump-step");
    let args = ["--preset", "float", "--channels", "2", "--layers", "4", "--nodes", "3"];
    let mut cmd = qdarts();
    let out = cmd.arg("dump-step").args(args).args(["--batch", "5", "--out"]).arg(&d).output();
    let out = out.unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("spec.json")).unwrap()).unwrap();
    for (key, want) in [("channels", 2), ("layers", 4), ("nodes", 3), ("batch", 5)] {
        assert_eq!(spec[key], want, "{key} in {spec}");
    }
    assert_eq!(spec["preset"], "float", "{spec}");
    let (x, _) = qdarts_engine::tensors::read(&d.join("batches.safetensors")).unwrap();
    assert_eq!(x["train_x"].dims, [5, 1, 28, 28]);
    // Three nodes: 2 + 3 + 4 edges, each mixing the eight DARTS candidates.
    let (a, _) = qdarts_engine::tensors::read(&d.join("alphas.safetensors")).unwrap();
    assert_eq!(a["normal"].dims, [9, 8]);
    let (net, _) = qdarts_engine::tensors::read(&d.join("net.safetensors")).unwrap();
    let cell = |i: usize| net.keys().any(|k| k.starts_with(&format!("cells.{i}.")));
    assert!(cell(3) && !cell(4), "four cells expected: {:?}", net.keys().collect::<Vec<_>>());
    let _ = std::fs::remove_dir_all(&d);

    for bad in [["--batch", "0"], ["--batch", "1025"], ["--nodes", "0"]] {
        let out = qdarts().arg("dump-step").args(bad).arg("--out").arg(&d).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {err}");
        assert!(err.contains(bad[0]), "{bad:?}: {err}");
        assert!(!d.exists(), "{bad:?} wrote {}", d.display());
    }
}

#[test]
fn parity_runs_the_fixtures_on_the_chosen_backend() {
    let d = scratch("parity-outputs");
    let out = qdarts().arg("parity").arg("--write-outputs").arg(&d).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("2 fixture(s) within bounds on flex"), "{text}");
    for quantity in ["first", "second.hessian", "alphas_after", "loss"] {
        assert!(text.contains(quantity), "{quantity} missing:\n{text}");
    }
    // What qdarts computed, under the reference's names.
    for fixture in ["float", "tensorrt"] {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("search/tests/fixtures/parity");
        let (expected, _) =
            qdarts_engine::tensors::read(&fixtures.join(fixture).join("expected.safetensors"))
                .unwrap();
        let (ours, _) =
            qdarts_engine::tensors::read(&d.join(fixture).join("qdarts.safetensors")).unwrap();
        assert!(expected.keys().eq(ours.keys()), "{fixture}: names differ from the reference's");
    }
    let _ = std::fs::remove_dir_all(&d);
    let out = qdarts().args(["parity", "/nonexistent-fixtures"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("/nonexistent-fixtures"), "{err}");
}
