//! The search on a worker of rayon's pool, as the `qdarts` binary runs it, writes the record it
//! writes on a thread outside the pool: the parallel kernels' results do not depend on which
//! thread starts them or on how the pool's threads share the work.

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

mod common;

use std::ops::ControlFlow;
use std::path::Path;

use burn::tensor::Device;
use qdarts_engine::config::Experiment;
use qdarts_search::config::ExperimentConfig;
use qdarts_search::run_search;

/// `experiments/default.toml`'s supernet and quantization (where the kernels split their work
/// over the pool), one epoch of 10 steps: `metrics.csv` without its time column, `alphas.csv`
/// and `quant_error.csv`.
fn record(tag: &str, on_worker: bool) -> Vec<String> {
    let results = common::scratch(tag);
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../experiments/default.toml"
    ))
    .unwrap();
    let set = [
        format!("record.results_dir=\"{}\"", results.display()),
        "search.epochs=1".to_string(),
        "search.steps_per_epoch=10".to_string(),
        "record.quant_error_every=5".to_string(),
    ];
    let cfg = ExperimentConfig::parse(&text, Path::new("default.toml"), &set).unwrap();
    let go = |_: &qdarts_engine::Progress| ControlFlow::Continue(());
    let search = || run_search(&cfg, &Device::flex(), None, &mut { go }).unwrap();
    let out = if on_worker { rayon::scope(|_| search()) } else { search() };
    let read = |f: &str| std::fs::read_to_string(out.run_dir.join(f)).unwrap();
    let mut lines: Vec<String> =
        read("metrics.csv").lines().map(|l| l.rsplit_once(',').unwrap().0.to_string()).collect();
    lines.extend(read("alphas.csv").lines().map(String::from));
    lines.extend(read("quant_error.csv").lines().map(String::from));
    let _ = std::fs::remove_dir_all(&results);
    lines
}

#[test]
fn a_search_on_a_rayon_worker_writes_the_record_of_one_outside_the_pool() {
    let outside = record("threads-outside", false);
    let worker = record("threads-worker", true);
    assert!(outside.len() > 100, "{} lines", outside.len());
    let differ: Vec<_> = outside.iter().zip(&worker).filter(|(a, b)| a != b).take(3).collect();
    assert!(differ.is_empty() && outside.len() == worker.len(), "first differences: {differ:?}");
}
