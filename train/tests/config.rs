//! The shipped training experiments parse, and bad values name their key.

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use std::path::Path;

use qdarts_engine::config::Experiment;
use qdarts_train::TrainConfig;

fn experiments() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../experiments")
}

#[test]
fn every_shipped_training_experiment_parses() {
    for name in ["train-default.toml", "train-cifar10.toml"] {
        let cfg = TrainConfig::load(&experiments().join(name), &[]).unwrap();
        if name.contains("cifar10") {
            let m = &cfg.model;
            assert_eq!((m.init_channels, m.layers, cfg.train.epochs), (36, 20, 600));
        }
    }
}

#[test]
fn bad_training_values_name_the_key() {
    let path = experiments().join("train-default.toml");
    let err = TrainConfig::load(&path, &["model.layers=2".into()]).unwrap_err().to_string();
    assert!(err.starts_with("--set model.layers=2: `model.layers`"), "{err}");
    let text = std::fs::read_to_string(&path).unwrap().replace("layers = 5", "layers = 2");
    let err = TrainConfig::parse(&text, &path, &[]).unwrap_err().to_string();
    assert!(err.contains("train-default.toml") && err.contains("model.layers"), "{err}");
    let err = TrainConfig::load(&path, &["train.lr_min=1".into()]).unwrap_err().to_string();
    assert!(err.contains("train.lr_min"), "{err}");
    let err = TrainConfig::load(&path, &["model.drop_path_prob=1.5".into()]).unwrap_err();
    assert!(err.to_string().contains("model.drop_path_prob"), "{err}");
    let err = TrainConfig::load(&path, &["train.epohcs=3".into()]).unwrap_err().to_string();
    assert!(err.contains("epohcs"), "{err}");
}
