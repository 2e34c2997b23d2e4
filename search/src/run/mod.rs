//! The search as a step of the shared epoch loop: per step an architecture step on a
//! validation batch and a weight step on a training batch; per epoch a validation pass on the
//! α split, the α and the derived genotype. Everything goes to the run record; progress goes
//! to a callback.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::optim::ModuleOptimizer;
use burn::tensor::Device;
use qdarts_data::{self as data, ImageSet, Rng};
use qdarts_engine::config::Experiment;
use qdarts_engine::epoch::{EpochRows, EpochTask, Evaluation, LoopPlan, StepInput, StepOutcome};
use qdarts_engine::grads::{Event, WeightGrads, correct, cross_entropy};
use qdarts_engine::inject::NanInjection;
use qdarts_engine::memory::check_fits;
use qdarts_engine::{
    ConfigError, Progress, RunError, Sgd, apply_limit, checkpoint_error, load_module, load_optim,
    note_epochs_change, run_epochs, save_module, save_optim, seeded, start,
};
use qdarts_genotypes::{Genotype, edge_count, softmax};
use qdarts_ops::candidates::QuantSites;
use qdarts_ops::quant::{ErrorTape, lsq};
use qdarts_record::{
    AlphaRow, CellType, CheckpointPart, GenotypeRow, NanSite, Plan, RunDir, read_plan,
    write_atomic, write_plan,
};

use crate::config::{ExperimentConfig, Selection};
use crate::cost::CostModel;
use crate::selection::Projection;
use crate::step::{arch_step, build_optimizers, weight_backward};
use crate::supernet::{Alphas, ArchWeights, NetShape, SearchNetwork};

mod derive;
mod rows;

pub use derive::derive_genotype;
use derive::derive_rows;

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

/// The supernet's shape for a config and data set.
pub fn net_shape(cfg: &ExperimentConfig, set: &ImageSet) -> NetShape {
    NetShape {
        c_in: set.channels,
        classes: set.classes,
        channels: cfg.model.init_channels,
        layers: cfg.model.layers,
        nodes: cfg.model.nodes,
        stem_multiplier: cfg.model.stem_multiplier,
        primitives: cfg.model.primitives.clone(),
        partial_channels: cfg.model.partial_channels,
        bits: cfg.search.bits.as_ref().map(|b| (b.weight.clone(), b.act.clone())),
    }
}

/// Epochs of the whole run: the search's, and with a perturbation-based selection one
/// fine-tuning interval after each round of decisions.
pub fn total_epochs(cfg: &ExperimentConfig) -> usize {
    let s = &cfg.search;
    match s.selection {
        Selection::Magnitude => s.epochs,
        Selection::Perturbation => {
            s.epochs + s.perturbation_or_default().tune_epochs * Projection::rounds(cfg.model.nodes)
        }
    }
}

/// What the weight step left pending.
struct Pending {
    grads: WeightGrads,
    /// α before this step's architecture step, when that step made α non-finite.
    alphas_before: Option<Alphas>,
}

/// The search step in the epoch loop.
struct SearchTask<'a> {
    cfg: &'a ExperimentConfig,
    device: &'a Device,
    ad: Device,
    set: ImageSet,
    train_idx: Vec<usize>,
    val_idx: Vec<usize>,
    order_t: Vec<usize>,
    order_v: Vec<usize>,
    steps: usize,
    net: SearchNetwork,
    alphas: Alphas,
    w_optim: Sgd,
    a_optim: ModuleOptimizer,
    pending: Option<Pending>,
    /// The cost tables, with a bit-width search or a cost.
    cost: Option<CostModel>,
}

