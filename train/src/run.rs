//! `qdarts train`: quantization-aware training of a genotype's evaluation network (pt.darts'
//! `augment.py`) as a step of the shared epoch loop: SGD with momentum, cosine learning rate,
//! gradient clipping, auxiliary loss, drop-path rising linearly over the epochs, cutout on
//! CIFAR. The end-of-epoch validation is the test set (the whole of it after the last epoch, its
//! first `data.epoch_test_limit` images after the others). The run record is the search's kind
//! (metrics, quantization error, NaN events, plan, checkpoints with resume).

use std::ops::ControlFlow;
use std::path::Path;

use burn::module::Module;

use burn::tensor::Device;
use qdarts_data::{self as data, DatasetKind, ImageSet, Rng};
use qdarts_engine::config::Experiment;
use qdarts_engine::epoch::{EpochRows, EpochTask, Evaluation, LoopPlan, StepInput, StepOutcome};
use qdarts_engine::grads::{WeightGrads, correct, cross_entropy, guarded_backward};
use qdarts_engine::inject::NanInjection;
use qdarts_engine::{
    ConfigError, LoopState, Progress, RunError, RunKind, Sgd, apply_limit, checkpoint_error,
    load_module, note_epochs_change, run_epochs, save_module, seeded, start,
};
use qdarts_genotypes::Genotype;
use qdarts_ops::candidates::QuantSites;
use qdarts_ops::quant::{ErrorTape, QuantPass, lsq};
use qdarts_record::{CheckpointPart, Plan, RunDir, RunLayout, read_plan, write_atomic, write_plan};

use crate::config::TrainConfig;
use crate::network::{EvalNetwork, EvalShape};

/// Reads a genotype from a JSON or DARTS-text file, a run folder (its `genotype.json`), or a
/// shipped name.
pub fn resolve_genotype(spec: &str) -> Result<Genotype, RunError> {
    let source_err =
        |path: &Path, message: String| RunError::GenotypeSource { path: path.into(), message };
    let p = Path::new(spec);
    let file = if p.is_dir() { RunLayout::new(p).genotype_json() } else { p.to_path_buf() };
    if !file.exists() {
        if p.is_dir() {
            let why = "no genotype.json in this run folder (did its search finish?)";
            return Err(source_err(&file, why.into()));
        }
        return qdarts_genotypes::known(spec)
            .map_err(|e| source_err(p, format!("not a file, and {e}")));
    }
    let text = std::fs::read_to_string(&file).map_err(|e| source_err(&file, e.to_string()))?;
    let g = if text.trim_start().starts_with('{') {
        Genotype::from_json(&text)
    } else {
        Genotype::from_darts_text(text.trim())
    };
    g.map_err(|e| source_err(&file, e.to_string()))
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
pub fn test_set(cfg: &TrainConfig) -> Result<ImageSet, RunError> {
    let mut set = data::load(cfg.data.dataset, cfg.data.path.as_deref(), false)?;
    apply_limit(&mut set, cfg.data.test_limit, "data.test_limit")?;
    Ok(set)
}

/// Test-set loss and top-1 of a network in inference mode.
pub fn evaluate(
    net: &EvalNetwork,
    set: &ImageSet,
    kind: DatasetKind,
    bs: usize,
    device: &Device,
) -> Evaluation {
    evaluate_first(net, set, set.len(), kind, bs, device)
}

/// [`evaluate`] on the first `count` images of `set` (all of them when it has fewer).
pub fn evaluate_first(
    net: &EvalNetwork,
    set: &ImageSet,
    count: usize,
    kind: DatasetKind,
    bs: usize,
    device: &Device,
) -> Evaluation {
    let idx: Vec<usize> = (0..count.min(set.len())).collect();
    let (mut loss, mut right) = (0.0, 0usize);
    for chunk in idx.chunks(bs.max(1)) {
        let (x, y) = data::batch(set, kind, chunk, None, device);
        let logits = net.forward(x);
        loss += cross_entropy(logits.clone(), y.clone()).into_scalar::<f32>() as f64
            * chunk.len() as f64;
        right += correct(logits, y);
    }
    let n = idx.len().max(1) as f64;
    Evaluation { loss: loss / n, top1: right as f64 / n }
}

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
pub fn open_trained(dir: &Path, device: &Device) -> Result<TrainedRun, RunError> {
    if !dir.is_dir() {
        return Err(checkpoint_error(dir, "no such run folder"));
    }
    RunKind::expect(dir, RunKind::Train)?;
    let run = RunLayout::new(dir);
    let cfg = TrainConfig::load(&run.config(), &[])?;
    let genotype = resolve_genotype(&run.genotype_json().display().to_string())?;
    let st = LoopState::read(&run).map_err(|e| match e {
        RunError::Checkpoint { path, message } => RunError::Checkpoint {
            path,
            message: format!("{message} (not a training run, or it never checkpointed)"),
        },
        other => other,
    })?;
    let set = test_set(&cfg)?;
    let net = EvalNetwork::new(&eval_shape(&cfg, &set), &genotype, &cfg.quant, device)?;
    let net = load_module(net, &run.checkpoint_part(CheckpointPart::Net))?;
    lsq::forget_init(&net);
    let net = net.valid();
    Ok(TrainedRun { cfg, genotype, net, epochs_done: st.epochs_done })
}

/// The training step in the epoch loop.
struct TrainTask<'a> {
    cfg: &'a TrainConfig,
    device: &'a Device,
    ad: Device,
    train_set: ImageSet,
    test: ImageSet,
    order: Vec<usize>,
    net: EvalNetwork,
    optim: Sgd,
    pending: Option<WeightGrads>,
}

