//! The epoch loop shared by the search and QAT training. The loop owns everything but the
//! step: the learning-rate schedule, the data-order generator and its replay on resume, the
//! NaN guard (skip, or roll back to the last checkpoint with the learning rate halved), the
//! run-record rows, checkpoints every N steps and at epoch ends, progress and a clean stop.
//! A task plugs in its step, its end-of-epoch validation and rows, and its checkpoint files.
//!
//! A resumed run replays exactly: a checkpoint inside an epoch carries the generator state at
//! the epoch start (to redraw the epoch's order) and at its step (to go on drawing from there).

mod steps;

use std::ops::ControlFlow;
use std::path::Path;

use qdarts_data::Rng;
use qdarts_record::{AlphaRow, BitRow, CostRow, GenotypeRow, QuantError, RunDir};

use self::steps::Loop;
use crate::RunError;
use crate::checkpoint::LoopState;
use crate::config::{InjectSite, NanGuardConfig};
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