impl EpochTask for SearchTask<'_> {
    fn shuffle(&mut self, rng: &mut Rng) {
        self.order_t.clone_from(&self.train_idx);
        self.order_v.clone_from(&self.val_idx);
        rng.shuffle(&mut self.order_t);
        rng.shuffle(&mut self.order_v);
    }

    fn step(&mut self, input: StepInput<'_>) -> Result<StepOutcome, RunError> {
        let (s, kind) = (&self.cfg.search, self.cfg.data.dataset);
        let (bs, i) = (s.batch_size, input.index);
        let rng = input.rng;
        let (ti, vi) = (&self.order_t[i * bs..(i + 1) * bs], &self.order_v[i * bs..(i + 1) * bs]);
        let tb = data::batch(&self.set, kind, ti, Some(&mut *rng), &self.ad);
        let vb = data::batch(&self.set, kind, vi, Some(&mut *rng), &self.ad);

        // DARTS-' β for this step, the same in the architecture and the weight step.
        self.net.aux_skip = s.guards.aux_skip_at(input.step, self.steps * s.epochs);
        let alphas_before = self.alphas.clone();
        let optims = (&mut self.a_optim, &self.w_optim);
        let batches = (&tb, &vb);
        let cost = self.cost.as_ref();
        let beta = s.guards.beta_decay_at(input.epoch.min(s.epochs), s.epochs);
        let alphas = self.alphas.clone();
        self.alphas = arch_step(&mut self.net, alphas, optims, batches, input.lr, s, cost, beta);

        // SDARTS-RS: the weight step sees α's softmax with random noise.
        let eps = s.guards.smoothing_at(input.epoch.min(s.epochs), s.epochs);
        let arch = if eps > 0.0 { Some(self.alphas.arch_smoothed(eps, rng)?) } else { None };
        // The quantizers' error statistics, on the steps that record them.
        let errors = ErrorTape::default();
        let record = input.record_quant.then_some(&errors);
        let (back, logits) =
            weight_backward(&self.net, &self.alphas, &tb, input.inject, s, arch, record);
        let mut events = back.events;
        let (an, ar) = self.alphas.to_rows()?;
        let alpha_bad = an.iter().chain(&ar).flatten().any(|v| !v.is_finite());
        if alpha_bad {
            events.push(Event::new(NanSite::Alpha, "alphas", f64::NAN));
        }
        // Quantizer scales, on the steps whose statistics are recorded.
        let quant = if input.record_quant { self.net.quant_stats(&errors)? } else { Vec::new() };
        self.pending =
            Some(Pending { grads: back.grads, alphas_before: alpha_bad.then_some(alphas_before) });
        Ok(StepOutcome {
            loss: back.loss,
            images: bs,
            correct: correct(logits, tb.1),
            events,
            quant,
        })
    }

    fn commit(mut self, lr: f64) -> Self {
        if let Some(p) = self.pending.take() {
            let net = lsq::apply_init(self.net);
            self.net = self.w_optim.step(lr, net, p.grads);
        }
        self
    }

    fn discard(mut self) -> Self {
        // Keep the weights, and undo the α step if α went bad.
        if let Some(Pending { alphas_before: Some(before), .. }) = self.pending.take() {
            self.alphas = before;
        }
        self
    }

    fn arch_lr(&self) -> f64 {
        self.cfg.search.alpha_lr
    }

    /// Validation on the α split, with frozen statistics.
    fn validate(&mut self, _epoch: usize) -> Result<Evaluation, RunError> {
        let bs = self.cfg.search.batch_size;
        let eval = self.net.valid();
        let arch = self.alphas.valid().arch();
        let n = self.val_idx.len().min(bs * self.steps);
        Ok(self.evaluate(&eval, arch, &self.val_idx[..n], bs))
    }

    /// softmax(α) per edge and op, and the genotype derived from α; with a perturbation-based
    /// selection, the decisions due at the end of this epoch first.
    fn epoch_rows(&mut self, epoch: usize, run: &RunDir) -> Result<EpochRows, RunError> {
        self.select(epoch, run)?;
        let (an, ar) = self.alphas.to_rows()?;
        let primitives = &self.cfg.model.primitives;
        let mut alphas = Vec::new();
        for (cell_type, rows) in [(CellType::Normal, &an), (CellType::Reduce, &ar)] {
            for (edge, row) in rows.iter().enumerate() {
                for (k, w) in softmax(row).into_iter().enumerate() {
                    let op = primitives[k].to_string();
                    alphas.push(AlphaRow { epoch, cell_type, edge, op, weight: f64::from(w) });
                }
            }
        }
        let genotype = derive_rows(self.cfg, &self.alphas, &an, &ar)?;
        let genotypes = vec![GenotypeRow { epoch, genotype: genotype.to_darts_text() }];
        let (bits, cost) = (self.bit_rows(epoch)?, self.cost_rows(epoch));
        Ok(EpochRows { alphas, genotypes, bits, cost })
    }

    fn save(&self, dir: &Path) -> Result<(), RunError> {
        // Synced running states (BN statistics, observer ranges: each records its last update
        // per thread until a sync), and with batched cells the per-edge cells beside them
        // written from the stacked weights, so that every tensor saved is current.
        save_module(&self.net.with_cells_synced(), &CheckpointPart::Net.in_dir(dir))?;
        save_module(&self.alphas, &CheckpointPart::Alphas.in_dir(dir))?;
        if let Some(p) = &self.alphas.projection {
            let path = CheckpointPart::Selection.in_dir(dir);
            let json = serde_json::to_vec_pretty(p).map_err(|e| checkpoint_error(&path, e))?;
            write_atomic(&path, &json)?;
        }
        self.w_optim.save(&self.net, &CheckpointPart::WeightOptim.in_dir(dir))?;
        save_optim(&self.a_optim, &CheckpointPart::AlphaOptim.in_dir(dir))
    }

    fn load(mut self, dir: &Path) -> Result<Self, RunError> {
        self.net = load_module(self.net, &CheckpointPart::Net.in_dir(dir))?;
        lsq::forget_init(&self.net);
        let projection = self.alphas.projection.take();
        self.alphas = load_module(self.alphas, &CheckpointPart::Alphas.in_dir(dir))?;
        if projection.is_some() {
            let path = CheckpointPart::Selection.in_dir(dir);
            let bytes = std::fs::read(&path).map_err(|e| checkpoint_error(&path, e))?;
            let p: Projection =
                serde_json::from_slice(&bytes).map_err(|e| checkpoint_error(&path, e))?;
            if p.normal.ops.len() != edge_count(self.cfg.model.nodes) {
                let msg = format!(
                    "its decisions are for another number of nodes than model.nodes = {}",
                    self.cfg.model.nodes
                );
                return Err(checkpoint_error(&path, msg));
            }
            self.alphas.projection = Some(p);
        }
        self.w_optim = self.w_optim.load(&self.net, &CheckpointPart::WeightOptim.in_dir(dir))?;
        self.a_optim = load_optim(self.a_optim, &CheckpointPart::AlphaOptim.in_dir(dir))?;
        Ok(self)
    }
}

