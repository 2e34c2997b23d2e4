//! Perturbation-based selection (DARTS-PT), β-DARTS' regularisation and SDARTS-RS' smoothing:
//! the selection on a hand-built supernet where the strongest α is not the op that matters,
//! β-decay's gradient against finite differences, the smoothing's definition, and a real
//! search through the selection phase, stopped and resumed.

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use std::ops::ControlFlow;
use std::path::Path;

use burn::module::Param;
use burn::tensor::{Device, Tensor, TensorData};
use qdarts_data::Rng;
use qdarts_engine::config::Experiment;
use qdarts_genotypes::{Primitive, softmax};
use qdarts_search::config::{Selection, SelectionOrder};
use qdarts_search::run_search;
use qdarts_search::selection::{
    Measure, Projection, Trial, decide_inputs, decide_op, node_edges, op_candidates, pick,
};
use qdarts_search::step::beta_decay_loss;
use qdarts_search::supernet::{Alphas, smooth_row};

mod common;
use common::{scratch, stop_at, tiny_with};

/// A hand-built one-cell "supernet" of 2 nodes: edge `e`'s output on sample `i` is
/// `Σ_k w[e][k]·f(e, k, i)`, where the projected weights `w` come from the selection's own
/// masks over softmax(α); the logit is the sum over edges and the sample is right when its sign
/// is the label's. On edge 0, skip_connect (α = 3, the strongest) carries only noise and
/// sep_conv_3x3 (α = 0.5) carries the label: taking the conv out breaks the classifier, taking
/// the skip out does not.
struct Toy {
    alpha: Vec<Vec<f32>>,
    labels: Vec<f32>,
    noise: Vec<f32>,
}

const OPS: [Primitive; 4] =
    [Primitive::None, Primitive::MaxPool3x3, Primitive::SkipConnect, Primitive::SepConv3x3];

impl Toy {
    fn new() -> Self {
        let mut rng = Rng::new(11);
        let n = 200;
        let labels = (0..n).map(|_| if rng.coin() { 1.0 } else { -1.0 }).collect();
        let noise = (0..n).map(|_| (rng.below(2001) as f32 - 1000.0) / 1000.0).collect();
        // 5 edges of 2 nodes; every other edge uniform.
        let mut alpha = vec![vec![0.0f32; OPS.len()]; 5];
        alpha[0] = vec![0.0, 0.0, 3.0, 0.5];
        Toy { alpha, labels, noise }
    }

    /// Op `k` of edge `e` on sample `i`.
    fn f(&self, e: usize, k: usize, i: usize) -> f32 {
        let (y, n) = (self.labels[i], self.noise[i]);
        match (e, OPS[k]) {
            (0, Primitive::SkipConnect) => 2.0 * n,
            (0, Primitive::SepConv3x3) => 10.0 * y,
            // Edge 3 (node 1, input 1) helps, edges 2 and 4 add noise.
            (3, Primitive::SepConv3x3) => 2.0 * y,
            (2 | 4, _) => 0.5 * n,
            _ => 0.0,
        }
    }

    fn measure(&self, proj: &Projection, trial: &Trial) -> Measure {
        let k = OPS.len();
        let (keep, fill) = proj.normal.masks(k, trial);
        let w: Vec<f32> = self
            .alpha
            .iter()
            .flat_map(|row| softmax(row))
            .zip(keep.iter().zip(&fill))
            .map(|(s, (keep, fill))| s * keep + fill)
            .collect();
        let n = self.labels.len();
        let (mut right, mut loss) = (0usize, 0.0f64);
        for i in 0..n {
            let logit: f32 = (0..5)
                .flat_map(|e| (0..k).map(move |o| (e, o)))
                .map(|(e, o)| w[e * k + o] * self.f(e, o, i))
                .sum();
            right += usize::from(logit * self.labels[i] > 0.0);
            // Logistic loss.
            loss += f64::from((1.0 + (-logit * self.labels[i]).exp()).ln());
        }
        Measure { top1: right as f64 / n as f64, loss: loss / n as f64 }
    }
}

