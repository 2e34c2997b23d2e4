//! `qdarts train`: quantization-aware training of a genotype's evaluation network (pt.darts'
//! `augment.py`): SGD with momentum, cosine learning rate, gradient clipping, auxiliary loss,
//! drop-path rising linearly over the epochs, cutout on CIFAR. The run record is the search's
//! kind: `metrics.csv` (train rows per step, `val` rows with the test-set accuracy per epoch),
//! `quant_error.csv`, `nan_events.csv`, `plan.json`, atomic checkpoints with resume.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::module::Module;
use burn::optim::decay::WeightDecayConfig;
use burn::optim::momentum::MomentumConfig;
use burn::optim::{GradientsParams, ModuleOptimizer, SgdConfig};
use burn::tensor::Device;
use qdarts_genotypes::Genotype;
use qdarts_ops::candidates::QuantSites;
use qdarts_ops::qconfig::QuantConfig;
use serde::{Deserialize, Serialize};

use crate::architect::{self, clip_grad_norm, correct, cross_entropy};
use crate::augment::{EvalNetwork, EvalShape};
use crate::config::{
    ConfigError, NanGuardConfig, NanPolicy, NanSite, RecordConfig, apply_overrides,
};
use crate::data::{self, DatasetKind, ImageSet};
use crate::record::{Csv, RecordError, RunDir, quant_row, quote, truncate_csv_to, write_atomic};
use crate::rng::Rng;
use crate::search::{Progress, SearchError, ckpt_err, cosine_lr, replace_checkpoint};

/// Data of a training run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainData {
    /// `fashion-mnist` (embedded when `path` is absent), `mnist`, `cifar10`.
    pub dataset: DatasetKind,
    /// Folder of the dataset files.
    #[serde(default)]
    pub path: Option<PathBuf>,
    /// Use only the first `limit` training images (0: all).
    #[serde(default)]
    pub limit: usize,
    /// Evaluate on only the first `test_limit` test images (0: all).
    #[serde(default)]
    pub test_limit: usize,
}

/// The evaluation network.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainModel {
    /// Channels of the first cell.
    pub init_channels: usize,
    /// Cells.
    pub layers: usize,
    /// Stem channels = `stem_multiplier · init_channels`.
    #[serde(default = "three")]
    pub stem_multiplier: usize,
    /// Auxiliary head after the second reduction cell.
    #[serde(default = "yes")]
    pub auxiliary: bool,
    /// Weight of the auxiliary loss.
    #[serde(default = "aux_weight")]
    pub auxiliary_weight: f64,
    /// Drop-path probability at the last epoch (rises linearly from 0).
    #[serde(default = "drop_path")]
    pub drop_path_prob: f64,
}

/// The optimisation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainOpt {
    /// Epochs.
    pub epochs: usize,
    /// Batch size.
    pub batch_size: usize,
    /// Cap on steps per epoch (0: the whole training set).
    #[serde(default)]
    pub steps_per_epoch: usize,
    /// Initial learning rate (cosine annealed per epoch).
    #[serde(default = "lr")]
    pub lr: f64,
    /// Final learning rate.
    #[serde(default)]
    pub lr_min: f64,
    /// SGD momentum.
    #[serde(default = "momentum")]
    pub momentum: f64,
    /// Weight decay.
    #[serde(default = "weight_decay")]
    pub weight_decay: f64,
    /// Global gradient-norm clip.
    #[serde(default = "grad_clip")]
    pub grad_clip: f64,
    /// Cutout square side (0: off); applied to datasets that augment (CIFAR-10).
    #[serde(default = "cutout")]
    pub cutout_length: usize,
}

fn three() -> usize {
    3
}
fn yes() -> bool {
    true
}
fn aux_weight() -> f64 {
    0.4
}
fn drop_path() -> f64 {
    0.2
}
fn lr() -> f64 {
    0.025
}
fn momentum() -> f64 {
    0.9
}
fn weight_decay() -> f64 {
    3e-4
}
fn grad_clip() -> f64 {
    5.0
}
fn cutout() -> usize {
    16
}

