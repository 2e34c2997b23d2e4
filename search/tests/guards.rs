//! Collapse guards: DARTS-' auxiliary skip connection (β·h on every stride-1 edge, β decaying
//! linearly) held to its closed form on a cell whose only op is skip_connect, P-DARTS' skip
//! limit in a real search, and the guard settings' validation.

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use std::ops::ControlFlow;
use std::path::Path;

use burn::tensor::{Device, Distribution, Tensor};
use qdarts_engine::config::Experiment;
use qdarts_genotypes::{Genotype, Primitive};
use qdarts_ops::candidates::{Pass, QTensor};
use qdarts_ops::qconfig::QuantConfig;
use qdarts_search::config::{ExperimentConfig, GuardConfig};
use qdarts_search::run_search;
use qdarts_search::supernet::{CellShape, SearchCell};

mod common;
use common::{scratch, tiny_shape, tiny_text, tiny_with};

fn max_diff(a: Tensor<4>, b: Tensor<4>) -> f32 {
    a.sub(b).abs().max().into_scalar::<f32>()
}

/// A float cell of 2 nodes whose only op is skip_connect (identity at stride 1,
/// FactorizedReduce at stride 2), and two inputs.
fn skip_only_cell(reduction: bool, seed: u64) -> (SearchCell, Tensor<4>, Tensor<4>) {
    let d = Device::flex();
    let shape =
        CellShape { c_pp: 4, c_p: 4, c: 4, reduction, reduction_prev: false, nodes: 2, partial: 1 };
    qdarts_ops::seeded(&d, seed, || {
        let cell =
            SearchCell::new(shape, &[Primitive::SkipConnect], &QuantConfig::float(), "cells.0", &d)
                .unwrap();
        let x = || Tensor::<4>::random([2, 4, 8, 8], Distribution::Normal(0.0, 1.0), &d);
        (cell, x(), x())
    })
}

fn q(t: &Tensor<4>) -> QTensor {
    QTensor::float(t.clone())
}

/// One weight of 1 per edge (a single op).
fn unit_weights() -> Vec<Tensor<1>> {
    (0..5).map(|_| Tensor::<1>::ones([1], &Device::flex())).collect()
}

/// The skip-only cell's output at β = 0 and at β, and its preprocessed inputs.
fn skip_cell(reduction: bool, beta: f32) -> (Tensor<4>, Tensor<4>, Tensor<4>, Tensor<4>) {
    let (cell, s0, s1) = skip_only_cell(reduction, 3);
    let w = unit_weights();
    let plain = cell.forward(q(&s0), q(&s1), &w, None, 0.0, Pass::default()).value;
    let aux = cell.forward(q(&s0), q(&s1), &w, None, beta, Pass::default()).value;
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
    let g = GuardConfig { aux_skip: 1.0, ..Default::default() };
    assert_eq!(g.aux_skip_at(1, 10), 1.0);
    assert!((g.aux_skip_at(6, 10) - 0.5).abs() < 1e-7);
    assert!((g.aux_skip_at(10, 10) - 0.1).abs() < 1e-7);
    assert_eq!(GuardConfig::default().aux_skip_at(1, 10), 0.0);
}

/// The tiny search with four ops (skip_connect a real contender), a fast α and `guards`.
fn guarded(results: &Path, guards: &str) -> ExperimentConfig {
    let ops = "model.primitives=[\"none\", \"max_pool_3x3\", \"skip_connect\", \"sep_conv_3x3\"]";
    tiny_with(results, guards, &["seed=4", ops, "search.alpha_lr=0.5"])
}

fn skips(text: &str) -> usize {
    let g = Genotype::from_darts_text(text).unwrap();
    g.normal.iter().flatten().filter(|e| e.op == Primitive::SkipConnect).count()
}

