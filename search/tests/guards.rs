//! Collapse guards: DARTS-' auxiliary skip connection (β·h on every stride-1 edge, β decaying
//! linearly) held to its closed form on a cell whose only op is skip_connect, P-DARTS' skip
//! limit in a real search, and the guard settings' validation.

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use burn::tensor::{Device, Distribution, Tensor};
use qdarts_genotypes::{Genotype, Primitive};
use qdarts_ops::candidates::QTensor;
use qdarts_ops::qconfig::QuantConfig;
use qdarts_search::config::{ExperimentConfig, GuardConfig};
use qdarts_search::run_search;
use qdarts_search::supernet::{CellShape, SearchCell};

fn max_diff(a: Tensor<4>, b: Tensor<4>) -> f32 {
    a.sub(b).abs().max().into_scalar::<f32>()
}

/// A cell of 2 nodes whose only op is skip_connect (identity at stride 1, FactorizedReduce at
/// stride 2), float, its inputs preprocessed, and its output at β = 0 and at β.
fn skip_cell(reduction: bool, beta: f32) -> (Tensor<4>, Tensor<4>, Tensor<4>, Tensor<4>) {
    let d = Device::flex();
    let shape =
        CellShape { c_pp: 4, c_p: 4, c: 4, reduction, reduction_prev: false, nodes: 2, partial: 1 };
    let (cell, s0, s1) = qdarts_ops::seeded(&d, 3, || {
        let cell =
            SearchCell::new(shape, &[Primitive::SkipConnect], &QuantConfig::float(), "cells.0", &d)
                .unwrap();
        let x = || Tensor::<4>::random([2, 4, 8, 8], Distribution::Normal(0.0, 1.0), &d);
        (cell, x(), x())
    });
    let w: Vec<Tensor<1>> = (0..5).map(|_| Tensor::<1>::ones([1], &d)).collect();
    let q = |t: &Tensor<4>| QTensor::float(t.clone());
    let plain = cell.forward(q(&s0), q(&s1), &w, 0.0).value;
    let aux = cell.forward(q(&s0), q(&s1), &w, beta).value;
    let p0 = cell.preproc0.forward(q(&s0)).value;
    let p1 = cell.preproc1.forward(q(&s1)).value;
    (plain, aux, p0, p1)
}

#[test]
fn the_auxiliary_skip_adds_beta_times_each_stride1_input_to_the_node_sum() {
    let beta = 0.375;
    // Normal cell: every edge is an identity, so node 2 = (1+β)(p0+p1) and
    // node 3 = (1+β)(p0+p1+n2); the output concatenates them.
    let (plain, aux, p0, p1) = skip_cell(false, beta);
    let n2 = p0.clone().add(p1.clone()).mul_scalar(1.0 + beta);
    let n3 = p0.add(p1).add(n2.clone()).mul_scalar(1.0 + beta);
    let want = Tensor::cat(vec![n2, n3], 1);
    assert!(max_diff(aux.clone(), want) < 1e-5);
    assert!(max_diff(aux, plain) > 0.1, "β changed nothing");
    // Reduction cell: the edges from the inputs have stride 2 (FactorizedReduce) and get no
    // auxiliary term; the edge from node 2 into node 3 gets β·n2.
    let (plain, aux, _, _) = skip_cell(true, beta);
    let [_, c, _, _] = plain.dims();
    let half = c / 2;
    let n2_plain = plain.clone().slice([0..2, 0..half]);
    let n2_aux = aux.clone().slice([0..2, 0..half]);
    assert!(max_diff(n2_plain.clone(), n2_aux) < 1e-6);
    let n3_plain = plain.slice([0..2, half..c]);
    let n3_aux = aux.slice([0..2, half..c]);
    assert!(max_diff(n3_aux, n3_plain.add(n2_plain.mul_scalar(beta))) < 1e-5);
}

