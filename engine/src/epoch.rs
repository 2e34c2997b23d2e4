//! The epoch loop shared by the search and QAT training. The loop owns everything but the
//! step: the learning-rate schedule, the data-order generator and its replay on resume, the
//! NaN guard (skip, or roll back to the last checkpoint with the learning rate halved), the
//! run-record rows, checkpoints every N steps and at epoch ends, progress and a clean stop.
//! A task plugs in its step, its end-of-epoch validation and rows, and its checkpoint files.
//!
//! A resumed run replays exactly: a checkpoint inside an epoch carries the generator state at
//! the epoch start (to redraw the epoch's order) and at its step (to go on drawing from there).

use std::ops::ControlFlow;
use std::path::Path;
use std::time::Instant;

use qdarts_data::Rng;
use qdarts_record::{
    AlphaRow, BitRow, CostRow, GenotypeRow, MetricsRow, NanAction, NanEventRow, NanSite, Phase,
    QuantError, QuantErrorRow, RunDir, TableWriter,
};

use crate::RunError;
use crate::checkpoint::{LoopState, load, save, truncate_tables};
use crate::config::{InjectSite, NanGuardConfig, NanPolicy};
use crate::grads::Event;
use crate::inject::{InjectNan, NanInjection};

/// Where the run is, for a progress display.
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

/// The learning rate of epoch `e` of `n` under cosine annealing (PyTorch `CosineAnnealingLR`
/// stepped per epoch, as pt.darts does).
pub fn cosine_lr(lr: f64, lr_min: f64, e: usize, n: usize) -> f64 {
    lr_min + 0.5 * (lr - lr_min) * (1.0 + (std::f64::consts::PI * e as f64 / n as f64).cos())
}

/// How long the loop runs and what it records.
#[derive(Debug, Clone)]
pub struct LoopPlan {
    /// Epochs.
    pub epochs: usize,
    /// Steps per epoch.
    pub steps: usize,
    /// Initial and final weight learning rate (cosine, per epoch).
    pub lr: (f64, f64),
    /// A warm restart: from this epoch on, cosine from this learning rate to the final one
    /// over the remaining epochs (DARTS-PT's fine-tuning after the search); none: one cosine.
    pub restart: Option<(usize, f64)>,
    /// Record every quantizer's error every this many steps (and at each epoch's last step).
    pub quant_error_every: usize,
    /// Checkpoint every this many global steps inside an epoch (0: at epoch ends only).
    pub checkpoint_every: usize,
    /// The NaN guard.
    pub nan_guard: NanGuardConfig,
    /// A NaN to inject, for the tests of the guard ([`crate::inject`]); none in a real run.
    pub inject: Option<NanInjection>,
}

impl LoopPlan {
    /// The weight learning rate of epoch `e` (before a rollback's halving).
    pub fn lr_at(&self, e: usize) -> f64 {
        match self.restart {
            Some((from, lr)) if e >= from => {
                cosine_lr(lr, self.lr.1, e - from, self.epochs.saturating_sub(from).max(1))
            }
            _ => cosine_lr(self.lr.0, self.lr.1, e, self.restart.map_or(self.epochs, |r| r.0)),
        }
    }
}

/// What a step is asked to do.
#[derive(Debug)]
pub struct StepInput<'a> {
    /// Epoch (0-based).
    pub epoch: usize,
    /// Global step (1-based).
    pub step: usize,
    /// Step within the epoch (0-based).
    pub index: usize,
    /// Weight learning rate of the epoch.
    pub lr: f64,
    /// Whether this step records quantizer statistics.
    pub record_quant: bool,
    /// A NaN for the step to make (tests of the guard, [`crate::inject`]).
    pub inject: Option<InjectSite>,
    /// The data-order generator, for augmentation and drop-path.
    pub rng: &'a mut Rng,
}

