//! `scripts/compare_torch.sh` without PyTorch or onnxruntime: its arguments, and the runtime
//! comparison's table from a stand-in `qdarts` (the real one is exercised where Python has the
//! packages, by hand: the script's header says how).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn compare(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new("bash");
    cmd.arg(root().join("scripts/compare_torch.sh")).args(args).current_dir(root());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().expect("bash runs")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn write_exec(path: &Path, body: &str) {
    std::fs::write(path, body).expect("write script");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
}

#[test]
fn bad_arguments_exit_2_naming_the_argument() {
    for (args, says) in [
        (vec!["--rounds", "0"], "--rounds needs a positive integer"),
        (vec!["--rounds", "x"], "--rounds needs a positive integer"),
        (vec!["--shape", "huge"], "--shape is darts or default, not 'huge'"),
        (vec!["first/int8"], "case 'first/int8' is not ORDER/QUANT"),
        (vec!["--frobnicate"], "unknown argument '--frobnicate'"),
        (vec!["--ops", "--runtime", "/tmp"], "--ops or --runtime, not both"),
        (
            vec!["--runtime", "/nonexistent/qdarts-run"],
            "--runtime /nonexistent/qdarts-run: needs frozen/model.qdf and frozen/model.onnx",
        ),
        (vec!["--python", "/nonexistent/python"], "/nonexistent/python lacks torch"),
    ] {
        let o = compare(&args, &[]);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(text(&o).contains(says), "{args:?}: {}", text(&o));
    }
}

/// The runtime comparison hands its rounds to `qdarts bench runtime --rounds` and prints each
/// row's images/s and the median of the per-round ratios with their min..max, from the CSV.
#[test]
fn the_runtime_comparison_prints_the_per_round_ratios_from_qdarts_csv() {
    let dir = qdarts_record::scratch::scratch_path("compare-runtime");
    let frozen = dir.join("run").join("frozen");
    std::fs::create_dir_all(&frozen).expect("temp folder");
    std::fs::write(frozen.join("model.qdf"), b"stand-in").unwrap();
    std::fs::write(frozen.join("model.onnx"), b"stand-in").unwrap();
    // Python modules that only need to import: the script checks for them before it runs.
    for m in ["onnxruntime", "numpy"] {
        std::fs::create_dir_all(dir.join("py").join(m)).unwrap();
        std::fs::write(dir.join("py").join(m).join("__init__.py"), "__version__ = '0-stand-in'\n")
            .unwrap();
    }
    // A stand-in qdarts: records its arguments, writes the CSV `bench runtime` writes.
    let args_log = dir.join("args.txt");
    let bin = dir.join("qdarts");
    write_exec(
        &bin,
        &format!(
            r#"#!/bin/sh
[ "$1" = --version ] && {{ echo "qdarts 0-stand-in"; exit 0; }}
echo "$@" > {log}
while [ $# -gt 0 ]; do [ "$1" = --csv ] && csv="$2"; shift; done
echo "integer runtime on stand-in" 
cat > "$csv" <<EOF
runtime,threads,images_per_s,min,max,rounds,vs_qdarts,vs_qdarts_min,vs_qdarts_max
qdarts,1,1500.000,1400.000,1600.000,3,1.0000,1.0000,1.0000
onnxruntime (graph optimizations on),1,750.000,700.000,800.000,3,2.0000,1.8500,2.1500
EOF
"#,
            log = args_log.display()
        ),
    );
    let run = dir.join("run");
    let o = compare(
        &[
            "--python",
            "python3",
            "--runtime",
            run.to_str().unwrap(),
            "--rounds",
            "3",
            "--reps",
            "2",
        ],
        &[("QDARTS", bin.to_str().unwrap()), ("PYTHONPATH", dir.join("py").to_str().unwrap())],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let called = std::fs::read_to_string(&args_log).unwrap();
    assert!(
        called.starts_with(&format!(
            "bench runtime {} --rounds 3 --reps 2 --python python3",
            run.display()
        )),
        "{called}"
    );
    let out = text(&o);
    assert!(out.contains("qdarts 0-stand-in, onnxruntime 0-stand-in"), "{out}");
    assert!(out.contains("3 rounds, qdarts and onnxruntime alternating"), "{out}");
    let row =
        out.lines().find(|l| l.starts_with("onnxruntime (graph optimizations on)")).expect(&out);
    assert!(row.contains("750.0") && row.contains("2.00x (1.85..2.15)"), "{row}");
    std::fs::remove_dir_all(&dir).ok();
}