#[test]
fn a_search_with_the_guards_keeps_skip_connections_to_the_limit_every_epoch() {
    let d = Device::flex();
    let dir = scratch("search");
    let cfg = guarded(&dir, "[search.guards]\naux_skip = 1.0\nmax_skip = 0");
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
        ("[search.guards]\nmax_param_free = 5", "search.guards.max_param_free"),
        ("[search.guards]\nmax_param_free = -1", "max_param_free"),
    ] {
        let text = tiny_text(&dir, guards);
        let err = ExperimentConfig::parse(&text, Path::new("g.toml"), &[]).unwrap_err().to_string();
        assert!(err.contains(key), "{guards}: {err}");
    }
    let text = tiny_text(&dir, "[search.guards]\nmax_skip = 1");
    let only_skip = ["model.primitives=[\"none\", \"skip_connect\"]".to_string()];
    let err =
        ExperimentConfig::parse(&text, Path::new("g.toml"), &only_skip).unwrap_err().to_string();
    assert!(err.contains("other than none and skip_connect"), "{err}");
    let text = tiny_text(&dir, "[search.guards]\nmax_param_free = 1");
    let no_conv = ["model.primitives=[\"none\", \"max_pool_3x3\", \"skip_connect\"]".to_string()];
    let err =
        ExperimentConfig::parse(&text, Path::new("g.toml"), &no_conv).unwrap_err().to_string();
    assert!(
        err.contains("search.guards.max_param_free") && err.contains("op with weights"),
        "{err}"
    );
}

#[test]
fn a_search_with_the_parameter_free_limit_keeps_convolutions_every_epoch() {
    let d = Device::flex();
    let dir = scratch("param-free");
    let free = |text: &str| {
        let g = Genotype::from_darts_text(text).unwrap();
        g.normal.iter().flatten().filter(|e| !e.op.has_weights()).count()
    };
    // The same search without the limit keeps a parameter-free edge in its normal cell, so the
    // limit (none allowed) has something to do.
    let mut go = |_: &qdarts_engine::Progress| ControlFlow::Continue(());
    let plain = run_search(&guarded(&dir, ""), &d, None, &mut go).unwrap();
    assert!(free(&plain.genotype.to_darts_text()) > 0, "{}", plain.genotype.to_darts_text());
    let cfg = guarded(&dir, "[search.guards]\nmax_param_free = 0");
    let out = run_search(&cfg, &d, None, &mut go).unwrap();
    assert_eq!(free(&out.genotype.to_darts_text()), 0);
    let rows = std::fs::read_to_string(out.run_dir.join("genotypes.csv")).unwrap();
    for line in rows.lines().skip(1) {
        let text = line.split_once(',').unwrap().1.trim_matches('"');
        assert_eq!(free(text), 0, "{line}");
    }
    // The reduction cell is not limited, and α is the unlimited search's: only the derivation
    // differs.
    assert_eq!(out.genotype.reduce, plain.genotype.reduce);
    let alphas = |dir: &Path| std::fs::read_to_string(dir.join("alphas.csv")).unwrap();
    assert_eq!(alphas(&out.run_dir), alphas(&plain.run_dir));
}

#[test]
fn edge_weights_scale_each_edge_in_its_node_sum() {
    let d = Device::flex();
    let (cell, s0, s1) = skip_only_cell(false, 8);
    let e = [0.3f32, 0.7, 0.2, 0.5, 0.3];
    let edge: Vec<Tensor<1>> = e.iter().map(|&v| Tensor::<1>::from_floats([v], &d)).collect();
    let out =
        cell.forward(q(&s0), q(&s1), &unit_weights(), Some(&edge), 0.0, Pass::default()).value;
    let p0 = cell.preproc0.forward(q(&s0)).value;
    let p1 = cell.preproc1.forward(q(&s1)).value;
    let n2 = p0.clone().mul_scalar(e[0]).add(p1.clone().mul_scalar(e[1]));
    let n3 = p0.mul_scalar(e[2]).add(p1.mul_scalar(e[3])).add(n2.clone().mul_scalar(e[4]));
    assert!(max_diff(out, Tensor::cat(vec![n2, n3], 1)) < 1e-5);
}

