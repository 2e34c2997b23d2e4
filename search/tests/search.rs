//! A tiny search end to end: the run record's files and rows, determinism given a seed, and the
//! NaN guard with an injected NaN.

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use std::ops::ControlFlow;
use std::path::Path;

use burn::tensor::Device;
use qdarts_engine::InjectSite;
use qdarts_engine::config::Experiment;
use qdarts_genotypes::{Genotype, Primitive};
use qdarts_ops::candidates::QuantSites;
use qdarts_ops::qconfig::QuantConfig;
use qdarts_record::{QuantErrorRow, TensorRole};
use qdarts_search::config::ExperimentConfig;
use qdarts_search::run_search;
use qdarts_search::supernet::{NetShape, SearchNetwork};

mod common;
use common::{scratch, search_with_nan, stop_at, tiny};

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// metrics.csv without the wall-clock column.
fn metrics_without_time(run: &Path) -> Vec<String> {
    read(&run.join("metrics.csv"))
        .lines()
        .map(|l| l.rsplit_once(',').map(|(a, _)| a.to_string()).unwrap_or_default())
        .collect()
}

#[test]
fn a_tiny_search_writes_the_whole_run_record() {
    let cfg = tiny(&scratch("record"), "");
    let out = run_search(&cfg, &Device::flex(), None, &mut |_| ControlFlow::Continue(())).unwrap();
    let run = &out.run_dir;
    for f in [
        "config.toml",
        "metrics.csv",
        "nan_events.csv",
        "quant_error.csv",
        "alphas.csv",
        "genotypes.csv",
        "genotype.json",
        "genotype.txt",
        "checkpoint/state.json",
        "checkpoint/net.bpk",
    ] {
        assert!(run.join(f).exists(), "missing {f}");
    }
    // The lock file stays, released and empty: the next process takes it atomically.
    assert_eq!(read(&run.join("lock")), "", "lock left held");
    drop(qdarts_record::RunDir::open(run).unwrap());
    // 2 epochs × (2 train steps + 1 validation row), plus the header.
    let metrics = read(&run.join("metrics.csv"));
    assert_eq!(metrics.lines().count(), 7, "{metrics}");
    assert!(metrics.starts_with("epoch,step,phase,loss,top1,lr,arch_lr,seconds\n"));
    // Every quantizer of the network reports at every recorded step.
    let net = qdarts_ops::seeded(&Device::flex(), 5, || {
        SearchNetwork::new(
            &NetShape {
                c_in: 1,
                classes: 10,
                channels: 2,
                layers: 3,
                nodes: 2,
                stem_multiplier: 1,
                primitives: Primitive::DARTS.to_vec(),
                partial_channels: 1,
                bits: None,
            },
            &QuantConfig::default(),
            &Device::flex(),
        )
        .unwrap()
    });
    let quant = read(&run.join("quant_error.csv"));
    let step1: Vec<&str> = quant.lines().filter(|l| l.starts_with("0,1,")).collect();
    assert_eq!(step1.len(), net.quantizers().len());
    assert!(
        quant.contains(",cells.2.edges.4.sep_conv_3x3.op1.pw.weight,weight,8,"),
        "{}",
        &quant[..500]
    );
    assert!(quant.contains(",cells.0.nodes.3.act,act,8,"), "node 3's add");
    // α: 2 epochs × 2 cell types × 5 edges × 8 ops, softmax rows summing to 1.
    let alphas = read(&run.join("alphas.csv"));
    assert_eq!(alphas.lines().count(), 1 + 2 * 2 * 5 * 8);
    let sum: f64 = alphas
        .lines()
        .skip(1)
        .take(8)
        .map(|l| l.rsplit(',').next().unwrap().parse::<f64>().unwrap())
        .sum();
    assert!((sum - 1.0).abs() < 1e-4, "{sum}");
    // The final genotype in both forms, and the last genotypes.csv row.
    let g = Genotype::from_darts_text(&read(&run.join("genotype.txt"))).unwrap();
    assert_eq!(g, Genotype::from_json(&read(&run.join("genotype.json"))).unwrap());
    assert_eq!(g, out.genotype);
    assert!(read(&run.join("genotypes.csv")).lines().last().unwrap().starts_with("1,\"Genotype("));
    let config = read(&run.join("config.toml"));
    assert!(
        config.contains("init_channels = 2") && config.contains("preset = \"tensorrt\""),
        "{config}"
    );
}