#[test]
fn the_selection_keeps_the_op_whose_removal_hurts_most_not_the_strongest_alpha() {
    let toy = Toy::new();
    let mut proj = Projection::new(2);
    // Magnitude would keep skip_connect on edge 0.
    let strongest =
        (0..OPS.len()).fold(0, |b, k| if toy.alpha[0][k] > toy.alpha[0][b] { k } else { b });
    assert_eq!(OPS[strongest], Primitive::SkipConnect);

    let candidates = op_candidates(&OPS);
    assert_eq!(candidates, vec![1, 2, 3], "none is never a candidate");
    let d = decide_op(0, &candidates, false, |t| toy.measure(&proj, t));
    let by_op = |op: Primitive| d.measures.iter().find(|m| OPS[m.0] == op).unwrap().1;
    // Removing the conv leaves the noise: about chance; removing the skip helps.
    assert!(by_op(Primitive::SepConv3x3).top1 < 0.7, "{d:?}");
    assert!(by_op(Primitive::SkipConnect).top1 >= d.base.top1, "{d:?}");
    assert_eq!(OPS[d.kept], Primitive::SepConv3x3, "{d:?}");
    proj.normal.ops[0] = Some(d.kept);

    // Decided: the edge is one-hot on the conv, whatever α says.
    let (keep, fill) = proj.normal.masks(OPS.len(), &Trial::Nothing);
    assert_eq!(&keep[..4], &[0.0; 4]);
    assert_eq!(&fill[..4], &[0.0, 0.0, 0.0, 1.0]);

    // The same by loss.
    let d = decide_op(0, &candidates, true, |t| toy.measure(&Projection::new(2), t));
    assert_eq!(OPS[d.kept], Primitive::SepConv3x3);

    // Node 1 reads edges 2, 3, 4: the edge carrying the label stays; of the two noisy ones the
    // one whose removal hurts least goes first.
    for e in 1..5 {
        proj.normal.ops[e] = Some(3);
    }
    let (passes, kept) = decide_inputs(1, false, |t| toy.measure(&proj, t));
    assert_eq!(node_edges(1), vec![2, 3, 4]);
    assert_eq!(passes.len(), 1);
    assert!(kept.contains(&3), "{passes:?} {kept:?}");
    assert_eq!(kept.len(), 2);
    proj.normal.inputs[1] = Some(kept.clone());
    let gone = [2, 3, 4].into_iter().find(|e| !kept.contains(e)).unwrap();
    let (keep, fill) = proj.normal.masks(OPS.len(), &Trial::Nothing);
    assert!(
        keep[gone * 4..gone * 4 + 4].iter().chain(&fill[gone * 4..gone * 4 + 4]).all(|v| *v == 0.0)
    );
}

#[test]
fn a_random_order_is_seeded_and_a_fixed_order_goes_in_turn() {
    let open = [1, 4, 6, 7];
    assert_eq!(pick(&open, SelectionOrder::Fixed, 9, 3, false), 1);
    let a: Vec<usize> = (0..20).map(|r| pick(&open, SelectionOrder::Random, 9, r, false)).collect();
    let b: Vec<usize> = (0..20).map(|r| pick(&open, SelectionOrder::Random, 9, r, false)).collect();
    assert_eq!(a, b);
    assert!(a.iter().all(|e| open.contains(e)));
    let mut seen = a.clone();
    seen.sort_unstable();
    seen.dedup();
    assert!(seen.len() > 1, "{a:?}");
}

#[test]
fn beta_decay_gradient_matches_finite_differences() {
    let d = Device::flex().autodiff();
    let mut rng = Rng::new(3);
    let mut draw =
        || (0..9 * 8).map(|_| (rng.below(4001) as f32 - 2000.0) / 1000.0).collect::<Vec<f32>>();
    let (n0, r0) = (draw(), draw());
    let alphas = |n: &[f32], r: &[f32]| {
        let t = |v: &[f32]| {
            Param::from_tensor(Tensor::<2>::from_data(TensorData::new(v.to_vec(), [9, 8]), &d))
        };
        Alphas { normal: t(n), reduce: t(r), ..Alphas::new(3, 8, &d) }
    };
    // The definition in f64: the mean over the 18 edges of logsumexp(α_edge).
    let loss = |n: &[f32], r: &[f32]| -> f64 {
        n.chunks(8)
            .chain(r.chunks(8))
            .map(|row| row.iter().map(|v| f64::from(*v).exp()).sum::<f64>().ln())
            .sum::<f64>()
            / 18.0
    };
    let a = alphas(&n0, &r0);
    let l = beta_decay_loss(&a);
    let got = f64::from(l.clone().into_scalar::<f32>());
    assert!((got - loss(&n0, &r0)).abs() < 1e-5, "{got}");
    let g = l.backward();
    let gn: Vec<f32> =
        a.normal.val().grad(&g).unwrap().into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
    let gr: Vec<f32> =
        a.reduce.val().grad(&g).unwrap().into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
    let h = 1e-3f32;
    for i in (0..72).step_by(5) {
        for (which, grad) in [(0, &gn), (1, &gr)] {
            let (mut p, mut m) = ((n0.clone(), r0.clone()), (n0.clone(), r0.clone()));
            let (pv, mv) = if which == 0 { (&mut p.0, &mut m.0) } else { (&mut p.1, &mut m.1) };
            pv[i] += h;
            mv[i] -= h;
            let fd = (loss(&p.0, &p.1) - loss(&m.0, &m.1)) / (2.0 * f64::from(h));
            assert!((fd - f64::from(grad[i])).abs() < 1e-5, "α {which} [{i}]: {fd} vs {}", grad[i]);
        }
    }
    // And the closed form: softmax(α_edge) / edges.
    let s = softmax(&n0[8..16]);
    for k in 0..8 {
        assert!((gn[8 + k] - s[k] / 18.0).abs() < 1e-6);
    }
}