/// What a step found. Its weight update stays pending until the loop commits or discards it.
#[derive(Debug)]
pub struct StepOutcome {
    /// Training loss.
    pub loss: f64,
    /// Images of the batch.
    pub images: usize,
    /// Of which classified right.
    pub correct: usize,
    /// Non-finite values found (loss, gradients, α).
    pub events: Vec<Event>,
    /// Quantizer statistics, when the step recorded them.
    pub quant: Vec<QuantError>,
}

/// Loss and top-1 of an end-of-epoch validation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Evaluation {
    /// Mean loss.
    pub loss: f64,
    /// Top-1.
    pub top1: f64,
}

/// Rows a task writes at the end of an epoch (the search's α and genotype).
#[derive(Debug, Default)]
pub struct EpochRows {
    /// `alphas.csv` rows.
    pub alphas: Vec<AlphaRow>,
    /// `genotypes.csv` rows.
    pub genotypes: Vec<GenotypeRow>,
    /// `bits.csv` rows (bit-width searches).
    pub bits: Vec<BitRow>,
    /// `cost.csv` rows (searches with a bit-width search or a cost).
    pub cost: Vec<CostRow>,
}

/// A step plugged into the loop: the search or QAT training.
pub trait EpochTask: Sized {
    /// Draws the epoch's data order from `rng`.
    fn shuffle(&mut self, rng: &mut Rng);
    /// Step `input.index` of the epoch: compute the update and keep it pending.
    fn step(&mut self, input: StepInput<'_>) -> Result<StepOutcome, RunError>;
    /// Applies the pending update at learning rate `lr`.
    fn commit(self, lr: f64) -> Self;
    /// Drops the pending update (and undoes what went bad in the step).
    fn discard(self) -> Self;
    /// The architecture learning rate for the metrics rows (0: no architecture step).
    fn arch_lr(&self) -> f64;
    /// The validation at the end of epoch `epoch` (from 0).
    fn validate(&mut self, epoch: usize) -> Result<Evaluation, RunError>;
    /// Extra rows at the end of epoch `epoch`, after its validation. A task may change its
    /// state here and write rows of its own to `run` as it goes (the search's selection
    /// decisions, `selection.csv`): the epoch's checkpoint is taken after, and a resume cuts
    /// such a table back to the checkpoint's epochs.
    fn epoch_rows(&mut self, epoch: usize, run: &RunDir) -> Result<EpochRows, RunError>;
    /// Writes the task's checkpoint files into `dir`.
    fn save(&self, dir: &Path) -> Result<(), RunError>;
    /// Reads them back from `dir`.
    fn load(self, dir: &Path) -> Result<Self, RunError>;
}

/// How a loop ended.
#[derive(Debug)]
pub struct LoopEnd<T> {
    /// The task, with its final (or stopped-at) state.
    pub task: T,
    /// Whether all epochs ran; a stopped run saved a checkpoint where it stopped.
    pub finished: bool,
}

/// The tables the loop writes every step.
struct Tables {
    metrics: TableWriter<MetricsRow>,
    nan: TableWriter<NanEventRow>,
    quant: TableWriter<QuantErrorRow>,
}

impl Tables {
    fn open(run: &RunDir) -> Result<Self, RunError> {
        Ok(Tables { metrics: run.writer()?, nan: run.writer()?, quant: run.writer()? })
    }
}

/// Appends a task's per-epoch rows to their tables (each table opened only when it has rows).
fn write_epoch_rows(run: &RunDir, rows: &EpochRows) -> Result<(), RunError> {
    fn append<R: qdarts_record::Table>(run: &RunDir, rows: &[R]) -> Result<(), RunError> {
        if !rows.is_empty() {
            let mut w = run.writer::<R>()?;
            rows.iter().try_for_each(|r| w.push(r))?;
        }
        Ok(())
    }
    append::<AlphaRow>(run, &rows.alphas)?;
    append::<GenotypeRow>(run, &rows.genotypes)?;
    append::<BitRow>(run, &rows.bits)?;
    append::<CostRow>(run, &rows.cost)
}

/// Runs the epochs of `plan` from the state `st` (see [`start`](crate::checkpoint::start)). `progress` is called after
/// every step; when it returns `Break` the loop saves a checkpoint at that step and returns
/// (`finished: false`); on an epoch's last step it finishes the epoch first.
pub fn run_epochs<T: EpochTask>(
    run: &RunDir,
    task: T,
    st: LoopState,
    plan: &LoopPlan,
    progress: &mut dyn FnMut(&Progress) -> ControlFlow<()>,
) -> Result<LoopEnd<T>, RunError> {
    match plan.inject {
        Some(at) => {
            let task = InjectNan::new(task, at, plan.steps);
            let end = Loop::new(run, plan, st, progress)?.epochs(task)?;
            Ok(LoopEnd { task: end.task.into_inner(), finished: end.finished })
        }
        None => Loop::new(run, plan, st, progress)?.epochs(task),
    }
}

/// The loop's state between its steps.
struct Loop<'a> {
    run: &'a RunDir,
    plan: &'a LoopPlan,
    tables: Tables,
    st: LoopState,
    /// The data-order generator.
    rng: Rng,
    start: Instant,
    progress: &'a mut dyn FnMut(&Progress) -> ControlFlow<()>,
    /// A stop asked for on an epoch's last step: the epoch finishes first.
    stop_after_epoch: bool,
}