#[test]
fn the_same_seed_gives_the_same_metrics_and_genotype() {
    let a = run_search(&tiny(&scratch("det-a"), ""), &Device::flex(), None, &mut |_| {
        ControlFlow::Continue(())
    })
    .unwrap();
    let b = run_search(&tiny(&scratch("det-b"), ""), &Device::flex(), None, &mut |_| {
        ControlFlow::Continue(())
    })
    .unwrap();
    assert_eq!(a.genotype, b.genotype);
    assert_eq!(metrics_without_time(&a.run_dir), metrics_without_time(&b.run_dir));
    assert_eq!(read(&a.run_dir.join("alphas.csv")), read(&b.run_dir.join("alphas.csv")));
}

#[test]
fn an_injected_nan_is_logged_with_its_site_and_the_run_goes_on() {
    let cfg = tiny(&scratch("nan"), "");
    let out = search_with_nan(&cfg, 2, InjectSite::Loss).unwrap();
    let events = read(&out.run_dir.join("nan_events.csv"));
    assert_eq!(events, "epoch,step,site,layer,value,action\n0,2,loss,loss,NaN,skipped\n");
    assert_eq!(read(&out.run_dir.join("metrics.csv")).lines().count(), 7, "the run finished");

    let cfg = tiny(&scratch("nan-grad"), "");
    let out = search_with_nan(&cfg, 3, InjectSite::Grad).unwrap();
    let events = read(&out.run_dir.join("nan_events.csv"));
    let row = events.lines().nth(1).unwrap();
    assert!(row.starts_with("1,3,grad,stem.") && row.ends_with(",NaN,skipped"), "{events}");
}

#[test]
fn a_nan_validation_loss_is_an_event() {
    // Skip: the event is logged and the run goes on.
    let cfg = tiny(&scratch("nan-val"), "");
    let out = search_with_nan(&cfg, 2, InjectSite::Val).unwrap();
    let events = read(&out.run_dir.join("nan_events.csv"));
    assert_eq!(events, "epoch,step,site,layer,value,action\n0,2,eval,val,NaN,skipped\n");
    assert!(out.finished);
    // One event is within `max_events = 1`.
    let cfg = tiny(&scratch("nan-val-abort"), "[nan_guard]\nmax_events = 1\npolicy = \"skip\"");
    let out = search_with_nan(&cfg, 4, InjectSite::Val).unwrap();
    assert!(out.finished);
    assert_eq!(read(&out.run_dir.join("nan_events.csv")).lines().count(), 2);
}

#[test]
fn a_run_whose_every_step_was_skipped_is_an_error() {
    let mut cfg = tiny(&scratch("all-skipped"), "");
    cfg.search.epochs = 1;
    cfg.search.steps_per_epoch = 1;
    let err = search_with_nan(&cfg, 1, InjectSite::Loss).unwrap_err().to_string();
    assert!(err.contains("skipped all 1 steps"), "{err}");
}

#[test]
fn the_guard_aborts_on_the_first_event_past_max_events() {
    // A learning rate that overflows f32 makes every step after the first non-finite.
    let results = scratch("abort");
    let mut cfg = tiny(&results, "[nan_guard]\nmax_events = 3");
    cfg.search.w_lr = 1e38;
    cfg.search.w_lr_min = 0.0;
    cfg.search.epochs = 4;
    let err = run_search(&cfg, &Device::flex(), None, &mut |_| ControlFlow::Continue(()));
    let err = err.unwrap_err().to_string();
    assert!(err.contains("aborted after 4 steps"), "{err}");
    let dir = std::fs::read_dir(&results).unwrap().next().unwrap().unwrap().path();
    let events = read(&dir.join("nan_events.csv"));
    // An event is a step, or a validation, with non-finite values (however many values).
    let groups: std::collections::BTreeSet<(&str, bool)> = events
        .lines()
        .skip(1)
        .filter(|l| !l.contains(",guard,"))
        .map(|l| (l.split(',').nth(1).unwrap(), l.contains(",eval,")))
        .collect();
    assert_eq!(groups.len(), 4, "three tolerated events and the aborting one:\n{events}");
    assert!(events.trim_end().ends_with(",guard,-,4,aborted"), "{events}");
}

