//! The search loop: per step an architecture step on a validation batch and a weight step on a
//! training batch; per epoch a validation pass, the α and the derived genotype, and a
//! checkpoint. Everything goes to the run record; progress goes to a callback.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::module::Module;
use burn::optim::decay::WeightDecayConfig;
use burn::optim::momentum::MomentumConfig;
use burn::optim::{AdamConfig, GradientsParams, ModuleOptimizer, SgdConfig};
use burn::tensor::Device;
use qdarts_genotypes::Genotype;
use qdarts_ops::candidates::QuantSites;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::architect::{self, Batch, clip_grad_norm, correct, cross_entropy};
use crate::config::{ConfigError, ExperimentConfig, NanPolicy, NanSite, Order, SearchConfig};
use crate::data::{self, DataError, ImageSet};
use crate::record::{Csv, RecordError, RunDir, quant_row, quote, truncate_csv_to, write_atomic};
use crate::rng::Rng;
use crate::supernet::{Alphas, NetShape, SearchNetwork};

/// Why a search stopped.
#[derive(Debug, Error)]
pub enum SearchError {
    /// Bad config.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Bad data.
    #[error(transparent)]
    Data(#[from] DataError),
    /// Run folder trouble.
    #[error(transparent)]
    Record(#[from] RecordError),
    /// A quantization spec that does not fit the network.
    #[error("quantization: {0}")]
    Quant(#[from] qdarts_ops::quant::SpecError),
    /// The genotype could not be derived.
    #[error(transparent)]
    Genotype(#[from] qdarts_genotypes::GenotypeError),
    /// A checkpoint that cannot be written or read.
    #[error("checkpoint {path}: {message}")]
    Checkpoint {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// Too many non-finite values.
    #[error("aborted after {0} non-finite events (see nan_events.csv)")]
    NanAbort(usize),
}

/// Where the search is, for a progress display.
#[derive(Debug, Clone, PartialEq)]
pub struct Progress {
    /// Current epoch (0-based).
    pub epoch: usize,
    /// Epochs in all.
    pub epochs: usize,
    /// Step within the epoch (1-based after a step).
    pub step: usize,
    /// Steps per epoch.
    pub steps: usize,
    /// Last training loss.
    pub loss: f64,
    /// Running training top-1 of the epoch.
    pub top1: f64,
}

/// Serializes seeding and random initialization of the backend's process-wide generator.
pub(crate) static INIT_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// What the checkpoint carries besides the modules and optimizers.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct CheckpointState {
    /// Epochs completed.
    epochs_done: usize,
    /// Global step.
    step: usize,
    /// Data-order generator.
    rng: u64,
    /// Non-finite events so far.
    nan_events: usize,
    /// Factor on the weight learning rate (halved by each rollback).
    #[serde(default = "one")]
    lr_scale: f64,
    /// Steps of the epoch `epochs_done` already taken (0: the checkpoint is at an epoch start).
    #[serde(default)]
    step_in_epoch: usize,
    /// Data-order generator at the start of that epoch (it shuffles the epoch's order).
    #[serde(default)]
    epoch_rng: u64,
    /// Training images seen and classified right so far in that epoch (running top-1).
    #[serde(default)]
    seen: usize,
    /// See `seen`.
    #[serde(default)]
    right: usize,
}

fn one() -> f64 {
    1.0
}

/// The result of a search that finished or was stopped.
#[derive(Debug, Clone)]
pub struct SearchOutcome {
    /// The run folder.
    pub run_dir: PathBuf,
    /// The final genotype (on a stop: the genotype of the current α).
    pub genotype: Genotype,
    /// Whether the search ran all its epochs. A stopped search has saved a checkpoint at the
    /// step it stopped after; `--resume` continues from there.
    pub finished: bool,
}

/// The learning rate of epoch `e` of `n` under cosine annealing (PyTorch `CosineAnnealingLR`
/// stepped per epoch, as pt.darts does).
pub fn cosine_lr(lr: f64, lr_min: f64, e: usize, n: usize) -> f64 {
    lr_min + 0.5 * (lr - lr_min) * (1.0 + (std::f64::consts::PI * e as f64 / n as f64).cos())
}

fn shape(cfg: &ExperimentConfig, set: &ImageSet) -> NetShape {
    NetShape {
        c_in: set.channels,
        classes: set.classes,
        channels: cfg.model.init_channels,
        layers: cfg.model.layers,
        nodes: cfg.model.nodes,
        stem_multiplier: cfg.model.stem_multiplier,
        primitives: cfg.model.primitives.clone(),
        partial_channels: cfg.model.partial_channels,
    }
}

fn optimizers(cfg: &ExperimentConfig) -> (ModuleOptimizer, ModuleOptimizer) {
    let s = &cfg.search;
    let w = SgdConfig::new()
        .with_momentum(Some(MomentumConfig {
            momentum: s.w_momentum,
            dampening: 0.0,
            nesterov: false,
        }))
        .with_weight_decay(Some(WeightDecayConfig { penalty: s.w_weight_decay as f32 }))
        .init();
    let a = AdamConfig::new()
        .with_beta_1(s.alpha_betas[0] as f32)
        .with_beta_2(s.alpha_betas[1] as f32)
        .with_epsilon(1e-8)
        .with_weight_decay(Some(WeightDecayConfig { penalty: s.alpha_weight_decay as f32 }))
        .init();
    (w, a)
}

/// The files of the run record.
struct Record {
    metrics: Csv,
    nan: Csv,
    quant: Csv,
    alphas: Csv,
    genotypes: Csv,
}

impl Record {
    fn open(run: &RunDir) -> Result<Self, RecordError> {
        Ok(Record {
            metrics: run.csv("metrics.csv", "epoch,step,phase,loss,top1,lr,arch_lr,seconds")?,
            nan: run.csv("nan_events.csv", "epoch,step,site,layer,value,action")?,
            quant: run.csv(
                "quant_error.csv",
                "epoch,step,layer,kind,bits,scale,zero_point,mse,sqnr_db,clip_frac",
            )?,
            alphas: run.csv("alphas.csv", "epoch,cell_type,edge,op,weight")?,
            genotypes: run.csv("genotypes.csv", "epoch,genotype")?,
        })
    }
}

/// The CSV files, and whether their second field is the global step.
const CSVS: [(&str, bool); 5] = [
    ("metrics.csv", true),
    ("nan_events.csv", true),
    ("quant_error.csv", true),
    ("alphas.csv", false),
    ("genotypes.csv", false),
];

/// Cuts every CSV file back to what the checkpoint `ck` had seen: rows of earlier epochs, and
/// rows of its epoch up to its step.
fn truncate_record(run: &RunDir, ck: &CheckpointState, keep_nan: bool) -> Result<(), RecordError> {
    for (name, stepped) in CSVS {
        if keep_nan && name == "nan_events.csv" {
            continue;
        }
        truncate_csv_to(&run.file(name), ck.epochs_done, stepped.then_some(ck.step))?;
    }
    Ok(())
}

pub(crate) fn ckpt_err(path: &Path, e: impl std::fmt::Display) -> SearchError {
    SearchError::Checkpoint { path: path.into(), message: e.to_string() }
}

/// Everything the loop carries from step to step.
struct State {
    net: SearchNetwork,
    alphas: Alphas,
    w_optim: ModuleOptimizer,
    a_optim: ModuleOptimizer,
    ckpt: CheckpointState,
}

/// Writes a checkpoint folder with `fill` into `checkpoint.tmp`, then swaps it in for
/// `checkpoint`: the old one stays until the new one is complete.
pub(crate) fn replace_checkpoint(
    run: &RunDir,
    fill: impl FnOnce(&Path) -> Result<(), SearchError>,
) -> Result<(), SearchError> {
    let tmp = run.file("checkpoint.tmp");
    let dest = run.file("checkpoint");
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| ckpt_err(&tmp, e))?;
    fill(&tmp)?;
    let old = run.file("checkpoint.old");
    let _ = std::fs::remove_dir_all(&old);
    if dest.exists() {
        std::fs::rename(&dest, &old).map_err(|e| ckpt_err(&dest, e))?;
    }
    std::fs::rename(&tmp, &dest).map_err(|e| ckpt_err(&dest, e))?;
    let _ = std::fs::remove_dir_all(&old);
    Ok(())
}

fn save_checkpoint(run: &RunDir, st: &State) -> Result<(), SearchError> {
    // A running state (BN statistics, observer ranges) records its last update per thread
    // and folds it in only on a sync; saving reads the folded value. `valid()` syncs them all.
    drop(st.net.valid());
    replace_checkpoint(run, |tmp| {
        st.net.clone().save_file(tmp.join("net.bpk")).map_err(|e| ckpt_err(tmp, e))?;
        st.alphas.clone().save_file(tmp.join("alphas.bpk")).map_err(|e| ckpt_err(tmp, e))?;
        st.w_optim.save(tmp.join("w_optim.bpk")).map_err(|e| ckpt_err(tmp, e))?;
        st.a_optim.save(tmp.join("a_optim.bpk")).map_err(|e| ckpt_err(tmp, e))?;
        let json = serde_json::to_vec_pretty(&st.ckpt).map_err(|e| ckpt_err(tmp, e))?;
        Ok(write_atomic(&tmp.join("state.json"), &json)?)
    })
}

fn load_checkpoint(run: &RunDir, st: State) -> Result<State, SearchError> {
    let dir = run.file("checkpoint");
    let state_path = dir.join("state.json");
    let text = std::fs::read(&state_path).map_err(|e| ckpt_err(&state_path, e))?;
    let ckpt: CheckpointState =
        serde_json::from_slice(&text).map_err(|e| ckpt_err(&state_path, e))?;
    let net =
        st.net.try_load_file(dir.join("net.bpk")).map_err(|e| ckpt_err(&dir.join("net.bpk"), e))?;
    let alphas = st
        .alphas
        .try_load_file(dir.join("alphas.bpk"))
        .map_err(|e| ckpt_err(&dir.join("alphas.bpk"), e))?;
    let w_optim = st
        .w_optim
        .load(dir.join("w_optim.bpk"))
        .map_err(|e| ckpt_err(&dir.join("w_optim.bpk"), e))?;
    let a_optim = st
        .a_optim
        .load(dir.join("a_optim.bpk"))
        .map_err(|e| ckpt_err(&dir.join("a_optim.bpk"), e))?;
    Ok(State { net, alphas, w_optim, a_optim, ckpt })
}

fn f(v: f64) -> String {
    format!("{v:.6}")
}

/// The architecture step: α's gradient on a validation batch (first or second order), then
/// an Adam step. `batches` is `(train, validation)`; `lr` is the current weight learning rate
/// (ξ of the second-order virtual step).
pub fn arch_step(
    net: &SearchNetwork,
    alphas: Alphas,
    optim: &mut ModuleOptimizer,
    (train, val): (&Batch, &Batch),
    lr: f64,
    s: &SearchConfig,
) -> Alphas {
    let da = match s.order {
        Order::First => architect::first_order(net, &alphas, val),
        Order::Second => architect::second_order(net, &alphas, train, val, lr, s.w_weight_decay),
    };
    let grads = da.into_params(&alphas);
    optim.step(s.alpha_lr, alphas, grads)
}

/// The weight step without the run record: forward, backward, global-norm clip, SGD. Returns
/// the new network and the training loss.
pub fn weight_step(
    net: SearchNetwork,
    alphas: &Alphas,
    optim: &mut ModuleOptimizer,
    train: &Batch,
    lr: f64,
    s: &SearchConfig,
) -> (SearchNetwork, f64) {
    let (wn, wr) = alphas.weights();
    let logits = net.forward(train.0.clone(), wn.detach(), wr.detach());
    let loss = cross_entropy(logits, train.1.clone());
    let value = loss.clone().into_scalar::<f32>() as f64;
    let mut grads = loss.backward();
    let mut gw = GradientsParams::from_module(&mut grads, &net);
    clip_grad_norm(&mut gw, &net, s.w_grad_clip);
    (optim.step(lr, net, gw), value)
}

/// The optimizers of a search as configured: SGD for the weights, Adam for α.
pub fn build_optimizers(cfg: &ExperimentConfig) -> (ModuleOptimizer, ModuleOptimizer) {
    optimizers(cfg)
}

/// Runs (or resumes) a search and writes its run record. `progress` is called after every
/// step; when it returns `Break` the search saves a checkpoint at that step and returns
/// (`finished: false`), so that `--resume` continues exactly there.
pub fn run_search(
    cfg: &ExperimentConfig,
    device: &Device,
    resume: Option<&Path>,
    progress: &mut dyn FnMut(&Progress) -> ControlFlow<()>,
) -> Result<SearchOutcome, SearchError> {
    let run = match resume {
        Some(dir) => RunDir::open(dir)?,
        None => RunDir::create(&cfg.record.results_dir, &cfg.name)?,
    };
    let dir = run.path().to_path_buf();
    let out = run_search_in(cfg, device, run, resume.is_some(), progress);
    if out.is_err() && resume.is_none() {
        // Failed before writing anything (bad data, say): leave no empty run folder behind.
        // (`remove_dir` removes only an empty folder.)
        let _ = std::fs::remove_dir(&dir);
    }
    out
}

/// [`run_search`] in a run folder the caller holds (so it knows the folder before the first
/// step, e.g. to show a dashboard on it). `resume`: continue from its checkpoint if it has one.
pub fn run_search_in(
    cfg: &ExperimentConfig,
    device: &Device,
    run: RunDir,
    resume: bool,
    progress: &mut dyn FnMut(&Progress) -> ControlFlow<()>,
) -> Result<SearchOutcome, SearchError> {
    let mut train_set = data::load(cfg.data.dataset, cfg.data.path.as_deref(), true)?;
    if cfg.data.limit > 0 {
        train_set.truncate(cfg.data.limit);
    }
    let (train_idx, val_idx) = data::darts_split(train_set.len(), cfg.data.train_portion);
    let bs = cfg.search.batch_size;
    let mut steps = train_idx.len().min(val_idx.len()) / bs;
    if steps == 0 {
        return Err(SearchError::Config(ConfigError::Invalid {
            path: "config".into(),
            key: "search.batch_size".into(),
            message: format!(
                "{bs} is larger than each half of the {} training images",
                train_set.len()
            ),
        }));
    }
    if cfg.search.steps_per_epoch > 0 {
        steps = steps.min(cfg.search.steps_per_epoch);
    }

    let ad = device.clone().autodiff();
    let (net, alphas) = {
        // The backend's generator is process-wide: hold it from seeding to the last random
        // initial value, so that two searches in one process (tests) cannot interleave draws.
        let _guard = INIT_LOCK.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        ad.seed(cfg.seed);
        let net = SearchNetwork::new(&shape(cfg, &train_set), &cfg.quant, &ad)?;
        let alphas = Alphas::new(cfg.model.nodes, cfg.model.primitives.len(), &ad);
        (net, alphas)
    };
    let (w_optim, a_optim) = optimizers(cfg);
    let fresh = CheckpointState {
        epochs_done: 0,
        step: 0,
        rng: cfg.seed,
        nan_events: 0,
        lr_scale: 1.0,
        step_in_epoch: 0,
        epoch_rng: cfg.seed,
        seen: 0,
        right: 0,
    };
    let mut st = State { net, alphas, w_optim, a_optim, ckpt: fresh };
    if resume && run.file("checkpoint").join("state.json").exists() {
        st = load_checkpoint(&run, st)?;
        truncate_record(&run, &st.ckpt, false)?;
    } else if resume {
        // Killed before the first checkpoint: start over in the same folder.
        for (name, _) in CSVS {
            let _ = std::fs::remove_file(run.file(name));
        }
    }
    run.write_atomic("config.toml", cfg.to_toml().as_bytes())?;
    // What a dashboard needs for progress and ETA.
    let plan = serde_json::json!({
        "epochs": cfg.search.epochs,
        "steps_per_epoch": steps,
        "batch_size": bs,
        "train_images": train_idx.len(),
        "val_images": val_idx.len(),
    });
    run.write_atomic("plan.json", plan.to_string().as_bytes())?;
    if !run.file("checkpoint").exists() {
        // The state a rollback in the first epoch returns to.
        save_checkpoint(&run, &st)?;
    }
    let mut rec = Record::open(&run)?;
    let mut rng = Rng::from_state(st.ckpt.rng);
    let start = Instant::now();
    let kind = cfg.data.dataset;
    let s = &cfg.search;
    let every = cfg.record.quant_error_every;
    let ckpt_every = cfg.record.checkpoint_every;
    let mut injected = false;

    let mut epoch = st.ckpt.epochs_done;
    let mut stop_after_epoch = false;
    'epochs: while epoch < s.epochs {
        let lr = cosine_lr(s.w_lr, s.w_lr_min, epoch, s.epochs) * st.ckpt.lr_scale;
        // A checkpoint taken inside this epoch replays the epoch's shuffle from the generator
        // state at the epoch start, then continues with the state at its step.
        let first = std::mem::take(&mut st.ckpt.step_in_epoch).min(steps);
        let epoch_rng = if first > 0 { st.ckpt.epoch_rng } else { rng.state() };
        rng = Rng::from_state(epoch_rng);
        let mut order_t = train_idx.clone();
        let mut order_v = val_idx.clone();
        rng.shuffle(&mut order_t);
        rng.shuffle(&mut order_v);
        let (mut seen, mut right) = (0usize, 0usize);
        if first > 0 {
            rng = Rng::from_state(st.ckpt.rng);
            (seen, right) = (st.ckpt.seen, st.ckpt.right);
        }
        for i in first..steps {
            st.ckpt.step += 1;
            let step = st.ckpt.step;
            let tb: Batch =
                data::batch(&train_set, kind, &order_t[i * bs..(i + 1) * bs], Some(&mut rng), &ad);
            let vb: Batch =
                data::batch(&train_set, kind, &order_v[i * bs..(i + 1) * bs], Some(&mut rng), &ad);

            let alphas_before = st.alphas.clone();
            st.alphas = arch_step(&st.net, st.alphas.clone(), &mut st.a_optim, (&tb, &vb), lr, s);

            // Weight step.
            let record_quant = every > 0 && (step.is_multiple_of(every) || i + 1 == steps);
            st.net.set_recording(record_quant);
            let (wn, wr) = st.alphas.weights();
            let logits = st.net.forward(tb.0.clone(), wn.detach(), wr.detach());
            let mut loss = cross_entropy(logits.clone(), tb.1.clone());
            let inject = !injected && cfg.nan_guard.inject_step == Some(step);
            injected |= inject;
            if inject && cfg.nan_guard.inject_site == NanSite::Loss {
                loss = loss.mul_scalar(f32::NAN);
            }
            let loss_value = loss.clone().into_scalar::<f32>() as f64;
            let mut grads = loss.backward();
            let mut gw = GradientsParams::from_module(&mut grads, &st.net);
            if inject && cfg.nan_guard.inject_site == NanSite::Grad {
                architect::scale_grads(&mut gw, &st.net, f32::NAN);
            }
            let norm = clip_grad_norm(&mut gw, &st.net, s.w_grad_clip);
            // (the gradients are left unclipped when their norm is not finite)
            let mut events = Vec::new();
            if !loss_value.is_finite() {
                events.push(("loss", "loss".to_string(), loss_value));
            }
            if loss_value.is_finite() && !norm.is_finite() {
                let layer =
                    architect::first_non_finite_grad(&gw, &st.net).unwrap_or_else(|| "net".into());
                events.push(("grad", layer, norm));
            }
            let (an, ar) = st.alphas.to_rows();
            if an.iter().chain(&ar).flatten().any(|v| !v.is_finite()) {
                events.push(("alpha", "alphas".to_string(), f64::NAN));
            }
            // Quantizer scales, on the steps whose statistics are recorded.
            let qstats = if record_quant { st.net.quant_stats() } else { Vec::new() };
            if let Some(q) = qstats.iter().find(|q| !(q.scale.is_finite() && q.scale > 0.0)) {
                events.push(("scale", q.path.clone(), q.scale));
            }
            if events.is_empty() {
                st.net = st.w_optim.step(lr, st.net.clone(), gw);
            } else {
                let rollback = cfg.nan_guard.policy == NanPolicy::Rollback;
                let action = if rollback { "rolled_back" } else { "skipped" };
                let total = st.ckpt.nan_events + events.len();
                for (site, layer, value) in &events {
                    rec.nan.row(&[
                        epoch.to_string(),
                        step.to_string(),
                        site.to_string(),
                        quote(layer),
                        format!("{value}"),
                        action.into(),
                    ])?;
                }
                if total > cfg.nan_guard.max_events {
                    rec.nan.row(&[
                        epoch.to_string(),
                        step.to_string(),
                        "guard".into(),
                        "-".into(),
                        total.to_string(),
                        "aborted".into(),
                    ])?;
                    return Err(SearchError::NanAbort(total));
                }
                if rollback {
                    // Back to the last checkpoint, at half the lr.
                    st = load_checkpoint(&run, st)?;
                    st.ckpt.nan_events = total;
                    st.ckpt.lr_scale *= 0.5;
                    truncate_record(&run, &st.ckpt, true)?;
                    rec = Record::open(&run)?;
                    rec.nan.row(&[
                        epoch.to_string(),
                        step.to_string(),
                        "lr".into(),
                        "-".into(),
                        format!("{}", s.w_lr * st.ckpt.lr_scale),
                        "lr_halved".into(),
                    ])?;
                    rng = Rng::from_state(st.ckpt.rng);
                    epoch = st.ckpt.epochs_done;
                    continue 'epochs;
                }
                // Skip: keep the weights, and undo the α step if α went bad.
                st.ckpt.nan_events = total;
                if events.iter().any(|e| e.0 == "alpha") {
                    st.alphas = alphas_before;
                }
            }
            seen += bs;
            right += correct(logits, tb.1);
            let top1 = right as f64 / seen as f64;
            rec.metrics.row(&[
                epoch.to_string(),
                step.to_string(),
                "train".into(),
                f(loss_value),
                f(top1),
                f(lr),
                f(s.alpha_lr),
                format!("{:.3}", start.elapsed().as_secs_f64()),
            ])?;
            if record_quant {
                for q in &qstats {
                    rec.quant.row(&quant_row(epoch, step, q))?;
                }
                st.net.set_recording(false);
            }
            let flow = progress(&Progress {
                epoch,
                epochs: s.epochs,
                step: i + 1,
                steps,
                loss: loss_value,
                top1,
            });
            let stop = flow.is_break();
            if i + 1 < steps && (stop || (ckpt_every > 0 && step.is_multiple_of(ckpt_every))) {
                st.ckpt.epochs_done = epoch;
                st.ckpt.step_in_epoch = i + 1;
                st.ckpt.epoch_rng = epoch_rng;
                st.ckpt.rng = rng.state();
                (st.ckpt.seen, st.ckpt.right) = (seen, right);
                save_checkpoint(&run, &st)?;
                st.ckpt.step_in_epoch = 0;
            }
            if stop {
                if i + 1 == steps {
                    // The epoch's last step: finish the epoch (validation, α, checkpoint).
                    stop_after_epoch = true;
                    continue;
                }
                let (an, ar) = st.alphas.to_rows();
                let genotype =
                    Genotype::derive(&an, &ar, &cfg.model.primitives, cfg.model.nodes, 2)?;
                return Ok(SearchOutcome {
                    run_dir: run.path().to_path_buf(),
                    genotype,
                    finished: false,
                });
            }
        }

        // Validation pass on the α split, with frozen statistics.
        let eval = st.net.valid();
        let (wn, wr) = st.alphas.valid().weights();
        let (mut vloss, mut vright, mut vn) = (0.0, 0usize, 0usize);
        for chunk in val_idx.chunks(bs).take(steps) {
            let (x, y) = data::batch(&train_set, kind, chunk, None, device);
            let logits = eval.forward(x, wn.clone(), wr.clone());
            vloss += cross_entropy(logits.clone(), y.clone()).into_scalar::<f32>() as f64
                * chunk.len() as f64;
            vright += correct(logits, y);
            vn += chunk.len();
        }
        rec.metrics.row(&[
            epoch.to_string(),
            st.ckpt.step.to_string(),
            "val".into(),
            f(vloss / vn as f64),
            f(vright as f64 / vn as f64),
            f(lr),
            f(s.alpha_lr),
            format!("{:.3}", start.elapsed().as_secs_f64()),
        ])?;

        // α and the genotype of this epoch.
        let (an, ar) = st.alphas.to_rows();
        for (cell, rows) in [("normal", &an), ("reduce", &ar)] {
            for (e, row) in rows.iter().enumerate() {
                let m = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                let z: f32 = row.iter().map(|v| (v - m).exp()).sum();
                for (k, v) in row.iter().enumerate() {
                    rec.alphas.row(&[
                        epoch.to_string(),
                        cell.into(),
                        e.to_string(),
                        cfg.model.primitives[k].to_string(),
                        format!("{:.6}", (v - m).exp() / z),
                    ])?;
                }
            }
        }
        let genotype = Genotype::derive(&an, &ar, &cfg.model.primitives, cfg.model.nodes, 2)?;
        rec.genotypes.row(&[epoch.to_string(), quote(&genotype.to_darts_text())])?;

        st.ckpt.epochs_done = epoch + 1;
        st.ckpt.rng = rng.state();
        (st.ckpt.seen, st.ckpt.right) = (0, 0);
        save_checkpoint(&run, &st)?;
        epoch += 1;
        if stop_after_epoch && epoch < s.epochs {
            return Ok(SearchOutcome {
                run_dir: run.path().to_path_buf(),
                genotype,
                finished: false,
            });
        }
    }

    let (an, ar) = st.alphas.to_rows();
    let genotype = Genotype::derive(&an, &ar, &cfg.model.primitives, cfg.model.nodes, 2)?;
    run.write_atomic("genotype.json", &genotype.to_json())?;
    run.write_atomic("genotype.txt", format!("{}\n", genotype.to_darts_text()).as_bytes())?;
    Ok(SearchOutcome { run_dir: run.path().to_path_buf(), genotype, finished: true })
}