/// Where an epoch is: the step it starts from, the generator state it drew its order from,
/// and its running top-1 tally.
struct EpochPos {
    epoch: usize,
    lr: f64,
    first: usize,
    epoch_rng: u64,
    seen: usize,
    right: usize,
}

/// How a step or an epoch ended.
enum Flow {
    /// On to the next.
    Next,
    /// Stopped by the progress callback, a checkpoint saved.
    Stopped,
    /// The NaN guard rolled the run back to its last checkpoint.
    RolledBack,
}

impl<'a> Loop<'a> {
    fn new(
        run: &'a RunDir,
        plan: &'a LoopPlan,
        st: LoopState,
        progress: &'a mut dyn FnMut(&Progress) -> ControlFlow<()>,
    ) -> Result<Self, RunError> {
        Ok(Loop {
            run,
            plan,
            tables: Tables::open(run)?,
            rng: Rng::from_state(st.rng),
            st,
            start: Instant::now(),
            progress,
            stop_after_epoch: false,
        })
    }

    /// Every epoch from the state's, each as [`Loop::epoch`].
    fn epochs<T: EpochTask>(mut self, mut task: T) -> Result<LoopEnd<T>, RunError> {
        let mut epoch = self.st.epochs_done;
        while epoch < self.plan.epochs {
            let (t, flow) = self.epoch(task, epoch)?;
            task = t;
            match flow {
                Flow::Next => epoch += 1,
                Flow::Stopped => return Ok(LoopEnd { task, finished: false }),
                Flow::RolledBack => epoch = self.st.epochs_done,
            }
            if self.stop_after_epoch && epoch < self.plan.epochs {
                return Ok(LoopEnd { task, finished: false });
            }
        }
        if self.st.step > 0 && self.st.skipped_steps >= self.st.step {
            return Err(RunError::NothingTrained(self.st.step));
        }
        Ok(LoopEnd { task, finished: true })
    }

    /// One epoch: its order drawn (or redrawn, on a resume inside it), its steps, its end.
    fn epoch<T: EpochTask>(&mut self, mut task: T, epoch: usize) -> Result<(T, Flow), RunError> {
        let mut pos = self.begin_epoch(&mut task, epoch);
        for i in pos.first..self.plan.steps {
            let (t, flow) = self.step(task, &mut pos, i)?;
            task = t;
            if !matches!(flow, Flow::Next) {
                return Ok((task, flow));
            }
        }
        self.end_epoch(task, &pos)
    }