#[test]
fn rollback_reloads_the_epoch_start_and_halves_the_learning_rate() {
    let cfg = tiny(&scratch("rollback"), "[nan_guard]\npolicy = \"rollback\"");
    let out = search_with_nan(&cfg, 3, InjectSite::Loss).unwrap();
    let events = read(&out.run_dir.join("nan_events.csv"));
    // Step 3 is the first step of epoch 1; w_lr 0.025 halved.
    assert_eq!(
        events,
        "epoch,step,site,layer,value,action\n1,3,loss,loss,NaN,rolled_back\n1,3,lr,-,0.0125,lr_halved\n"
    );
    // Epoch 1 was rerun from its start: steps 3 and 4 once each, at half the cosine lr
    // (0.001 + 0.5·0.024·(1 + cos(π/2)) = 0.013, halved).
    let metrics = read(&out.run_dir.join("metrics.csv"));
    let epoch1: Vec<&str> = metrics.lines().filter(|l| l.starts_with("1,")).collect();
    assert_eq!(epoch1.len(), 3, "{metrics}");
    assert!(epoch1[0].starts_with("1,3,train,") && epoch1[0].contains(",0.006500,"), "{metrics}");
    assert!(out.run_dir.join("genotype.txt").exists());
}

/// Every CSV file of a run, the wall-clock column of metrics.csv left out.
fn record_without_time(run: &Path) -> Vec<(String, Vec<String>)> {
    let mut out = vec![("metrics.csv".to_string(), metrics_without_time(run))];
    for f in ["quant_error.csv", "alphas.csv", "genotypes.csv", "nan_events.csv", "genotype.txt"] {
        out.push((f.to_string(), read(&run.join(f)).lines().map(String::from).collect()));
    }
    out
}

#[test]
fn a_search_stopped_mid_epoch_resumes_to_the_uninterrupted_result() {
    let four_steps = |name: &str| {
        let mut cfg = tiny(&scratch(name), "");
        cfg.search.steps_per_epoch = 4;
        cfg
    };
    let go = |_: &qdarts_engine::Progress| ControlFlow::Continue(());
    let whole = run_search(&four_steps("whole"), &Device::flex(), None, &mut { go }).unwrap();
    assert!(whole.finished);

    // Stopped after step 2 of epoch 0 (no epoch-end checkpoint yet), then after step 3 of
    // epoch 1 (global step 7), then run to the end.
    let cfg = four_steps("stopped");
    let part = run_search(&cfg, &Device::flex(), None, &mut stop_at(2)).unwrap();
    assert!(!part.finished && !part.run_dir.join("genotype.txt").exists());
    let state = read(&part.run_dir.join("checkpoint/state.json"));
    assert!(state.contains("\"step\": 2") && state.contains("\"step_in_epoch\": 2"), "{state}");
    let part = run_search(&cfg, &Device::flex(), Some(&part.run_dir), &mut stop_at(7)).unwrap();
    assert!(!part.finished);
    let done = run_search(&cfg, &Device::flex(), Some(&part.run_dir), &mut { go }).unwrap();
    assert!(done.finished);
    assert_eq!(done.genotype, whole.genotype);
    for ((f, a), (_, b)) in
        record_without_time(&whole.run_dir).iter().zip(&record_without_time(&done.run_dir))
    {
        assert_eq!(a, b, "{f} differs after two stops and resumes");
    }
}