/// A training experiment (`experiments/train-*.toml`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    /// Run name.
    pub name: String,
    /// Seed of weights, data order, drop-path and cutout.
    #[serde(default)]
    pub seed: u64,
    /// The genotype: a JSON or DARTS-text file, a search run folder (its `genotype.json`), or
    /// a shipped name (`DARTS_V2`, ...).
    pub genotype: String,
    /// Data.
    pub data: TrainData,
    /// Network.
    pub model: TrainModel,
    /// Optimisation.
    pub train: TrainOpt,
    /// Quantization.
    #[serde(default)]
    pub quant: QuantConfig,
    /// Run record.
    #[serde(default)]
    pub record: RecordConfig,
    /// Non-finite guard (policy `skip` only).
    #[serde(default)]
    pub nan_guard: NanGuardConfig,
}

impl TrainConfig {
    /// Reads a config file, applies `key=value` overrides, and validates.
    pub fn load(path: &Path, overrides: &[String]) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|cause| ConfigError::Io { path: path.into(), cause })?;
        let parse_err = |message: String| ConfigError::Parse { path: path.into(), message };
        let doc = apply_overrides(&text, overrides).map_err(parse_err)?;
        let cfg: TrainConfig =
            doc.try_into().map_err(|e: toml::de::Error| parse_err(e.to_string()))?;
        cfg.validate(path)?;
        Ok(cfg)
    }

    fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        let bad = |key: &str, message: &str| {
            Err(ConfigError::Invalid {
                path: path.into(),
                key: key.into(),
                message: message.into(),
            })
        };
        let (m, t) = (&self.model, &self.train);
        if self.name.is_empty() || self.name.contains(['/', '\\']) {
            return bad("name", "must be a non-empty folder name");
        }
        if m.init_channels < 2 || m.init_channels % 2 != 0 {
            return bad("model.init_channels", "must be even and at least 2");
        }
        if m.layers < 3 || m.stem_multiplier == 0 {
            return bad("model.layers", "must be at least 3 (two reduction cells)");
        }
        if !(0.0..1.0).contains(&m.drop_path_prob) {
            return bad("model.drop_path_prob", "must lie in [0, 1)");
        }
        if !(m.auxiliary_weight.is_finite() && m.auxiliary_weight >= 0.0) {
            return bad("model.auxiliary_weight", "must be a non-negative number");
        }
        if t.epochs == 0 || t.batch_size == 0 {
            return bad("train.epochs", "and train.batch_size must be at least 1");
        }
        if !(t.lr.is_finite() && t.lr > 0.0 && t.grad_clip.is_finite() && t.grad_clip > 0.0) {
            return bad("train.lr", "and train.grad_clip must be positive numbers");
        }
        if !(t.lr_min >= 0.0 && t.lr_min <= t.lr) {
            return bad("train.lr_min", "must lie in [0, lr]");
        }
        if self.nan_guard.policy != NanPolicy::Skip {
            return bad("nan_guard.policy", "training supports `skip` only");
        }
        self.quant.validate().map_err(|e| ConfigError::Invalid {
            path: path.into(),
            key: "quant".into(),
            message: e.to_string(),
        })
    }

    /// The resolved config as TOML.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_default()
    }
}

/// Reads a genotype from a JSON or DARTS-text file, a run folder, or a shipped name.
pub fn resolve_genotype(spec: &str) -> Result<Genotype, SearchError> {
    let p = Path::new(spec);
    let file = if p.is_dir() { p.join("genotype.json") } else { p.to_path_buf() };
    if !file.exists() {
        if p.is_dir() {
            return Err(ckpt_err(
                &file,
                "no genotype.json in this run folder (did its search finish?)",
            ));
        }
        return qdarts_genotypes::known(spec).map_err(|e| SearchError::Checkpoint {
            path: p.into(),
            message: format!("not a file, and {e}"),
        });
    }
    let text = std::fs::read_to_string(&file).map_err(|e| ckpt_err(&file, e))?;
    let g = if text.trim_start().starts_with('{') {
        Genotype::from_json(&text)
    } else {
        Genotype::from_darts_text(text.trim())
    };
    g.map_err(|e| ckpt_err(&file, e))
}

/// The evaluation network's shape for a config and data set.
pub fn eval_shape(cfg: &TrainConfig, set: &ImageSet) -> EvalShape {
    EvalShape {
        c_in: set.channels,
        size: set.height,
        classes: set.classes,
        channels: cfg.model.init_channels,
        layers: cfg.model.layers,
        stem_multiplier: cfg.model.stem_multiplier,
        auxiliary: cfg.model.auxiliary,
    }
}