#[test]
fn random_smoothing_perturbs_clamps_and_renormalizes() {
    let mut rng = Rng::new(4);
    let w = [0.5f32, 0.3, 0.15, 0.05];
    for _ in 0..100 {
        // The definition, on a copy of the generator: w + U(-ε, ε), clamped, renormalized.
        let mut twin = rng.clone();
        let raw: Vec<f64> = w
            .iter()
            .map(|v| {
                let u = (twin.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
                (f64::from(*v) + 0.1 * (2.0 * u - 1.0)).clamp(0.0, 1.0)
            })
            .collect();
        let sum: f64 = raw.iter().sum();
        let mut row = w;
        smooth_row(&mut row, 0.1, &mut rng);
        for (got, want) in row.iter().zip(&raw) {
            assert!((f64::from(*got) - want / sum).abs() < 1e-6, "{row:?} vs {raw:?}");
        }
        assert_eq!(rng, twin);
    }
    // A row pushed all below 0 becomes one-hot on its largest perturbed value.
    let mut row = [-0.2f32, -0.6, -0.9];
    smooth_row(&mut row, 0.1, &mut Rng::new(1));
    assert_eq!(row, [1.0, 0.0, 0.0]);
    // ε = 0 changes nothing.
    let mut row = w;
    smooth_row(&mut row, 0.0, &mut rng);
    assert!(row.iter().zip(&w).all(|(a, b)| (a - b).abs() < 1e-6));
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn no_time(run: &Path) -> Vec<(String, Vec<String>)> {
    let metrics = read(&run.join("metrics.csv"))
        .lines()
        .map(|l| l.rsplit_once(',').map(|(a, _)| a.to_string()).unwrap_or_default())
        .collect();
    let mut out = vec![("metrics.csv".to_string(), metrics)];
    for f in ["alphas.csv", "genotypes.csv", "selection.csv", "genotype.txt", "nan_events.csv"] {
        out.push((f.to_string(), read(&run.join(f)).lines().map(String::from).collect()));
    }
    out
}

const SELECTION: &str = r#"
    [search.perturbation]
    tune_epochs = 1
    order = "random"
    eval_images = 16
"#;

#[test]
fn a_search_with_perturbation_selection_decides_every_edge_and_records_why() {
    let cfg = tiny_with(&scratch("pt-whole"), SELECTION, &["search.selection=\"perturbation\""]);
    assert_eq!(cfg.search.selection, Selection::Perturbation);
    let go = |_: &qdarts_engine::Progress| ControlFlow::Continue(());
    let out = run_search(&cfg, &Device::flex(), None, &mut { go }).unwrap();
    assert!(out.finished);
    // 2 search epochs, then 5 edges + 1 node (2 nodes) = 6 rounds, each followed by 1 epoch.
    let metrics = read(&out.run_dir.join("metrics.csv"));
    assert_eq!(metrics.lines().filter(|l| l.contains(",val,")).count(), 8, "{metrics}");
    let rows = read(&out.run_dir.join("selection.csv"));
    let lines: Vec<&str> = rows.lines().skip(1).collect();
    // Op rounds: 5 edges × 2 cells × 7 candidates (none excluded); the node with 3 inputs:
    // one pass of 3 edges × 2 cells.
    assert_eq!(lines.len(), 5 * 2 * 7 + 2 * 3, "{rows}");
    assert_eq!(lines.iter().filter(|l| l.ends_with(",kept")).count(), 10);
    assert_eq!(lines.iter().filter(|l| l.ends_with(",removed")).count(), 2);
    // Decisions at the end of epochs 1..=6: the op rounds at 1..=5, the node round at 6.
    for (i, epoch) in (1..=6).enumerate() {
        let at = lines.iter().filter(|l| l.starts_with(&format!("{epoch},"))).count();
        assert_eq!(at, if i < 5 { 14 } else { 6 }, "epoch {epoch}: {rows}");
    }
    // The genotype is what the rows decided: each kept op has its `kept` row, and node 1's
    // inputs are the two edges not removed.
    let g = &out.genotype;
    for (cell, name) in [(&g.normal, "normal"), (&g.reduce, "reduce")] {
        assert_eq!(cell.len(), 2);
        for (node, edges) in cell.iter().enumerate() {
            assert_eq!(edges.len(), 2);
            for e in edges {
                let edge = qdarts_genotypes::edge_index(node, e.input);
                let want = format!("{name},op,{node},{edge},{},", e.op);
                assert!(
                    lines.iter().any(|l| l.contains(&want) && l.ends_with(",kept")),
                    "{want} not kept in {rows}"
                );
                let removed = format!("{name},input,{node},{edge},");
                assert!(!lines.iter().any(|l| l.contains(&removed) && l.ends_with(",removed")));
            }
        }
    }
    assert_eq!(read(&out.run_dir.join("genotype.txt")).trim(), g.to_darts_text());
    let config = read(&out.run_dir.join("config.toml"));
    assert!(config.contains("selection = \"perturbation\"") && config.contains("tune_epochs = 1"));
}

#[test]
fn a_selection_stopped_and_resumed_equals_an_uninterrupted_one() {
    let sets = [
        "search.selection=\"perturbation\"",
        "search.guards.random_smoothing=0.3",
        "search.guards.beta_decay=5",
    ];
    let whole_cfg = tiny_with(&scratch("pt-resume-whole"), SELECTION, &sets);
    let go = |_: &qdarts_engine::Progress| ControlFlow::Continue(());
    let whole = run_search(&whole_cfg, &Device::flex(), None, &mut { go }).unwrap();
    assert!(whole.finished);

    // Stopped inside the second fine-tuning epoch (global step 8 of 16: after two rounds),
    // then at the last step of epoch 5, then run to the end.
    let cfg = tiny_with(&scratch("pt-resume-stopped"), SELECTION, &sets);
    let part = run_search(&cfg, &Device::flex(), None, &mut stop_at(7)).unwrap();
    assert!(!part.finished);
    let state = read(&part.run_dir.join("checkpoint/selection.json"));
    assert!(state.contains("\"ops\""), "{state}");
    let part = run_search(&cfg, &Device::flex(), Some(&part.run_dir), &mut stop_at(12)).unwrap();
    assert!(!part.finished);
    let done = run_search(&cfg, &Device::flex(), Some(&part.run_dir), &mut { go }).unwrap();
    assert!(done.finished);
    assert_eq!(done.genotype, whole.genotype);
    for ((f, a), (_, b)) in no_time(&whole.run_dir).iter().zip(&no_time(&done.run_dir)) {
        assert_eq!(a, b, "{f} differs after two stops and resumes");
    }
}

#[test]
fn guards_off_leave_the_config_as_it_was_and_bad_values_name_their_key() {
    let cfg = tiny_with(&scratch("pt-off"), "", &[]);
    let text = cfg.to_toml().unwrap();
    for key in ["beta_decay", "random_smoothing", "selection", "perturbation"] {
        assert!(!text.contains(key), "{key} in {text}");
    }
    let bad = |extra: &str, sets: &[&str], key: &str| {
        let set: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        let text = common::tiny_text(&scratch("pt-bad"), extra);
        let e = qdarts_search::config::ExperimentConfig::parse(&text, Path::new("t.toml"), &set)
            .unwrap_err()
            .to_string();
        assert!(e.contains(key), "{e}");
    };
    bad("", &["search.guards.beta_decay=-1"], "search.guards.beta_decay");
    bad("", &["search.guards.random_smoothing=2"], "search.guards.random_smoothing");
    bad(SELECTION, &[], "search.perturbation");
    bad(
        "",
        &["search.selection=\"perturbation\"", "search.guards.max_skip=1"],
        "search.guards.max_skip",
    );
    bad("", &["search.selection=\"sideways\""], "selection");
}

#[test]
fn a_nan_in_the_fine_tuning_rolls_back_to_the_last_decision_and_the_selection_finishes() {
    // Global step 9 is the first fine-tuning step after round 3 (epoch 4): the rollback goes
    // back to the end of epoch 3, whose checkpoint holds the first three rounds' decisions.
    let extra = format!("{SELECTION}\n[nan_guard]\npolicy = \"rollback\"");
    let cfg = tiny_with(&scratch("pt-nan"), &extra, &["search.selection=\"perturbation\""]);
    let out = common::search_with_nan(&cfg, 9, qdarts_engine::InjectSite::Loss).unwrap();
    assert!(out.finished);
    let events = read(&out.run_dir.join("nan_events.csv"));
    assert!(
        events.contains("4,9,loss,loss,NaN,rolled_back") && events.contains("lr_halved"),
        "{events}"
    );
    let rows = read(&out.run_dir.join("selection.csv"));
    assert_eq!(rows.lines().count() - 1, 5 * 2 * 7 + 2 * 3, "every decision once: {rows}");
    assert_eq!(read(&out.run_dir.join("genotype.txt")).trim(), out.genotype.to_darts_text());
}