impl EpochTask for TrainTask<'_> {
    fn shuffle(&mut self, rng: &mut Rng) {
        self.order = (0..self.train_set.len()).collect();
        rng.shuffle(&mut self.order);
    }

    fn step(&mut self, input: StepInput<'_>) -> Result<StepOutcome, RunError> {
        let (cfg, bs) = (self.cfg, self.cfg.train.batch_size);
        let kind = cfg.data.dataset;
        let cut = if kind.augments() { cfg.train.cutout_length } else { 0 };
        let drop_prob = cfg.model.drop_path_prob * input.epoch as f64 / cfg.train.epochs as f64;
        let i = input.index;
        let indices = &self.order[i * bs..(i + 1) * bs];
        let (x, y) = data::batch_cutout(
            &self.train_set,
            kind,
            indices,
            Some(&mut *input.rng),
            cut,
            &self.ad,
        );
        // The quantizers' error statistics, on the steps that record them.
        let errors = ErrorTape::default();
        let qp = QuantPass::recording(input.record_quant.then_some(&errors));
        let (logits, aux) = self.net.forward_train(x, Some((drop_prob, &mut *input.rng)), qp);
        let mut loss = cross_entropy(logits.clone(), y.clone());
        if let Some(aux) = aux {
            loss = loss.add(cross_entropy(aux, y.clone()).mul_scalar(cfg.model.auxiliary_weight));
        }
        let back = guarded_backward(&self.net, loss, input.inject, cfg.train.grad_clip);
        let quant = if input.record_quant { self.net.quant_stats(&errors)? } else { Vec::new() };
        self.pending = Some(back.grads);
        Ok(StepOutcome {
            loss: back.loss,
            images: bs,
            correct: correct(logits, y),
            events: back.events,
            quant,
        })
    }

    fn commit(mut self, lr: f64) -> Self {
        if let Some(grads) = self.pending.take() {
            let net = lsq::apply_init(self.net);
            self.net = self.optim.step(lr, net, grads);
        }
        self
    }

    fn discard(mut self) -> Self {
        self.pending = None;
        self
    }

    fn arch_lr(&self) -> f64 {
        0.0
    }

    /// The last epoch scores the whole test set (`data.test_limit`), the others its first
    /// `data.epoch_test_limit` images.
    fn validate(&mut self, epoch: usize) -> Result<Evaluation, RunError> {
        let (bs, data) = (self.cfg.train.batch_size, &self.cfg.data);
        let last = epoch + 1 >= self.cfg.train.epochs;
        let n = if last || data.epoch_test_limit == 0 {
            self.test.len()
        } else {
            data.epoch_test_limit
        };
        let net = self.net.valid();
        Ok(evaluate_first(&net, &self.test, n, data.dataset, bs, self.device))
    }

    fn epoch_rows(&mut self, _epoch: usize, _run: &RunDir) -> Result<EpochRows, RunError> {
        Ok(EpochRows::default())
    }

    fn save(&self, dir: &Path) -> Result<(), RunError> {
        // Running states fold their per-thread updates on a sync; `valid()` syncs them.
        drop(self.net.valid());
        save_module(&self.net, &CheckpointPart::Net.in_dir(dir))?;
        self.optim.save(&self.net, &CheckpointPart::Optim.in_dir(dir))
    }

    fn load(mut self, dir: &Path) -> Result<Self, RunError> {
        self.net = load_module(self.net, &CheckpointPart::Net.in_dir(dir))?;
        lsq::forget_init(&self.net);
        self.optim = self.optim.load(&self.net, &CheckpointPart::Optim.in_dir(dir))?;
        Ok(self)
    }
}

/// A training run ready to start: its data loaded and checked, its network built. Nothing is
/// written yet, so a bad dataset or config is an error before any run folder exists.
pub struct PreparedTrain<'a> {
    task: TrainTask<'a>,
    genotype: &'a Genotype,
    plan: Plan,
    inject: Option<NanInjection>,
}