    /// Draws the epoch's order; a resume inside the epoch redraws it from the generator state
    /// at the epoch start and goes on from the checkpoint's.
    fn begin_epoch<T: EpochTask>(&mut self, task: &mut T, epoch: usize) -> EpochPos {
        let lr = self.plan.lr_at(epoch) * self.st.lr_scale;
        let first = std::mem::take(&mut self.st.step_in_epoch).min(self.plan.steps);
        let epoch_rng = if first > 0 { self.st.epoch_rng } else { self.rng.state() };
        self.rng = Rng::from_state(epoch_rng);
        task.shuffle(&mut self.rng);
        let mut pos = EpochPos { epoch, lr, first, epoch_rng, seen: 0, right: 0 };
        if first > 0 {
            self.rng = Rng::from_state(self.st.rng);
            (pos.seen, pos.right) = (self.st.seen, self.st.right);
        }
        pos
    }

    /// Step `i` of the epoch: run it, commit or guard it, record it, report it, and save a
    /// checkpoint when one is due or the callback stops the run.
    fn step<T: EpochTask>(
        &mut self,
        mut task: T,
        pos: &mut EpochPos,
        i: usize,
    ) -> Result<(T, Flow), RunError> {
        let (plan, epoch, lr) = (self.plan, pos.epoch, pos.lr);
        self.st.step += 1;
        let step = self.st.step;
        let every = plan.quant_error_every;
        let record_quant = every > 0 && (step.is_multiple_of(every) || i + 1 == plan.steps);
        let rng = &mut self.rng;
        let input = StepInput { epoch, step, index: i, lr, record_quant, inject: None, rng };
        let out = task.step(input)?;
        let mut events = out.events;
        if let Some(q) = out.quant.iter().find(|q| !(q.scale.is_finite() && q.scale > 0.0)) {
            events.push(Event::new(NanSite::Scale, q.layer.clone(), q.scale));
        }
        task = if events.is_empty() {
            task.commit(lr)
        } else {
            match self.guard(task, (epoch, step), events)? {
                Guarded::Skipped(t) => {
                    self.st.skipped_steps += 1;
                    t.discard()
                }
                Guarded::RolledBack(t) => return Ok((t, Flow::RolledBack)),
            }
        };
        pos.seen += out.images;
        pos.right += out.correct;
        let top1 = pos.right as f64 / pos.seen as f64;
        let row = self.metrics_row(epoch, Phase::Train, (out.loss, top1), lr, task.arch_lr());
        self.tables.metrics.push(&row)?;
        for error in out.quant {
            self.tables.quant.push(&QuantErrorRow { epoch, step, error })?;
        }
        let (epochs, steps) = (plan.epochs, plan.steps);
        let p = Progress { epoch, epochs, step: i + 1, steps, loss: out.loss, top1 };
        let stop = (self.progress)(&p).is_break();
        let due = plan.checkpoint_every > 0 && step.is_multiple_of(plan.checkpoint_every);
        if i + 1 < steps && (stop || due) {
            self.save_within(&task, pos, i + 1)?;
            if stop {
                return Ok((task, Flow::Stopped));
            }
        }
        // A stop on the epoch's last step finishes the epoch (validation, rows,
        // checkpoint) first.
        self.stop_after_epoch |= stop;
        Ok((task, Flow::Next))
    }

    /// A checkpoint inside the epoch, after `done` of its steps.
    fn save_within<T: EpochTask>(
        &mut self,
        task: &T,
        pos: &EpochPos,
        done: usize,
    ) -> Result<(), RunError> {
        let st = &mut self.st;
        st.epochs_done = pos.epoch;
        st.step_in_epoch = done;
        st.epoch_rng = pos.epoch_rng;
        st.rng = self.rng.state();
        (st.seen, st.right) = (pos.seen, pos.right);
        save(self.run, task, st)?;
        st.step_in_epoch = 0;
        Ok(())
    }