#[test]
fn beta_decays_linearly_to_zero_over_the_search() {
    let g = GuardConfig { aux_skip: 1.0, max_skip: None };
    assert_eq!(g.aux_skip_at(1, 10), 1.0);
    assert!((g.aux_skip_at(6, 10) - 0.5).abs() < 1e-7);
    assert!((g.aux_skip_at(10, 10) - 0.1).abs() < 1e-7);
    assert_eq!(GuardConfig::default().aux_skip_at(1, 10), 0.0);
}

fn tiny(results: &Path, guards: &str) -> ExperimentConfig {
    let text = format!(
        r#"
        name = "guard"
        seed = 4
        [data]
        dataset = "fashion-mnist"
        limit = 64
        [model]
        init_channels = 2
        layers = 3
        nodes = 2
        stem_multiplier = 1
        primitives = ["none", "max_pool_3x3", "skip_connect", "sep_conv_3x3"]
        [search]
        epochs = 2
        batch_size = 8
        steps_per_epoch = 2
        alpha_lr = 0.5
        {guards}
        [record]
        results_dir = "{}"
        "#,
        results.display()
    );
    ExperimentConfig::parse(&text, Path::new("guard.toml"), &[]).unwrap()
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("qdarts-guards-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn skips(text: &str) -> usize {
    let g = Genotype::from_darts_text(text).unwrap();
    g.normal.iter().flatten().filter(|e| e.op == Primitive::SkipConnect).count()
}

#[test]
fn a_search_with_the_guards_keeps_skip_connections_to_the_limit_every_epoch() {
    let d = Device::flex();
    let dir = scratch("search");
    let cfg = tiny(&dir, "[search.guards]\naux_skip = 1.0\nmax_skip = 0");
    let mut go = |_: &qdarts_engine::Progress| ControlFlow::Continue(());
    let out = run_search(&cfg, &d, None, &mut go).unwrap();
    assert!(out.finished);
    assert_eq!(skips(&out.genotype.to_darts_text()), 0);
    let rows = std::fs::read_to_string(out.run_dir.join("genotypes.csv")).unwrap();
    for line in rows.lines().skip(1) {
        let text = line.split_once(',').unwrap().1.trim_matches('"');
        assert_eq!(skips(text), 0, "{line}");
    }
    let config = std::fs::read_to_string(out.run_dir.join("config.toml")).unwrap();
    assert!(config.contains("[search.guards]") && config.contains("max_skip = 0"), "{config}");
}

#[test]
fn guard_settings_out_of_range_are_refused_naming_the_key() {
    let dir = scratch("bad");
    for (guards, key) in [
        ("[search.guards]\naux_skip = -1.0", "search.guards.aux_skip"),
        ("[search.guards]\naux_skip = nan", "search.guards.aux_skip"),
        ("[search.guards]\nmax_skip = 5", "search.guards.max_skip"),
        ("[search.guards]\nmax_sikp = 1", "max_sikp"),
    ] {
        let text = format!(
            "name = \"g\"\n[data]\ndataset = \"fashion-mnist\"\n[model]\ninit_channels = 2\nlayers = 3\nnodes = 2\nstem_multiplier = 1\n[search]\nepochs = 1\nbatch_size = 8\n{guards}\n[record]\nresults_dir = \"{}\"\n",
            dir.display()
        );
        let err = ExperimentConfig::parse(&text, Path::new("g.toml"), &[]).unwrap_err().to_string();
        assert!(err.contains(key), "{guards}: {err}");
    }
    let text = "name = \"g\"\n[data]\ndataset = \"fashion-mnist\"\n[model]\ninit_channels = 2\nlayers = 3\nnodes = 2\nstem_multiplier = 1\nprimitives = [\"none\", \"skip_connect\"]\n[search]\nepochs = 1\nbatch_size = 8\n[search.guards]\nmax_skip = 1\n";
    let err = ExperimentConfig::parse(text, Path::new("g.toml"), &[]).unwrap_err().to_string();
    assert!(err.contains("other than none and skip_connect"), "{err}");
}