impl SearchTask<'_> {
    /// Loss and top-1 of `eval` under `arch` on the images `idx` (in order, no augmentation),
    /// in batches of `bs`.
    fn evaluate(
        &self,
        eval: &SearchNetwork,
        arch: ArchWeights,
        idx: &[usize],
        bs: usize,
    ) -> Evaluation {
        let kind = self.cfg.data.dataset;
        let (mut loss, mut right, mut n) = (0.0, 0usize, 0usize);
        for chunk in idx.chunks(bs) {
            let (x, y) = data::batch(&self.set, kind, chunk, None, self.device);
            let logits = eval.forward_arch(x, arch.clone());
            loss += cross_entropy(logits.clone(), y.clone()).into_scalar::<f32>() as f64
                * chunk.len() as f64;
            right += correct(logits, y);
            n += chunk.len();
        }
        Evaluation { loss: loss / n as f64, top1: right as f64 / n as f64 }
    }
}

/// A search ready to run: its data loaded and checked, its network built. Nothing is written
/// yet, so a bad dataset or config is an error before any run folder exists.
pub struct PreparedSearch<'a> {
    task: SearchTask<'a>,
    plan: Plan,
    inject: Option<NanInjection>,
}

impl std::fmt::Debug for PreparedSearch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedSearch").field("plan", &self.plan).finish_non_exhaustive()
    }
}

impl PreparedSearch<'_> {
    /// Epochs, steps and images.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The same search meeting one NaN on purpose (tests of the NaN guard).
    pub fn inject_nan(self, at: NanInjection) -> Self {
        PreparedSearch { inject: Some(at), ..self }
    }
}