/// One damaged file in the last checkpoint (a disk that filled, a copy cut short) costs the
/// steps since the checkpoint before it, not the run: `--resume` loads `checkpoint.prev`,
/// cuts the tables back to it, and ends with the uninterrupted run's record.
#[test]
fn a_damaged_last_checkpoint_resumes_from_the_one_before() {
    use qdarts_record::{RunLayout, choose_checkpoint, verify_checkpoint};
    let four_steps = |name: &str| {
        let mut cfg = tiny(&scratch(name), "");
        cfg.search.steps_per_epoch = 4;
        cfg
    };
    let go = |_: &qdarts_engine::Progress| ControlFlow::Continue(());
    let whole =
        run_search(&four_steps("damaged-whole"), &Device::flex(), None, &mut { go }).unwrap();

    // Stopped after global step 7: the last checkpoint is at step 7, the one before at the end
    // of epoch 0 (step 4). Then the last one loses the tail of its architecture optimizer.
    let cfg = four_steps("damaged");
    let part = run_search(&cfg, &Device::flex(), None, &mut stop_at(7)).unwrap();
    let layout = RunLayout::new(&part.run_dir);
    assert!(verify_checkpoint(&layout.checkpoint()).is_ok());
    assert!(verify_checkpoint(&layout.checkpoint_prev()).is_ok());
    let state = read(&layout.checkpoint_prev().join("state.json"));
    assert!(state.contains("\"step\": 4"), "{state}");
    let cut = layout.checkpoint().join("a_optim.bpk");
    let bytes = std::fs::read(&cut).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let choice = choose_checkpoint(&layout);
    assert_eq!(choice.dir.as_deref(), Some(layout.checkpoint_prev().as_path()));
    assert!(choice.damaged[0].reason.contains("a_optim.bpk"), "{:?}", choice.damaged);

    let done = run_search(&cfg, &Device::flex(), Some(&part.run_dir), &mut { go }).unwrap();
    assert!(done.finished);
    assert_eq!(done.genotype, whole.genotype);
    for ((f, a), (_, b)) in
        record_without_time(&whole.run_dir).iter().zip(&record_without_time(&done.run_dir))
    {
        assert_eq!(a, b, "{f} differs after resuming past a damaged checkpoint");
    }
    // The damaged checkpoint was dropped, not kept as the fallback.
    assert!(verify_checkpoint(&layout.checkpoint()).is_ok());
    assert!(verify_checkpoint(&layout.checkpoint_prev()).is_ok());

    // With both checkpoints damaged the resume is an error naming each, and nothing runs.
    for dir in [layout.checkpoint(), layout.checkpoint_prev()] {
        std::fs::write(dir.join("net.bpk"), b"garbage").unwrap();
    }
    let before = read(&part.run_dir.join("metrics.csv"));
    let err = run_search(&cfg, &Device::flex(), Some(&part.run_dir), &mut { go }).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("checkpoint/ does not verify (net.bpk"), "{msg}");
    assert!(msg.contains("checkpoint.prev/ does not verify (net.bpk"), "{msg}");
    assert_eq!(read(&part.run_dir.join("metrics.csv")), before);
}

#[test]
fn rollback_returns_to_a_mid_epoch_checkpoint() {
    let mut cfg =
        tiny(&scratch("rollback-mid"), "checkpoint_every = 2\n[nan_guard]\npolicy = \"rollback\"");
    cfg.search.steps_per_epoch = 4;
    let out = search_with_nan(&cfg, 4, InjectSite::Loss).unwrap();
    // The last checkpoint before step 4 is the one after step 2: steps 3 and 4 are rerun.
    let metrics = read(&out.run_dir.join("metrics.csv"));
    let steps: Vec<&str> = metrics
        .lines()
        .skip(1)
        .filter(|l| l.starts_with("0,") && l.contains(",train,"))
        .map(|l| l.split(',').nth(1).unwrap())
        .collect();
    assert_eq!(steps, ["1", "2", "3", "4"], "{metrics}");
    let events = read(&out.run_dir.join("nan_events.csv"));
    assert!(events.contains("0,4,loss,loss,NaN,rolled_back\n"), "{events}");
    // Steps 1-2 ran at the full cosine lr of epoch 0, steps 3-4 (rerun) at half of it.
    let lr: Vec<&str> =
        metrics.lines().skip(1).take(4).map(|l| l.split(',').nth(5).unwrap()).collect();
    assert_eq!(lr, ["0.025000", "0.025000", "0.012500", "0.012500"], "{metrics}");
}

