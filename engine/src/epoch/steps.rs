//! The loop of [`run_epochs`](super::run_epochs) as named steps over one state: an epoch's
//! start (its data order drawn or redrawn), a step (run, committed or guarded, recorded,
//! reported), a checkpoint within the epoch, the epoch's end (validation, rows, checkpoint),
//! and the NaN guard.

use std::ops::ControlFlow;
use std::time::Instant;

use qdarts_data::Rng;
use qdarts_record::{
    AlphaRow, BitRow, CostRow, GenotypeRow, MetricsRow, NanAction, NanEventRow, NanSite, Phase,
    QuantErrorRow, RunDir, TableWriter,
};

use super::{EpochRows, EpochTask, LoopEnd, LoopPlan, Progress, StepInput};
use crate::RunError;
use crate::checkpoint::{LoopState, load, save, truncate_tables};
use crate::config::NanPolicy;
use crate::grads::Event;

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

/// The loop's state between its steps.
pub(super) struct Loop<'a> {
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
    pub(super) fn new(
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
    pub(super) fn epochs<T: EpochTask>(mut self, mut task: T) -> Result<LoopEnd<T>, RunError> {
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