impl std::fmt::Debug for PreparedTrain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedTrain").field("plan", &self.plan).finish_non_exhaustive()
    }
}

impl PreparedTrain<'_> {
    /// Epochs, steps and images.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The same training run meeting one NaN on purpose (tests of the NaN guard).
    pub fn inject_nan(self, at: NanInjection) -> Self {
        PreparedTrain { inject: Some(at), ..self }
    }
}

/// Loads and checks a training run's data and builds the genotype's evaluation network.
pub fn prepare_train<'a>(
    cfg: &'a TrainConfig,
    genotype: &'a Genotype,
    device: &'a Device,
) -> Result<PreparedTrain<'a>, RunError> {
    let widths = genotype.normal_bits.is_some() || genotype.reduce_bits.is_some();
    if widths && cfg.quant.preset == qdarts_ops::qconfig::Preset::Float {
        return Err(RunError::GenotypeSource {
            path: cfg.genotype.clone().into(),
            message: "carries per-op widths (normal_bits / reduce_bits), which need quantization, \
                      but quant.preset is float"
                .into(),
        });
    }
    let mut train_set = data::load(cfg.data.dataset, cfg.data.path.as_deref(), true)?;
    let source = data::source_name(cfg.data.dataset, cfg.data.path.as_deref());
    train_set.check_reducible(&source, 2)?;
    apply_limit(&mut train_set, cfg.data.limit, "data.limit")?;
    let test = test_set(cfg)?;
    train_set.check_same_shape(&test, &source)?;
    // The auxiliary head pools 5×5 and convolves 2×2 at a quarter of the resolution.
    if cfg.model.auxiliary && train_set.height.min(train_set.width) < 24 {
        return Err(RunError::Config(ConfigError::invalid(
            Path::new("config"),
            "model.auxiliary",
            format!(
                "needs images of at least 24×24 (these are {}×{}): set it to false",
                train_set.height, train_set.width
            ),
        )));
    }
    let t = &cfg.train;
    let bs = t.batch_size;
    let mut steps = train_set.len() / bs;
    if steps == 0 {
        return Err(RunError::Config(ConfigError::invalid(
            Path::new("config"),
            "train.batch_size",
            format!("{bs} is larger than the {} training images", train_set.len()),
        )));
    }
    if t.steps_per_epoch > 0 {
        steps = steps.min(t.steps_per_epoch);
    }
    let ad = device.clone().autodiff();
    let shape = eval_shape(cfg, &train_set);
    let need = crate::memory::eval_need(cfg, &shape, genotype);
    let keys = "train.batch_size, model.init_channels or model.layers";
    qdarts_engine::memory::check_fits(device, "the network", need, keys)?;
    let net = seeded(&ad, cfg.seed, || EvalNetwork::new(&shape, genotype, &cfg.quant, &ad))?;
    let optim = Sgd::new(t.momentum, t.weight_decay);
    let plan = Plan {
        batch_size: bs,
        epochs: t.epochs,
        steps_per_epoch: steps,
        train_images: train_set.len(),
        val_images: test.len(),
    };
    let task = TrainTask {
        cfg,
        device,
        ad,
        train_set,
        test,
        order: Vec::new(),
        net,
        optim,
        pending: None,
    };
    Ok(PreparedTrain { task, genotype, plan, inject: None })
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
) -> Result<bool, RunError> {
    run_train_prepared(prepare_train(cfg, genotype, device)?, run, resume, progress)
}

/// Runs a prepared training run in `run`. `resume`: continue from its checkpoint if it has one.
pub fn run_train_prepared(
    prepared: PreparedTrain<'_>,
    run: &RunDir,
    resume: bool,
    progress: &mut dyn FnMut(&Progress) -> ControlFlow<()>,
) -> Result<bool, RunError> {
    let PreparedTrain { task, genotype, plan, inject } = prepared;
    let cfg = task.cfg;
    let t = &cfg.train;
    let old = if resume { read_plan(run) } else { None };
    let (task, st) = start(run, task, cfg.seed, resume)?;
    note_epochs_change(run, old.as_ref(), &plan, "train.epochs", st.step)?;
    write_atomic(&run.config(), cfg.to_toml()?.as_bytes())?;
    write_atomic(&run.genotype_json(), &genotype.to_json()?)?;
    write_atomic(&run.genotype_text(), format!("{}\n", genotype.to_darts_text()).as_bytes())?;
    write_plan(run, &plan)?;
    let lp = LoopPlan {
        epochs: t.epochs,
        steps: plan.steps_per_epoch,
        lr: (t.lr, t.lr_min),
        restart: None,
        quant_error_every: cfg.record.quant_error_every,
        checkpoint_every: cfg.record.checkpoint_every,
        nan_guard: cfg.nan_guard.clone(),
        inject,
    };
    Ok(run_epochs(run, task, st, &lp, progress)?.finished)
}