#[test]
fn bad_configs_name_the_key() {
    let p = Path::new("exp.toml");
    let base = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../experiments/default.toml"),
    )
    .unwrap();
    let err =
        ExperimentConfig::parse(&base, p, &["search.epohcs=3".into()]).unwrap_err().to_string();
    assert!(err.starts_with("--set search.epohcs=3: ") && err.contains("epohcs"), "{err}");
    let err =
        ExperimentConfig::parse(&base, p, &["model.layers=2".into()]).unwrap_err().to_string();
    assert!(err.starts_with("--set model.layers=2: `model.layers`"), "{err}");
    let err = ExperimentConfig::parse(
        &base,
        p,
        &["quant.act.bits=40".into(), "quant.act.observer.kind=\"lsq\"".into()],
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("40"), "{err}");
    let err = ExperimentConfig::parse(&base, p, &["model.primitives=[\"sep_conv_9x9\"]".into()])
        .unwrap_err()
        .to_string();
    assert!(err.contains("sep_conv_9x9"), "{err}");
    // experiments/default.toml has init_channels = 4: K = 3 does not divide it.
    let err = ExperimentConfig::parse(&base, p, &["model.partial_channels=3".into()])
        .unwrap_err()
        .to_string();
    assert!(err.contains("model.partial_channels"), "{err}");
    let pc = ExperimentConfig::parse(&base, p, &["model.partial_channels=2".into()]).unwrap();
    assert_eq!(pc.model.partial_channels, 2);
    // Every shipped experiment parses.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../experiments");
    for name in ["default.toml", "cifar10-darts.toml", "cifar10-pcdarts.toml"] {
        let cfg = ExperimentConfig::load(&dir.join(name), &[]).unwrap();
        if name.contains("pcdarts") {
            assert_eq!(cfg.model.partial_channels, 4);
        }
    }
    let ok = ExperimentConfig::parse(&base, p, &["search.epochs=3".into(), "name=other".into()])
        .unwrap();
    assert_eq!((ok.search.epochs, ok.name.as_str()), (3, "other"));
    // The default experiment limits parameter-free ops, which a perturbation selection does not
    // take: the error says how to remove the key, and an empty `--set` value removes it.
    let default = dir.join("default.toml");
    let perturb = "search.selection=perturbation".to_string();
    let err = ExperimentConfig::load(&default, std::slice::from_ref(&perturb)).unwrap_err();
    assert!(err.to_string().contains("`--set search.guards.max_param_free=`"), "{err}");
    let unset = [perturb, "search.guards.max_param_free=".to_string()];
    let cfg = ExperimentConfig::load(&default, &unset).unwrap();
    assert_eq!(cfg.search.guards.max_param_free, None);
    // Removing a key that is not there changes nothing.
    let cfg = ExperimentConfig::load(&default, &["search.bits.weight=".into()]).unwrap();
    assert!(cfg.search.bits.is_none());
}

