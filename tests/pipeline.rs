//! From a searched genotype to an integer model, as a user runs it: `qdarts search` (tiny),
//! `qdarts train --genotype <search run>`, `freeze`, `export`, `eval`. The integer model must
//! agree with the fake-quant model on ≥ 99.5 % of the test images; the exported ONNX model is
//! run in onnxruntime when Python can install it (skipped otherwise, with a note).

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

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

/// A Python with onnxruntime (a venv in the temp dir, made once), or `None` with a note when
/// Python or the package registry is not there. The tests of this file run on parallel
/// threads: the first to ask builds the venv while the others wait for it, and a venv counts as
/// ready only when its Python imports both packages (a venv left half-installed is installed
/// into again).
fn onnx_python() -> Option<PathBuf> {
    static PYTHON: OnceLock<Option<PathBuf>> = OnceLock::new();
    PYTHON.get_or_init(make_onnx_python).clone()
}

fn make_onnx_python() -> Option<PathBuf> {
    let venv = std::env::temp_dir().join("qdarts-onnx-venv");
    let py = venv.join("bin").join("python");
    let imports = || {
        Command::new(&py)
            .args(["-c", "import onnxruntime, numpy"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    let ready = imports()
        || ((py.exists()
            || Command::new("python3")
                .args(["-m", "venv"])
                .arg(&venv)
                .status()
                .is_ok_and(|s| s.success()))
            && Command::new(venv.join("bin").join("pip"))
                .args(["install", "-q", "onnxruntime", "numpy"])
                .status()
                .is_ok_and(|s| s.success())
            && imports());
    if !ready {
        qdarts_record::scratch::tool_missing("python3 with onnxruntime is unavailable");
    }
    ready.then_some(py)
}

/// `scripts/onnx_check.py` on a frozen, exported run: onnxruntime agrees with the integer
/// runtime (as written ≥ 99 %, fused ≥ `min_fused`).
fn onnx_check(py: &Path, run: &Path, min_fused: &str) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts").join("onnx_check.py");
    let out =
        Command::new(py).arg(&script).arg(run).args(["--min-fused", min_fused]).output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    eprintln!("{text}");
    assert!(out.status.success(), "onnxruntime disagrees with the integer runtime:\n{text}");
}

/// `qdarts train` of `genotype` for `epochs` short epochs of a small network (C = 4, 3 cells,
/// 16 steps of 512 images, 300 test images) into `results`; the run folder.
fn train_small(genotype: &Path, results: &Path, epochs: usize) -> PathBuf {
    let results = format!("\"{}\"", results.display());
    let epochs = epochs.to_string();
    let mut train = qdarts();
    train.args(["train", "--genotype"]).arg(genotype);
    for (k, v) in [
        ("train.epochs", epochs.as_str()),
        ("train.steps_per_epoch", "16"),
        ("train.lr", "0.1"),
        ("data.limit", "512"),
        ("data.test_limit", "300"),
        ("model.init_channels", "4"),
        ("model.layers", "3"),
        ("record.results_dir", &results),
    ] {
        train.args(["--set".to_string(), format!("{k}={v}")]);
    }
    PathBuf::from(ok(&mut train))
}

/// `freeze`, `export` and `eval` of a training run; `eval.json`, whose integer model agrees
/// with the fake-quant model on ≥ 99.5 % of the test images.
fn freeze_export_eval(run: &Path) -> serde_json::Value {
    ok(qdarts().arg("freeze").arg(run));
    ok(qdarts().arg("export").arg(run));
    let report = ok(qdarts().arg("eval").arg(run));
    let eval: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("eval.json")).unwrap()).unwrap();
    let agreement = eval["agreement"].as_f64().unwrap();
    assert!(agreement >= 0.995, "agreement {agreement}:\n{report}");
    eval
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

    let run = train_small(&srun, &tdir, 3);
    assert_eq!(
        std::fs::read_to_string(run.join("genotype.json")).unwrap(),
        std::fs::read_to_string(srun.join("genotype.json")).unwrap(),
        "the training run trains the searched genotype"
    );
    let metrics = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    assert_eq!(metrics.lines().filter(|l| l.contains(",train,")).count(), 48);
    assert_eq!(metrics.lines().filter(|l| l.contains(",val,")).count(), 3);

    let eval = freeze_export_eval(&run);
    assert_eq!(eval["images"], 300);
    assert!(eval["bitops"].as_u64().unwrap() > 0);

    // The ONNX model in onnxruntime, when Python and the package registry are there.
    // onnxruntime's QLinear fusions requantize their own way: a looser bound for them.
    let py = onnx_python();
    let ready = py.is_some();
    if let Some(py) = &py {
        onnx_check(py, &run, "0.97");
    }
    // The runtime benchmark: both kernels, the profile, and onnxruntime beside when it is there.
    let python = py.map_or("none".to_string(), |p| p.to_string_lossy().to_string());
    let bench = ok(qdarts()
        .args(["bench", "runtime", "--reps", "1", "--direct", "--python", &python])
        .arg(&run));
    for row in ["node kind", "conv 1×1", "qdarts (direct kernel)", "vs qdarts"] {
        assert!(bench.contains(row), "`{row}` missing:\n{bench}");
    }
    assert_eq!(bench.contains("onnxruntime (graph optimizations on)"), ready, "{bench}");
    freeze_export_eval_at_once(&run);
    mismatched_model_is_refused(&d, &run);
    let _ = std::fs::remove_dir_all(&d);
}