#[test]
fn the_edge_weight_gradient_matches_a_finite_difference() {
    use burn::module::Param;
    use burn::tensor::Int;
    use qdarts_search::architect::first_order;
    use qdarts_search::supernet::{Alphas, SearchNetwork};

    let d = Device::flex().autodiff();
    let shape = tiny_shape(1);
    let (mut net, alphas, x) = qdarts_ops::seeded(&d, 21, || {
        let net = SearchNetwork::new(&shape, &QuantConfig::float(), &d).unwrap();
        let alphas = Alphas::new(2, 8, &d).with_edge_normalization(&d);
        // β away from 0, so that the node softmaxes are not flat.
        let b = Tensor::<1>::random([5], Distribution::Normal(0.0, 1.0), &d);
        let alphas = Alphas { edge_normal: Some(Param::from_tensor(b)), ..alphas };
        let x = Tensor::<4>::random([4, 1, 12, 12], Distribution::Normal(0.0, 1.0), &d);
        (net, alphas, x)
    });
    let y = Tensor::<1, Int>::from_ints([1, 3, 5, 7], &d);
    // BatchNorm normalizes with the batch's statistics (training mode): for one batch the
    // loss is a smooth function of β alone.
    let g = first_order(&mut net, &alphas, &(x.clone(), y.clone()));
    let ge: Vec<f32> = g
        .edge_normal
        .expect("β gradient")
        .into_data()
        .convert::<f32>()
        .try_to_vec::<f32>()
        .unwrap();
    assert!(g.edge_reduce.is_some());
    let beta: Vec<f32> = alphas
        .edge_normal
        .as_ref()
        .unwrap()
        .val()
        .into_data()
        .convert::<f32>()
        .try_to_vec::<f32>()
        .unwrap();
    let loss_at = |b: Vec<f32>| -> f64 {
        let a = Alphas {
            normal: Param::from_tensor(alphas.normal.val()),
            reduce: Param::from_tensor(alphas.reduce.val()),
            edge_normal: Some(Param::from_tensor(Tensor::<1>::from_floats(b.as_slice(), &d))),
            edge_reduce: alphas.edge_reduce.as_ref().map(|p| Param::from_tensor(p.val())),
            nodes: 2,
            bits: None,
            projection: None,
        };
        let logits = net.forward_arch(x.clone(), a.arch());
        qdarts_engine::grads::cross_entropy(logits, y.clone()).into_scalar::<f64>()
    };
    let h = 1e-2f32;
    for i in 0..5 {
        let (mut up, mut down) = (beta.clone(), beta.clone());
        up[i] += h;
        down[i] -= h;
        let fd = (loss_at(up) - loss_at(down)) / f64::from(2.0 * h);
        let err = (fd - f64::from(ge[i])).abs();
        assert!(err < 2e-3 + 2e-2 * fd.abs(), "β[{i}]: autodiff {} vs difference {fd}", ge[i]);
    }
    assert!(ge.iter().any(|v| v.abs() > 1e-4), "{ge:?}");
}

#[test]
fn a_search_with_edge_normalization_trains_beta_and_ranks_edges_with_it() {
    let d = Device::flex();
    let dir = scratch("edges");
    let cfg = guarded(&dir, "[search.guards]\nedge_normalization = true");
    let mut go = |_: &qdarts_engine::Progress| ControlFlow::Continue(());
    let out = run_search(&cfg, &d, None, &mut go).unwrap();
    assert!(out.finished);
    // Off, the same seed: α start equal, so a different genotype or equal one both happen;
    // what must hold is that the run without β is today's run, bit for bit.
    let dir2 = scratch("edges-off");
    let off = run_search(&guarded(&dir2, ""), &d, None, &mut go).unwrap();
    let dir3 = scratch("edges-off-again");
    let again = run_search(
        &guarded(&dir3, "[search.guards]\nedge_normalization = false"),
        &d,
        None,
        &mut go,
    )
    .unwrap();
    let m = |p: &Path| -> Vec<String> {
        std::fs::read_to_string(p.join("metrics.csv"))
            .unwrap()
            .lines()
            .map(|l| l.rsplit_once(',').unwrap().0.to_string())
            .collect()
    };
    assert_eq!(m(&off.run_dir), m(&again.run_dir));
    assert_ne!(m(&out.run_dir), m(&off.run_dir), "β changed nothing");
}
