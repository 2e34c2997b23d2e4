//! From a searched genotype to an integer model, as a user runs it: `qdarts search` (tiny),
//! `qdarts train --genotype <search run>`, `freeze`, `export`, `eval`. The integer model must
//! agree with the fake-quant model on ≥ 99.5 % of the test images; the exported ONNX model is
//! run in onnxruntime when Python can install it (skipped otherwise, with a note).

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;

use common::qdarts;

fn scratch(name: &str) -> PathBuf {
    common::scratch("pipe", name)
}

fn ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    let (so, se) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{cmd:?} failed:\n{so}\n{se}");
    so.trim().to_string()
}

fn only_run(dir: &Path) -> PathBuf {
    let runs: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(runs.len(), 1, "{runs:?}");
    runs[0].clone()
}

#[test]
fn searched_genotype_to_integer_model_and_onnx() {
    let d = scratch("e2e");
    let (sdir, tdir) = (d.join("search"), d.join("train"));
    let set = |k: &str, v: &str| ["--set".to_string(), format!("{k}={v}")];
    let sdir_s = format!("\"{}\"", sdir.display());
    let mut search = qdarts();
    search.args(["search"]);
    for (k, v) in [
        ("search.epochs", "1"),
        ("search.steps_per_epoch", "2"),
        ("model.init_channels", "2"),
        ("model.layers", "3"),
        ("model.nodes", "2"),
        ("record.results_dir", &sdir_s),
    ] {
        search.args(set(k, v));
    }
    ok(&mut search);
    let srun = only_run(&sdir);

    let tdir_s = format!("\"{}\"", tdir.display());
    let mut train = qdarts();
    train.args(["train", "--genotype"]).arg(&srun);
    for (k, v) in [
        ("train.epochs", "3"),
        ("train.steps_per_epoch", "16"),
        ("train.lr", "0.1"),
        ("data.limit", "512"),
        ("data.test_limit", "300"),
        ("model.init_channels", "4"),
        ("model.layers", "3"),
        ("record.results_dir", &tdir_s),
    ] {
        train.args(set(k, v));
    }
    let run = PathBuf::from(ok(&mut train));
    assert_eq!(
        std::fs::read_to_string(run.join("genotype.json")).unwrap(),
        std::fs::read_to_string(srun.join("genotype.json")).unwrap(),
        "the training run trains the searched genotype"
    );
    let metrics = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    assert_eq!(metrics.lines().filter(|l| l.contains(",train,")).count(), 48);
    assert_eq!(metrics.lines().filter(|l| l.contains(",val,")).count(), 3);

    ok(qdarts().arg("freeze").arg(&run));
    ok(qdarts().arg("export").arg(&run));
    let report = ok(qdarts().arg("eval").arg(&run));
    let eval: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("eval.json")).unwrap()).unwrap();
    let agreement = eval["agreement"].as_f64().unwrap();
    assert!(agreement >= 0.995, "agreement {agreement}:\n{report}");
    assert_eq!(eval["images"], 300);
    assert!(eval["bitops"].as_u64().unwrap() > 0);

    // The ONNX model in onnxruntime, when Python and the package registry are there.
    let venv = std::env::temp_dir().join("qdarts-onnx-venv");
    let py = venv.join("bin").join("python");
    let ready = py.exists()
        || (Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .is_ok_and(|s| s.success())
            && Command::new(venv.join("bin").join("pip"))
                .args(["install", "-q", "onnxruntime", "numpy"])
                .status()
                .is_ok_and(|s| s.success()));
    if !ready {
        eprintln!("note: python3 with onnxruntime unavailable; ONNX check skipped");
    } else {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts").join("onnx_check.py");
        // onnxruntime's QLinear fusions requantize their own way: a looser bound for them.
        let out = Command::new(&py)
            .arg(&script)
            .arg(&run)
            .args(["--min-fused", "0.97"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        eprintln!("{text}");
        assert!(out.status.success(), "onnxruntime disagrees with the integer runtime:\n{text}");
    }
    // The runtime benchmark: both kernels, the profile, and onnxruntime beside when it is there.
    let python = if ready { py.to_string_lossy().to_string() } else { "none".to_string() };
    let bench = ok(qdarts()
        .args(["bench", "runtime", "--reps", "1", "--direct", "--python", &python])
        .arg(&run));
    for row in ["node kind", "conv 1×1", "qdarts (direct kernel)", "vs qdarts"] {
        assert!(bench.contains(row), "`{row}` missing:\n{bench}");
    }
    assert_eq!(bench.contains("onnxruntime (graph optimizations on)"), ready, "{bench}");
    mismatched_model_is_refused(&d, &run);
    let _ = std::fs::remove_dir_all(&d);
}

/// A copy of the trained run whose test images are 32×32 while its frozen model takes 28×28:
/// `eval` and `bench runtime` refuse it, naming the model and both shapes.
fn mismatched_model_is_refused(d: &Path, run: &Path) {
    let data = d.join("mnist32");
    std::fs::create_dir_all(&data).unwrap();
    for (prefix, n) in [("train", 64u32), ("t10k", 300)] {
        let mut img = Vec::new();
        for v in [0x803u32, n, 32, 32] {
            img.extend(v.to_be_bytes());
        }
        img.extend((0..n * 32 * 32).map(|i| (i * 7 % 251) as u8));
        let mut lab = Vec::new();
        for v in [0x801u32, n] {
            lab.extend(v.to_be_bytes());
        }
        lab.extend((0..n).map(|i| (i % 10) as u8));
        std::fs::write(data.join(format!("{prefix}-images-idx3-ubyte")), img).unwrap();
        std::fs::write(data.join(format!("{prefix}-labels-idx1-ubyte")), lab).unwrap();
    }
    let other = d.join("other-run");
    std::fs::create_dir_all(other.join("frozen")).unwrap();
    for f in ["config.toml", "genotype.json", "genotype.txt", "plan.json"] {
        std::fs::copy(run.join(f), other.join(f)).unwrap();
    }
    std::fs::copy(run.join("frozen/model.qdf"), other.join("frozen/model.qdf")).unwrap();
    let copy = |from: &Path, to: &Path| {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    };
    copy(&run.join("checkpoint"), &other.join("checkpoint"));
    let config = std::fs::read_to_string(other.join("config.toml")).unwrap();
    let config = config.replace(
        "dataset = \"fashion-mnist\"",
        &format!("dataset = \"mnist\"\npath = \"{}\"", data.display()),
    );
    std::fs::write(other.join("config.toml"), config).unwrap();
    for args in [&["eval"][..], &["bench", "runtime", "--reps", "1"]] {
        let out = qdarts().args(args).arg(&other).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains("model.qdf")
                && err.contains("is 1×28×28, but the run's test images are 1×32×32"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn freeze_and_eval_refuse_bad_runs_and_damaged_models() {
    let d = scratch("bad");
    // Not a run folder.
    let out = qdarts().arg("freeze").arg(d.join("nope")).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no such run folder"));
    // A search run is not a training run.
    std::fs::write(d.join("config.toml"), "name = \"x\"\n").unwrap();
    let out = qdarts().arg("freeze").arg(&d).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("config.toml"));
    // A damaged model.qdf names the file.
    std::fs::create_dir_all(d.join("frozen")).unwrap();
    std::fs::write(d.join("frozen").join("model.qdf"), b"QDARTSF\0garbage").unwrap();
    let out = qdarts().arg("export").arg(&d).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("model.qdf") && !err.contains("panicked"), "{err}");
    // A bad genotype for train.
    let out = qdarts().args(["train", "--genotype", "NOT_A_GENOTYPE"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("NOT_A_GENOTYPE"), "{err}");
    // A genotype with per-op bits: training does not apply them yet, and says so.
    let g = d.join("bits.json");
    std::fs::write(
        &g,
        r#"{"normal": [[["sep_conv_3x3", 0], ["skip_connect", 1]]], "normal_concat": [2],
            "reduce": [[["max_pool_3x3", 0], ["max_pool_3x3", 1]]], "reduce_concat": [2],
            "normal_bits": [[[4, 8], [4, 8]]]}"#,
    )
    .unwrap();
    let out = qdarts().arg("train").arg("--genotype").arg(&g).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("bits.json") && err.contains("per-op bit widths"), "{err}");
    let _ = std::fs::remove_dir_all(&d);
}
