//! Helpers shared by the search crate's tests: the tiny search config, scratch folders, the
//! tiny supernet shape.

// Each test crate uses its own subset.
#![allow(dead_code)]

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use qdarts_engine::config::Experiment;
use qdarts_search::config::ExperimentConfig;
use qdarts_search::supernet::NetShape;

/// A search small enough for a test: 64 images, 3 cells of 2 nodes, C=2, 2 epochs of 2 steps
/// of 8 images, quantizer rows every step, results in `results`; `extra` is appended after
/// the `[record]` table (more `[record]` keys, or further tables).
pub fn tiny_text(results: &Path, extra: &str) -> String {
    format!(
        r#"
        name = "tiny"
        seed = 5
        [data]
        dataset = "fashion-mnist"
        limit = 64
        [model]
        init_channels = 2
        layers = 3
        nodes = 2
        stem_multiplier = 1
        [search]
        epochs = 2
        batch_size = 8
        steps_per_epoch = 2
        [record]
        results_dir = "{}"
        quant_error_every = 1
        {extra}
        "#,
        results.display()
    )
}

/// [`tiny_text`] parsed, with `--set` overrides.
pub fn tiny_with(results: &Path, extra: &str, overrides: &[&str]) -> ExperimentConfig {
    let set: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    ExperimentConfig::parse(&tiny_text(results, extra), Path::new("tiny.toml"), &set)
        .unwrap_or_else(|e| panic!("{e}"))
}

/// [`tiny_text`] parsed.
pub fn tiny(results: &Path, extra: &str) -> ExperimentConfig {
    tiny_with(results, extra, &[])
}

/// A fresh (absent) scratch folder `search-<name>` (`qdarts_record::scratch`).
pub fn scratch(name: &str) -> PathBuf {
    qdarts_record::scratch::scratch_path(&format!("search-{name}"))
}

/// A supernet of C = 4, 3 cells of 2 nodes on 1-channel images, PC-DARTS `partial` channels.
pub fn tiny_shape(partial: usize) -> NetShape {
    NetShape {
        c_in: 1,
        classes: 10,
        channels: 4,
        layers: 3,
        nodes: 2,
        stem_multiplier: 1,
        primitives: qdarts_genotypes::Primitive::DARTS.to_vec(),
        partial_channels: partial,
        bits: None,
    }
}

/// A progress callback that stops a run after global step `global` (1-based).
pub fn stop_at(global: usize) -> impl FnMut(&qdarts_engine::Progress) -> ControlFlow<()> {
    move |p| {
        if p.epoch * p.steps + p.step == global {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    }
}

/// Runs the search of `cfg` to its end on flex, meeting a NaN at global step `step` (1-based)
/// at `site` (tests of the NaN guard).
pub fn search_with_nan(
    cfg: &ExperimentConfig,
    step: usize,
    site: qdarts_engine::InjectSite,
) -> Result<qdarts_search::SearchOutcome, qdarts_engine::RunError> {
    let device = burn::tensor::Device::flex();
    let prepared = qdarts_search::prepare_search(cfg, &device)?
        .inject_nan(qdarts_engine::NanInjection { step, site });
    let run = qdarts_record::RunDir::create(&cfg.record.results_dir, &cfg.name)?;
    qdarts_search::run_prepared(prepared, run, false, &mut |_| ControlFlow::Continue(()))
}
