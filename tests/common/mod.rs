//! Helpers shared by the tests that run the `qdarts` binary.

// Each test crate uses its own subset.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The binary under test.
pub fn qdarts() -> Command {
    Command::new(env!("CARGO_BIN_EXE_qdarts"))
}

/// An empty scratch folder `<area>-<name>` (`qdarts_record::scratch`).
pub fn scratch(area: &str, name: &str) -> PathBuf {
    qdarts_record::scratch::scratch(&format!("{area}-{name}"))
}

/// Writes `text` as `dir/file`, with the run record going to `dir/results`.
pub fn write_config(dir: &Path, file: &str, text: &str) -> PathBuf {
    let p = dir.join(file);
    let results = dir.join("results");
    std::fs::write(&p, format!("{text}results_dir = \"{}\"\n", results.display()))
        .expect("config written");
    p
}

/// A search config small enough for a test: 64 images, 3 cells of 2 nodes, C=2, 2 steps of 8
/// images per epoch, a checkpoint and quantizer rows every step (the `[record]` table is last,
/// for [`write_config`]).
pub fn tiny_search(name: &str, seed: u64, epochs: usize) -> String {
    format!(
        r#"
name = "{name}"
seed = {seed}
[data]
dataset = "fashion-mnist"
limit = 64
[model]
init_channels = 2
layers = 3
nodes = 2
stem_multiplier = 1
[search]
epochs = {epochs}
batch_size = 8
steps_per_epoch = 2
[record]
quant_error_every = 1
checkpoint_every = 1
"#
    )
}

/// Runs `qdarts --backend <args…> search --set search.epochs=1 <sets…>` into a fresh results
/// folder under the temp dir and checks the run record of that one epoch: `train_steps` train
/// rows and one validation row, finite losses between 0.05 and 4 (cross-entropy over 10
/// classes starts near ln 10), a genotype and quantizer rows. Returns the run folder and its
/// validation top-1 (a fraction).
pub fn one_epoch_search(
    tag: &str,
    backend: &[&str],
    sets: &[&str],
    train_steps: usize,
) -> (PathBuf, f64) {
    let dir = qdarts_record::scratch::scratch_path(tag);
    let results = format!("record.results_dir=\"{}\"", dir.display());
    let mut cmd = qdarts();
    cmd.current_dir(env!("CARGO_MANIFEST_DIR"));
    cmd.args(backend).args(["search", "--set", "search.epochs=1", "--set", &results]);
    for s in sets {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().expect("qdarts runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let run =
        std::fs::read_dir(&dir).expect("results").next().expect("a run").expect("entry").path();
    let metrics = std::fs::read_to_string(run.join("metrics.csv")).expect("metrics.csv");
    let rows: Vec<Vec<&str>> = metrics.lines().skip(1).map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.iter().filter(|r| r[2] == "train").count(), train_steps, "{metrics}");
    assert_eq!(rows.iter().filter(|r| r[2] == "val").count(), 1, "{metrics}");
    for r in &rows {
        let loss: f64 = r[3].parse().expect("a loss");
        assert!(loss.is_finite() && (0.05..4.0).contains(&loss), "{metrics}");
    }
    let top1: f64 =
        rows.iter().find(|r| r[2] == "val").expect("val row")[4].parse().expect("top-1");
    let genotype = std::fs::read_to_string(run.join("genotype.txt")).expect("genotype.txt");
    assert!(genotype.starts_with("Genotype(normal="), "{genotype}");
    let quant = std::fs::read_to_string(run.join("quant_error.csv")).expect("quant_error.csv");
    assert!(quant.lines().count() > 1);
    (run, top1)
}