/// Loads and checks a search's data and builds its supernet and optimizers.
pub fn prepare_search<'a>(
    cfg: &'a ExperimentConfig,
    device: &'a Device,
) -> Result<PreparedSearch<'a>, RunError> {
    let mut set = data::load(cfg.data.dataset, cfg.data.path.as_deref(), true)?;
    let source = data::source_name(cfg.data.dataset, cfg.data.path.as_deref());
    set.check_reducible(&source, 2)?;
    apply_limit(&mut set, cfg.data.limit, "data.limit")?;
    let (train_idx, val_idx) = data::darts_split(set.len(), cfg.data.train_portion);
    let bs = cfg.search.batch_size;
    let mut steps = train_idx.len().min(val_idx.len()) / bs;
    if steps == 0 {
        return Err(RunError::Config(ConfigError::invalid(
            Path::new("config"),
            "search.batch_size",
            format!("{bs} is larger than each half of the {} training images", set.len()),
        )));
    }
    if cfg.search.steps_per_epoch > 0 {
        steps = steps.min(cfg.search.steps_per_epoch);
    }
    let ad = device.clone().autodiff();
    let shape = net_shape(cfg, &set);
    let need = crate::memory::supernet_need(cfg, &shape, (set.height, set.width));
    let keys = "search.batch_size, model.init_channels, model.layers or model.nodes \
                (or raise model.partial_channels)";
    check_fits(device, "the supernet", need, keys)?;
    // The backend's generator is process-wide: hold it from seeding to the last random
    // initial value, so that two searches in one process (tests) cannot interleave draws.
    let (net, alphas) = seeded(&ad, cfg.seed, || {
        let mut net = SearchNetwork::new(&shape, &cfg.quant, &ad)?;
        if cfg.model.batched_cells {
            net.batch_cells(&cfg.model.primitives).map_err(|e| {
                let config = Path::new("config");
                RunError::Config(ConfigError::invalid(config, "model.batched_cells", e.to_string()))
            })?;
        }
        let alphas = Alphas::new(cfg.model.nodes, cfg.model.primitives.len(), &ad);
        let alphas = if cfg.search.guards.edge_normalization {
            alphas.with_edge_normalization(&ad)
        } else {
            alphas
        };
        let alphas = match &cfg.search.bits {
            Some(b) => {
                alphas.with_bits(cfg.model.primitives.len(), b.weight.len(), b.act.len(), &ad)
            }
            None => alphas,
        };
        let alphas = match cfg.search.selection {
            Selection::Perturbation => {
                Alphas { projection: Some(Projection::new(cfg.model.nodes)), ..alphas }
            }
            Selection::Magnitude => alphas,
        };
        Ok::<_, RunError>((net, alphas))
    })?;
    let (w_optim, a_optim) = build_optimizers(&cfg.search);
    // With partial channels the supernet's ops see C/K channels: no cost estimate (and no
    // `[search.cost]`, which the config refuses).
    let costed = cfg.search.bits.is_some() || cfg.search.cost.is_some();
    let cost = (costed && cfg.model.partial_channels == 1).then(|| {
        let choices = shape.bits.clone();
        let hw = (set.height, set.width);
        CostModel::new(&net, hw, cfg.model.nodes, &cfg.model.primitives, &cfg.quant, choices)
    });
    let plan = Plan {
        batch_size: bs,
        epochs: total_epochs(cfg),
        steps_per_epoch: steps,
        train_images: train_idx.len(),
        val_images: val_idx.len(),
    };
    let task = SearchTask {
        cfg,
        device,
        ad,
        set,
        train_idx,
        val_idx,
        order_t: Vec::new(),
        order_v: Vec::new(),
        steps,
        net,
        alphas,
        w_optim,
        a_optim,
        pending: None,
        cost,
    };
    Ok(PreparedSearch { task, plan, inject: None })
}

/// Runs (or resumes) a search and writes its run record. `progress` is called after every
/// step; when it returns `Break` the search saves a checkpoint at that step and returns
/// (`finished: false`), so that `--resume` continues exactly there. The data is loaded and
/// checked before the run folder is created.
pub fn run_search(
    cfg: &ExperimentConfig,
    device: &Device,
    resume: Option<&Path>,
    progress: &mut dyn FnMut(&Progress) -> ControlFlow<()>,
) -> Result<SearchOutcome, RunError> {
    let prepared = prepare_search(cfg, device)?;
    let run = match resume {
        Some(dir) => RunDir::open(dir)?,
        None => RunDir::create(&cfg.record.results_dir, &cfg.name)?,
    };
    run_prepared(prepared, run, resume.is_some(), progress)
}

/// Runs a prepared search in `run`. `resume`: continue from its checkpoint if it has one.
pub fn run_prepared(
    prepared: PreparedSearch<'_>,
    run: RunDir,
    resume: bool,
    progress: &mut dyn FnMut(&Progress) -> ControlFlow<()>,
) -> Result<SearchOutcome, RunError> {
    let PreparedSearch { task, plan, inject } = prepared;
    let cfg = task.cfg;
    let old = if resume { read_plan(&run) } else { None };
    write_atomic(&run.config(), cfg.to_toml()?.as_bytes())?;
    write_plan(&run, &plan)?;
    let (task, st) = start(&run, task, cfg.seed, resume)?;
    note_epochs_change(&run, old.as_ref(), &plan, "search.epochs", st.step)?;
    let s = &cfg.search;
    // DARTS-PT fine-tunes at a tenth of the search's learning rate, annealed anew.
    let restart = (plan.epochs > s.epochs).then_some((s.epochs, s.w_lr / 10.0));
    let lp = LoopPlan {
        epochs: plan.epochs,
        steps: plan.steps_per_epoch,
        lr: (s.w_lr, s.w_lr_min),
        restart,
        quant_error_every: cfg.record.quant_error_every,
        checkpoint_every: cfg.record.checkpoint_every,
        nan_guard: cfg.nan_guard.clone(),
        inject,
    };
    let end = run_epochs(&run, task, st, &lp, progress)?;
    let genotype = derive_genotype(cfg, &end.task.alphas)?;
    if end.finished {
        write_atomic(&run.genotype_json(), &genotype.to_json()?)?;
        write_atomic(&run.genotype_text(), format!("{}\n", genotype.to_darts_text()).as_bytes())?;
    }
    Ok(SearchOutcome { run_dir: run.root().to_path_buf(), genotype, finished: end.finished })
}
