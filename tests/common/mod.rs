//! Helpers shared by the tests that run the `qdarts` binary.

// Each test crate uses its own subset.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The binary under test.
pub fn qdarts() -> Command {
    Command::new(env!("CARGO_BIN_EXE_qdarts"))
}

/// An empty scratch folder `qdarts-<area>-<name>-<pid>` in the temp dir.
pub fn scratch(area: &str, name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("qdarts-{area}-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch folder");
    d
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