    /// The epoch's end: validation (guarded), its row, the task's rows, a checkpoint.
    fn end_epoch<T: EpochTask>(
        &mut self,
        mut task: T,
        pos: &EpochPos,
    ) -> Result<(T, Flow), RunError> {
        let epoch = pos.epoch;
        let val = task.validate(epoch)?;
        if !val.loss.is_finite() {
            let events = vec![Event::new(NanSite::Eval, "val", val.loss)];
            match self.guard(task, (epoch, self.st.step), events)? {
                Guarded::Skipped(t) => task = t,
                Guarded::RolledBack(t) => return Ok((t, Flow::RolledBack)),
            }
        }
        let row = self.metrics_row(epoch, Phase::Val, (val.loss, val.top1), pos.lr, task.arch_lr());
        self.tables.metrics.push(&row)?;
        write_epoch_rows(self.run, &task.epoch_rows(epoch, self.run)?)?;
        self.st.epochs_done = epoch + 1;
        self.st.rng = self.rng.state();
        (self.st.seen, self.st.right) = (0, 0);
        save(self.run, &task, &self.st)?;
        Ok((task, Flow::Next))
    }

    fn metrics_row(
        &self,
        epoch: usize,
        phase: Phase,
        (loss, top1): (f64, f64),
        lr: f64,
        arch_lr: f64,
    ) -> MetricsRow {
        let seconds = self.start.elapsed().as_secs_f64();
        MetricsRow { epoch, step: self.st.step, phase, loss, top1, lr, arch_lr, seconds }
    }

    /// The NaN guard ([`guard_events`]); a rollback also rewinds the data-order generator.
    fn guard<T: EpochTask>(
        &mut self,
        task: T,
        at: (usize, usize),
        events: Vec<Event>,
    ) -> Result<Guarded<T>, RunError> {
        let (run, plan) = (self.run, self.plan);
        let guarded = guard_events(run, &mut self.tables, plan, task, &mut self.st, at, events)?;
        if matches!(guarded, Guarded::RolledBack(_)) {
            self.rng = Rng::from_state(self.st.rng);
        }
        Ok(guarded)
    }
}

/// What the NaN guard did with a step's (or a validation's) non-finite values.
enum Guarded<T> {
    /// Logged; the run goes on (the step's update is to be discarded).
    Skipped(T),
    /// Logged, and the run went back to its last checkpoint at half the learning rate: the
    /// task and the state are the checkpoint's.
    RolledBack(T),
}

/// The NaN guard: logs the events found at `(epoch, step)`, counts one non-finite step,
/// aborts past `max_events`, and under the rollback policy reloads the last checkpoint with
/// the learning rate halved (the NaN log is kept: a rollback must not forget why).
fn guard_events<T: EpochTask>(
    run: &RunDir,
    tables: &mut Tables,
    plan: &LoopPlan,
    task: T,
    st: &mut LoopState,
    (epoch, step): (usize, usize),
    events: Vec<Event>,
) -> Result<Guarded<T>, RunError> {
    let guard = &plan.nan_guard;
    let rollback = guard.policy == NanPolicy::Rollback;
    let action = if rollback { NanAction::RolledBack } else { NanAction::Skipped };
    for e in events {
        let (site, layer, value) = (e.site, e.layer, e.value);
        tables.nan.push(&NanEventRow { epoch, step, site, layer, value, action })?;
    }
    let total = st.nan_events + 1;
    if total > guard.max_events {
        tables.nan.push(&NanEventRow {
            epoch,
            step,
            site: NanSite::Guard,
            layer: "-".into(),
            value: total as f64,
            action: NanAction::Aborted,
        })?;
        return Err(RunError::NanAbort(total));
    }
    if !rollback {
        st.nan_events = total;
        return Ok(Guarded::Skipped(task));
    }
    let (task, mut back) = load(run, task)?;
    back.nan_events = total;
    back.lr_scale = st.lr_scale * 0.5;
    back.skipped_steps = st.skipped_steps;
    *st = back;
    truncate_tables(run, st, true)?;
    *tables = Tables::open(run)?;
    tables.nan.push(&NanEventRow {
        epoch,
        step,
        site: NanSite::Lr,
        layer: "-".into(),
        value: plan.lr.0 * st.lr_scale,
        action: NanAction::LrHalved,
    })?;
    Ok(Guarded::RolledBack(task))
}