/// The test set of a config (with `test_limit`).
pub fn test_set(cfg: &TrainConfig) -> Result<ImageSet, SearchError> {
    let mut set = data::load(cfg.data.dataset, cfg.data.path.as_deref(), false)?;
    if cfg.data.test_limit > 0 {
        set.truncate(cfg.data.test_limit);
    }
    Ok(set)
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct TrainState {
    epochs_done: usize,
    step: usize,
    rng: u64,
    nan_events: usize,
    step_in_epoch: usize,
    epoch_rng: u64,
    seen: usize,
    right: usize,
}

fn save(
    run: &RunDir,
    net: &EvalNetwork,
    optim: &ModuleOptimizer,
    st: &TrainState,
) -> Result<(), SearchError> {
    // Running states fold their per-thread updates on a sync; `valid()` syncs them.
    drop(net.valid());
    replace_checkpoint(run, |tmp| {
        net.clone().save_file(tmp.join("net.bpk")).map_err(|e| ckpt_err(tmp, e))?;
        optim.save(tmp.join("optim.bpk")).map_err(|e| ckpt_err(tmp, e))?;
        let json = serde_json::to_vec_pretty(st).map_err(|e| ckpt_err(tmp, e))?;
        Ok(write_atomic(&tmp.join("state.json"), &json)?)
    })
}

/// Loads the network weights of a run's checkpoint into `net`.
pub fn load_net(dir: &Path, net: EvalNetwork) -> Result<EvalNetwork, SearchError> {
    let p = dir.join("checkpoint").join("net.bpk");
    net.try_load_file(&p).map_err(|e| ckpt_err(&p, e))
}

const CSVS: [&str; 3] = ["metrics.csv", "nan_events.csv", "quant_error.csv"];

/// A trained run: its config, genotype and network (weights from its checkpoint), in
/// inference mode.
#[derive(Debug)]
pub struct TrainedRun {
    /// The config it ran with.
    pub cfg: TrainConfig,
    /// Its genotype.
    pub genotype: Genotype,
    /// The network, `valid()`.
    pub net: EvalNetwork,
    /// Epochs completed.
    pub epochs_done: usize,
}

/// Opens a training run folder: `config.toml`, `genotype.json`, `checkpoint/`.
pub fn open_trained(dir: &Path, device: &Device) -> Result<TrainedRun, SearchError> {
    if !dir.is_dir() {
        return Err(ckpt_err(dir, "no such run folder"));
    }
    let cfg = TrainConfig::load(&dir.join("config.toml"), &[])?;
    let gpath = dir.join("genotype.json");
    let text = std::fs::read_to_string(&gpath).map_err(|e| ckpt_err(&gpath, e))?;
    let genotype = Genotype::from_json(&text).map_err(|e| ckpt_err(&gpath, e))?;
    let sp = dir.join("checkpoint").join("state.json");
    let st: TrainState = std::fs::read(&sp)
        .map_err(|e| ckpt_err(&sp, format!("{e} (not a training run, or it never checkpointed)")))
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| ckpt_err(&sp, e)))?;
    let set = test_set(&cfg)?;
    let net = EvalNetwork::new(&eval_shape(&cfg, &set), &genotype, &cfg.quant, device)?;
    let net = load_net(dir, net)?.valid();
    Ok(TrainedRun { cfg, genotype, net, epochs_done: st.epochs_done })
}

/// Test-set loss and top-1 of a network in inference mode.
pub fn evaluate(
    net: &EvalNetwork,
    set: &ImageSet,
    kind: DatasetKind,
    bs: usize,
    device: &Device,
) -> (f64, f64) {
    let idx: Vec<usize> = (0..set.len()).collect();
    let (mut loss, mut right) = (0.0, 0usize);
    for chunk in idx.chunks(bs.max(1)) {
        let (x, y) = data::batch(set, kind, chunk, None, device);
        let logits = net.forward(x);
        loss += cross_entropy(logits.clone(), y.clone()).into_scalar::<f32>() as f64
            * chunk.len() as f64;
        right += correct(logits, y);
    }
    let n = set.len().max(1) as f64;
    (loss / n, right as f64 / n)
}