/// `freeze`, `export` and `eval` three times each, all at once on one run: every one
/// succeeds (each reads a whole model and writes its file whole), the model is the one a
/// single freeze writes, and no temp file is left behind.
fn freeze_export_eval_at_once(run: &Path) {
    let model = run.join("frozen").join("model.qdf");
    let before = std::fs::read(&model).unwrap();
    let mut children = Vec::new();
    for _ in 0..3 {
        for sub in ["freeze", "export", "eval"] {
            let child = qdarts()
                .arg(sub)
                .arg(run)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            children.push((sub, child));
        }
    }
    for (sub, child) in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{sub}: {}", String::from_utf8_lossy(&out.stderr));
    }
    assert_eq!(std::fs::read(&model).unwrap(), before, "freeze is a pure function of the run");
    for dir in [run.to_path_buf(), run.join("frozen")] {
        for e in std::fs::read_dir(&dir).unwrap() {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            assert!(!name.ends_with(".tmp"), "{name} left in {}", dir.display());
        }
    }
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
    // Per-op widths need quantization to apply to.
    let g = d.join("bits.json");
    std::fs::write(&g, WIDTHS).unwrap();
    let out = qdarts()
        .arg("train")
        .arg("--genotype")
        .arg(&g)
        .args(["--set", "quant.preset=\"float\""])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("bits.json") && err.contains("float"), "{err}");
    let _ = std::fs::remove_dir_all(&d);
}

/// A genotype with per-op widths: 2-, 4- and 8-bit weights, 4- and 8-bit activations.
const WIDTHS: &str = r#"{
    "normal": [[["sep_conv_3x3", 0], ["dil_conv_3x3", 1]], [["skip_connect", 0], ["max_pool_3x3", 2]]],
    "normal_concat": [2, 3],
    "reduce": [[["sep_conv_3x3", 0], ["skip_connect", 1]], [["dil_conv_5x5", 2], ["avg_pool_3x3", 1]]],
    "reduce_concat": [2, 3],
    "normal_bits": [[[2, 4], [4, 8]], [[8, 8], [8, 8]]],
    "reduce_bits": [[[4, 4], [2, 8]], [[8, 4], [8, 8]]]
}"#;

#[test]
fn a_genotype_with_per_op_widths_trains_freezes_and_exports_at_them() {
    let d = scratch("widths");
    let g = d.join("widths.json");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(&g, WIDTHS).unwrap();
    let run = train_small(&g, &d.join("train"), 2);
    let eval = freeze_export_eval(&run);

    // The frozen graph holds the widths: conv weights of each op at its width, the op's own
    // activation grids at its width, everything else at 8 bits.
    let model = qdarts_frozen::FrozenModel::load(&run.join("frozen/model.qdf")).unwrap();
    let mut weight_bits = std::collections::BTreeMap::new();
    let mut act_levels = std::collections::BTreeMap::new();
    for node in &model.graph.nodes {
        if let qdarts_frozen::Node::Conv(c) = node {
            weight_bits.insert(c.name.clone(), c.weight_bits);
            act_levels.insert(c.name.clone(), c.out.qmax - c.out.qmin + 1);
            let w = &model.tensors[&format!("{}.weight", c.name)];
            let half = 1i32 << (c.weight_bits - 1);
            assert!(
                w.data.iter().all(|&b| (-half..half).contains(&i32::from(b as i8))),
                "{}",
                c.name
            );
        }
    }
    let wb = |name: &str| weight_bits[name];
    // Cell 0 is a normal cell, cells 1 and 2 reduce (`cells.<i>.ops.<k>`).
    assert_eq!(wb("cells.0.ops.0.op1.dw"), 2);
    assert_eq!(wb("cells.0.ops.0.op2.pw"), 2);
    assert_eq!(act_levels["cells.0.ops.0.op1.dw"], 16, "4-bit activations");
    assert_eq!(wb("cells.0.ops.1.pw"), 4);
    assert_eq!(act_levels["cells.0.ops.1.pw"], 256);
    assert_eq!(wb("cells.1.ops.1.conv1"), 2, "FactorizedReduce at 2 bits");
    assert_eq!(wb("cells.2.ops.2.dw"), 8);
    assert_eq!(act_levels["cells.2.ops.2.dw"], 16);
    assert_eq!(wb("stem.conv"), 8);
    // BitOPs count each conv at its widths.
    let macs = model.macs().unwrap();
    assert!(macs.iter().any(|&(_, w, a)| (w, a) == (2, 4)), "{macs:?}");
    let bitops: u64 = macs.iter().map(|&(m, w, a)| m * u64::from(w) * u64::from(a)).sum();
    assert_eq!(eval["bitops"].as_u64().unwrap(), bitops);
    assert!(eval["weight_bytes"].as_u64().unwrap() < eval["param_bytes"].as_u64().unwrap());
    if let Some(py) = onnx_python() {
        // As written, onnxruntime computes what the integer model does (≥ 99 %). Its graph
        // optimizations swap in other float conv kernels whose rounding differs near grid
        // boundaries; on a 4-bit grid each such step is a sixteenth of the range, so the fused
        // model agrees less (85 % measured on this model, against 98 % at 8 bits).
        onnx_check(&py, &run, "0.75");
    }
    let _ = std::fs::remove_dir_all(&d);
}