#[test]
fn an_lsq_search_starts_from_data_initialised_weight_steps() {
    let results = scratch("lsq");
    let cfg = tiny(&results, "[quant]\npreset = \"lsq\"");
    let go = |_: &qdarts_engine::Progress| ControlFlow::Continue(());
    let out = run_search(&cfg, &Device::flex(), None, &mut { go }).unwrap();
    let rows: Vec<QuantErrorRow> =
        qdarts_record::read_table(&out.run_dir.join("quant_error.csv")).unwrap();
    // The search's initial weights (same seed, shape and quantization).
    let ad = Device::flex().autodiff();
    let shape = qdarts_search::net_shape(&cfg, &qdarts_data::embedded(true).unwrap());
    let net =
        qdarts_ops::seeded(&ad, cfg.seed, || SearchNetwork::new(&shape, &cfg.quant, &ad)).unwrap();
    // Step 1 quantized the initial stem weights on 2·mean|w_c|/sqrt(127) (the row is the mean
    // over output channels).
    let w = net.stem.weight.val();
    let [co, ci, kh, kw] = w.dims();
    let per = w.abs().reshape([co, ci * kh * kw]).mean_dim(1).reshape([co]);
    let want: f64 = per
        .try_to_vec_as::<f32>()
        .unwrap()
        .iter()
        .map(|m| f64::from(2.0 * m / 127f32.sqrt()))
        .sum::<f64>()
        / co as f64;
    let stem = rows.iter().find(|r| r.step == 1 && r.error.layer == "stem.conv.weight").unwrap();
    assert!(
        (stem.error.scale - want).abs() <= 1e-5 * want,
        "step {} vs 2·mean|w|/√Qp {want}",
        stem.error.scale
    );
    // Every weight quantizer of the last step has a real step and a useful SQNR.
    let last = rows.iter().map(|r| r.step).max().unwrap();
    let weights: Vec<&QuantErrorRow> =
        rows.iter().filter(|r| r.step == last && r.error.kind == TensorRole::Weight).collect();
    assert!(!weights.is_empty());
    assert!(
        weights.iter().all(|r| r.error.scale.is_finite() && r.error.scale > 1e-6),
        "a step at 0 or NaN"
    );
    let mut sqnr: Vec<f64> = weights.iter().map(|r| r.error.sqnr_db).collect();
    sqnr.sort_by(f64::total_cmp);
    assert!(sqnr[sqnr.len() / 2] > 20.0, "median weight SQNR {} dB", sqnr[sqnr.len() / 2]);
}

/// The memory estimate errs low, within 25 %, against the peaks `qdarts bench search` measured
/// (docs/results/2026-11-23-speed-cpu.md and this machine, 2026-11-25): refusing a start means
/// it cannot fit, and a run estimated to fit is not far from its estimate.
#[test]
fn the_memory_estimate_errs_low_against_measured_peaks() {
    use qdarts_search::config::Order;
    use qdarts_search::memory::supernet_need;
    let mib = |v: f64| (v * f64::from(1u32 << 20)) as u64;
    // (init_channels, layers, nodes, batch, channels in, side, order, quantized, peak MiB)
    let measured = [
        (4, 4, 3, 32, 1, 28, Order::First, true, 372.8),
        (4, 4, 3, 32, 1, 28, Order::First, false, 217.4),
        (4, 4, 3, 32, 1, 28, Order::Second, true, 593.7),
        (8, 4, 3, 64, 1, 28, Order::First, true, 1307.2),
        (16, 8, 4, 64, 3, 32, Order::First, false, 6057.0),
        (16, 8, 4, 64, 3, 32, Order::First, true, 9985.0),
        (16, 8, 4, 64, 3, 32, Order::Second, false, 7784.0),
        (16, 8, 4, 64, 3, 32, Order::Second, true, 16792.0),
    ];
    for (c, layers, nodes, batch, c_in, side, order, quantized, peak) in measured {
        let mut cfg = tiny(&scratch("memory"), "");
        cfg.search.batch_size = batch;
        cfg.search.order = order;
        if !quantized {
            cfg.quant = QuantConfig::float();
        }
        let shape = NetShape {
            c_in,
            classes: 10,
            channels: c,
            layers,
            nodes,
            stem_multiplier: 3,
            primitives: Primitive::DARTS.to_vec(),
            partial_channels: 1,
            bits: None,
        };
        // The bench measures the step's heap: no process overhead.
        let need = supernet_need(&cfg, &shape, (side, side));
        let est = need.parameters + need.activations;
        let ratio = est as f64 / mib(peak) as f64;
        assert!((0.75..=1.0).contains(&ratio), "C={c} b{batch} {order:?} {quantized}: {ratio:.2}");
    }
}
