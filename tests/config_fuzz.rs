//! The config loaders under random and mutated input: a search or training config, edited at
//! random and given random `--set` overrides, is either refused with an error or accepted as a
//! config that passes its own checks again after a round trip through the run's `config.toml`.
//! Nothing panics.

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use std::path::Path;

use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, RngSeed};
use qdarts_engine::config::Experiment;
use qdarts_search::config::ExperimentConfig;
use qdarts_train::TrainConfig;

const SEARCH: &str = include_str!("../experiments/default.toml");
const SEARCH_CIFAR: &str = include_str!("../experiments/cifar10-pcdarts.toml");
const TRAIN: &str = include_str!("../experiments/train-default.toml");

const KEYS: &[&str] = &[
    "name",
    "seed",
    "genotype",
    "data.dataset",
    "data.path",
    "data.limit",
    "data.test_limit",
    "data.train_portion",
    "model.init_channels",
    "model.layers",
    "model.nodes",
    "model.stem_multiplier",
    "model.primitives",
    "model.auxiliary",
    "model.drop_path_prob",
    "search.epochs",
    "search.batch_size",
    "search.order",
    "search.w_lr",
    "search.w_lr_min",
    "search.w_momentum",
    "search.w_weight_decay",
    "search.w_grad_clip",
    "search.alpha_lr",
    "search.alpha_betas",
    "search.alpha_weight_decay",
    "search.partial_channels",
    "search.steps_per_epoch",
    "train.epochs",
    "train.lr",
    "train.lr_min",
    "train.momentum",
    "train.weight_decay",
    "train.grad_clip",
    "train.batch_size",
    "quant.preset",
    "quant.weight_bits",
    "quant.act_bits",
    "quant.weight.bits",
    "quant.activation.observer",
    "record.results_dir",
    "record.quant_error_every",
    "record.checkpoint_every",
    "nan_guard.policy",
    "nan_guard.max_events",
    "nan_guard.inject_site",
    // Not keys at all.
    "search",
    "search.",
    ".epochs",
    "search..epochs",
    "search.epochs.deeper",
    "a.b.c.d",
    "",
];

const VALUES: &[&str] = &[
    "nan",
    "inf",
    "-inf",
    "-1",
    "0",
    "1",
    "2",
    "3",
    "0.5",
    "0.999",
    "1e308",
    "-1e308",
    "1e-320",
    "99999999999999999999",
    "18446744073709551615",
    "\"x\"",
    "\"\"",
    "\"a/b\"",
    "[]",
    "[2.0,-1.0]",
    "[0.5,0.999]",
    "[\"none\",\"skip_connect\"]",
    "true",
    "false",
    "{}",
    "\"first\"",
    "\"second\"",
    "\"rollback\"",
    "\"val\"",
    "\"tensorrt\"",
    "\"lsq\"",
    "\"float\"",
    "\"cifar10\"",
    "\"mnist\"",
    "[1, 2",
    "=",
    "'x'",
    "1979-05-27",
];

fn overrides() -> impl Strategy<Value = Vec<String>> {
    let item = prop_oneof![
        4 => (prop::sample::select(KEYS), prop::sample::select(VALUES))
            .prop_map(|(k, v)| format!("{k}={v}")),
        1 => "[a-z._=\\[\\]\"0-9-]{0,20}",
    ];
    prop::collection::vec(item, 0..4)
}

/// `text` with `edits` applied: (position fraction, cut length, inserted text).
fn mutated(text: &str, edits: &[(f64, usize, String)]) -> String {
    let mut s: Vec<char> = text.chars().collect();
    for (at, cut, insert) in edits {
        let i = ((s.len() as f64) * at) as usize;
        let j = (i + cut).min(s.len());
        s.splice(i..j, insert.chars());
    }
    s.into_iter().collect()
}

fn edit() -> impl Strategy<Value = (f64, usize, String)> {
    let insert = prop_oneof![
        prop::sample::select(VALUES).prop_map(String::from),
        prop::sample::select(KEYS).prop_map(|k| format!("\n{k} = ")),
        "[\\[\\]=\"'.,\n#a-z0-9 -]{0,8}",
        any::<char>().prop_map(String::from),
    ];
    (0.0f64..1.0, 0usize..12, insert)
}

fn search(text: &str, overrides: &[String]) {
    let path = Path::new("fuzz.toml");
    if let Ok(cfg) = ExperimentConfig::parse(text, path, overrides) {
        let written = cfg.to_toml().unwrap();
        let again = ExperimentConfig::parse(&written, path, &[]).unwrap();
        assert_eq!(again.to_toml().unwrap(), written);
    }
}

fn train(text: &str, overrides: &[String]) {
    let path = Path::new("fuzz.toml");
    if let Ok(cfg) = TrainConfig::parse(text, path, overrides) {
        let written = cfg.to_toml().unwrap();
        let again = TrainConfig::parse(&written, path, &[]).unwrap();
        assert_eq!(again.to_toml().unwrap(), written);
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 384,
        // Seeded: the same cases every run.
        rng_seed: RngSeed::Fixed(23),
        ..ProptestConfig::default()
    })]

    #[test]
    fn shipped_configs_with_random_overrides_never_panic(sets in overrides()) {
        search(SEARCH, &sets);
        search(SEARCH_CIFAR, &sets);
        train(TRAIN, &sets);
    }

    #[test]
    fn mutated_configs_never_panic(
        edits in prop::collection::vec(edit(), 1..5),
        sets in overrides(),
    ) {
        search(&mutated(SEARCH, &edits), &sets);
        train(&mutated(TRAIN, &edits), &sets);
    }

    #[test]
    fn arbitrary_text_never_panics(text in "(?s).{0,200}", sets in overrides()) {
        search(&text, &sets);
        train(&text, &sets);
    }
}

#[test]
fn the_issue_hyperparameters_are_refused_naming_the_override() {
    for set in [
        "search.w_weight_decay=nan",
        "search.alpha_betas=[2.0,-1.0]",
        "search.w_momentum=-5",
        "nan_guard.max_events=0",
    ] {
        let err = ExperimentConfig::parse(SEARCH, Path::new("default.toml"), &[set.into()])
            .unwrap_err()
            .to_string();
        assert!(err.starts_with(&format!("--set {set}: ")), "{err}");
    }
    for set in ["train.momentum=nan", "train.weight_decay=-1"] {
        let err = TrainConfig::parse(TRAIN, Path::new("train.toml"), &[set.into()])
            .unwrap_err()
            .to_string();
        assert!(err.starts_with(&format!("--set {set}: ")), "{err}");
    }
    // A bad value in the file names the file.
    let text = SEARCH.replace("w_lr = 0.025", "w_lr = -0.025");
    let err = ExperimentConfig::parse(&text, Path::new("default.toml"), &[]).unwrap_err();
    assert!(err.to_string().starts_with("default.toml: `search.w_lr`"), "{err}");
}