/// Runs (or resumes) QAT of a genotype's evaluation network in `run`. `progress` is called
/// after every step; `Break` saves a checkpoint there and returns `Ok(false)`.
pub fn run_train_in(
    cfg: &TrainConfig,
    genotype: &Genotype,
    device: &Device,
    run: &RunDir,
    resume: bool,
    progress: &mut dyn FnMut(&Progress) -> ControlFlow<()>,
) -> Result<bool, SearchError> {
    let mut train_set = data::load(cfg.data.dataset, cfg.data.path.as_deref(), true)?;
    if cfg.data.limit > 0 {
        train_set.truncate(cfg.data.limit);
    }
    let test = test_set(cfg)?;
    let t = &cfg.train;
    let bs = t.batch_size;
    let mut steps = train_set.len() / bs;
    if steps == 0 {
        return Err(SearchError::Config(ConfigError::Invalid {
            path: "config".into(),
            key: "train.batch_size".into(),
            message: format!("{bs} is larger than the {} training images", train_set.len()),
        }));
    }
    if t.steps_per_epoch > 0 {
        steps = steps.min(t.steps_per_epoch);
    }
    let ad = device.clone().autodiff();
    let net = {
        let _guard =
            crate::search::INIT_LOCK.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        ad.seed(cfg.seed);
        EvalNetwork::new(&eval_shape(cfg, &train_set), genotype, &cfg.quant, &ad)?
    };
    let mut optim = SgdConfig::new()
        .with_momentum(Some(MomentumConfig {
            momentum: t.momentum,
            dampening: 0.0,
            nesterov: false,
        }))
        .with_weight_decay(Some(WeightDecayConfig { penalty: t.weight_decay as f32 }))
        .init();
    let mut st = TrainState {
        epochs_done: 0,
        step: 0,
        rng: cfg.seed,
        nan_events: 0,
        step_in_epoch: 0,
        epoch_rng: cfg.seed,
        seen: 0,
        right: 0,
    };
    let mut net = net;
    let ck = run.file("checkpoint");
    if resume && ck.join("state.json").exists() {
        let sp = ck.join("state.json");
        let bytes = std::fs::read(&sp).map_err(|e| ckpt_err(&sp, e))?;
        st = serde_json::from_slice(&bytes).map_err(|e| ckpt_err(&sp, e))?;
        net = load_net(run.path(), net)?;
        optim = optim.load(ck.join("optim.bpk")).map_err(|e| ckpt_err(&ck.join("optim.bpk"), e))?;
        for name in CSVS {
            truncate_csv_to(&run.file(name), st.epochs_done, Some(st.step))?;
        }
    } else if resume {
        for name in CSVS {
            let _ = std::fs::remove_file(run.file(name));
        }
    }
    run.write_atomic("config.toml", cfg.to_toml().as_bytes())?;
    run.write_atomic("genotype.json", &genotype.to_json())?;
    run.write_atomic("genotype.txt", format!("{}\n", genotype.to_darts_text()).as_bytes())?;
    let plan = serde_json::json!({
        "epochs": t.epochs,
        "steps_per_epoch": steps,
        "batch_size": bs,
        "train_images": train_set.len(),
        "val_images": test.len(),
    });
    run.write_atomic("plan.json", plan.to_string().as_bytes())?;
    let open = |name: &str, header: &str| -> Result<Csv, RecordError> { run.csv(name, header) };
    let mut metrics = open("metrics.csv", "epoch,step,phase,loss,top1,lr,arch_lr,seconds")?;
    let mut nan = open("nan_events.csv", "epoch,step,site,layer,value,action")?;
    let mut quant = open(
        "quant_error.csv",
        "epoch,step,layer,kind,bits,scale,zero_point,mse,sqnr_db,clip_frac",
    )?;
    let kind = cfg.data.dataset;
    let cut = if kind.augments() { t.cutout_length } else { 0 };
    let every = cfg.record.quant_error_every;
    let ckpt_every = cfg.record.checkpoint_every;
    let start = Instant::now();
    let mut rng = Rng::from_state(st.rng);
    let all: Vec<usize> = (0..train_set.len()).collect();
    let f = |v: f64| format!("{v:.6}");
    let mut stop_after_epoch = false;
    for epoch in st.epochs_done..t.epochs {
        let lr = cosine_lr(t.lr, t.lr_min, epoch, t.epochs);
        let drop_prob = cfg.model.drop_path_prob * epoch as f64 / t.epochs as f64;
        let first = std::mem::take(&mut st.step_in_epoch).min(steps);
        let epoch_rng = if first > 0 { st.epoch_rng } else { rng.state() };
        rng = Rng::from_state(epoch_rng);
        let mut order = all.clone();
        rng.shuffle(&mut order);
        let (mut seen, mut right) = (0usize, 0usize);
        if first > 0 {
            rng = Rng::from_state(st.rng);
            (seen, right) = (st.seen, st.right);
        }
        for i in first..steps {
            st.step += 1;
            let step = st.step;
            let (x, y) = data::batch_cutout(
                &train_set,
                kind,
                &order[i * bs..(i + 1) * bs],
                Some(&mut rng),
                cut,
                &ad,
            );
            let record_quant = every > 0 && (step.is_multiple_of(every) || i + 1 == steps);
            net.set_recording(record_quant);
            let (logits, aux) = net.forward_train(x, Some((drop_prob, &mut rng)));
            let mut loss = cross_entropy(logits.clone(), y.clone());
            if let Some(aux) = aux {
                loss =
                    loss.add(cross_entropy(aux, y.clone()).mul_scalar(cfg.model.auxiliary_weight));
            }
            let inject = cfg.nan_guard.inject_step == Some(step);
            if inject && cfg.nan_guard.inject_site == NanSite::Loss {
                loss = loss.mul_scalar(f32::NAN);
            }
            let loss_value = loss.clone().into_scalar::<f32>() as f64;
            let mut grads = loss.backward();
            let mut gw = GradientsParams::from_module(&mut grads, &net);
            if inject && cfg.nan_guard.inject_site == NanSite::Grad {
                architect::scale_grads(&mut gw, &net, f32::NAN);
            }
            let norm = clip_grad_norm(&mut gw, &net, t.grad_clip);
            let qstats = if record_quant { net.quant_stats() } else { Vec::new() };
            let mut events = Vec::new();
            if !loss_value.is_finite() {
                events.push(("loss", "loss".to_string(), loss_value));
            } else if !norm.is_finite() {
                let layer =
                    architect::first_non_finite_grad(&gw, &net).unwrap_or_else(|| "net".into());
                events.push(("grad", layer, norm));
            }
            if let Some(q) = qstats.iter().find(|q| !(q.scale.is_finite() && q.scale > 0.0)) {
                events.push(("scale", q.path.clone(), q.scale));
            }
            if events.is_empty() {
                net = optim.step(lr, net, gw);
            } else {
                st.nan_events += events.len();
                for (site, layer, value) in &events {
                    nan.row(&[
                        epoch.to_string(),
                        step.to_string(),
                        site.to_string(),
                        quote(layer),
                        format!("{value}"),
                        "skipped".into(),
                    ])?;
                }
                if st.nan_events > cfg.nan_guard.max_events {
                    nan.row(&[
                        epoch.to_string(),
                        step.to_string(),
                        "guard".into(),
                        "-".into(),
                        st.nan_events.to_string(),
                        "aborted".into(),
                    ])?;
                    return Err(SearchError::NanAbort(st.nan_events));
                }
            }
            seen += bs;
            right += correct(logits, y);
            let top1 = right as f64 / seen as f64;
            metrics.row(&[
                epoch.to_string(),
                step.to_string(),
                "train".into(),
                f(loss_value),
                f(top1),
                f(lr),
                "0".into(),
                format!("{:.3}", start.elapsed().as_secs_f64()),
            ])?;
            for q in &qstats {
                quant.row(&quant_row(epoch, step, q))?;
            }
            net.set_recording(false);
            let stop = progress(&Progress {
                epoch,
                epochs: t.epochs,
                step: i + 1,
                steps,
                loss: loss_value,
                top1,
            })
            .is_break();
            if i + 1 < steps && (stop || (ckpt_every > 0 && step.is_multiple_of(ckpt_every))) {
                st.epochs_done = epoch;
                st.step_in_epoch = i + 1;
                st.epoch_rng = epoch_rng;
                st.rng = rng.state();
                (st.seen, st.right) = (seen, right);
                save(run, &net, &optim, &st)?;
                st.step_in_epoch = 0;
                if stop {
                    return Ok(false);
                }
            }
            // A stop on the epoch's last step finishes the epoch (test pass, checkpoint) first.
            stop_after_epoch |= stop;
        }
        let (vloss, vtop1) = evaluate(&net.valid(), &test, kind, bs, device);
        metrics.row(&[
            epoch.to_string(),
            st.step.to_string(),
            "val".into(),
            f(vloss),
            f(vtop1),
            f(lr),
            "0".into(),
            format!("{:.3}", start.elapsed().as_secs_f64()),
        ])?;
        st.epochs_done = epoch + 1;
        st.rng = rng.state();
        (st.seen, st.right) = (0, 0);
        save(run, &net, &optim, &st)?;
        if stop_after_epoch && epoch + 1 < t.epochs {
            return Ok(false);
        }
    }
    Ok(true)
}
