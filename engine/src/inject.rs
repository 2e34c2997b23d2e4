//! Non-finite values on purpose, for the tests of the NaN guard: `InjectNan` wraps a task
//! and, once, asks its step to make the loss or the gradients NaN ([`StepInput::inject`]) or
//! makes an epoch's validation loss NaN. A run gets one through
//! [`LoopPlan::inject`](crate::LoopPlan::inject), which no config key and no command-line flag
//! reaches.

use std::path::Path;

use qdarts_data::Rng;
use qdarts_record::RunDir;

use crate::RunError;
use crate::config::InjectSite;
use crate::epoch::{EpochRows, EpochTask, Evaluation, StepInput, StepOutcome};

/// One non-finite value: where, and at which global step (1-based). A validation loss is
/// made NaN at the end of the epoch that holds the step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NanInjection {
    /// The global step (1-based).
    pub step: usize,
    /// Where the NaN goes.
    pub site: InjectSite,
}

/// A task whose run meets one injected NaN. The injection happens once per process: a
/// rollback or a resume that replays the step does not meet it again.
#[derive(Debug)]
pub(crate) struct InjectNan<T> {
    inner: T,
    at: NanInjection,
    /// Steps per epoch (to find the epoch of a validation injection).
    steps: usize,
    done: bool,
}

impl<T: EpochTask> InjectNan<T> {
    pub(crate) fn new(inner: T, at: NanInjection, steps: usize) -> Self {
        InjectNan { inner, at, steps, done: false }
    }

    pub(crate) fn into_inner(self) -> T {
        self.inner
    }

    fn map(self, f: impl FnOnce(T) -> T) -> Self {
        InjectNan { inner: f(self.inner), ..self }
    }

    fn try_map(self, f: impl FnOnce(T) -> Result<T, RunError>) -> Result<Self, RunError> {
        let InjectNan { inner, at, steps, done } = self;
        Ok(InjectNan { inner: f(inner)?, at, steps, done })
    }
}

impl<T: EpochTask> EpochTask for InjectNan<T> {
    fn shuffle(&mut self, rng: &mut Rng) {
        self.inner.shuffle(rng);
    }

    fn step(&mut self, input: StepInput<'_>) -> Result<StepOutcome, RunError> {
        let hit = !self.done && self.at.site != InjectSite::Val && self.at.step == input.step;
        self.done |= hit;
        let inject = if hit { Some(self.at.site) } else { input.inject };
        self.inner.step(StepInput { inject, ..input })
    }

    fn commit(self, lr: f64) -> Self {
        self.map(|t| t.commit(lr))
    }

    fn discard(self) -> Self {
        self.map(T::discard)
    }

    fn arch_lr(&self) -> f64 {
        self.inner.arch_lr()
    }

    fn validate(&mut self, epoch: usize) -> Result<Evaluation, RunError> {
        let mut val = self.inner.validate(epoch)?;
        let steps = epoch * self.steps + 1..=(epoch + 1) * self.steps;
        if !self.done && self.at.site == InjectSite::Val && steps.contains(&self.at.step) {
            self.done = true;
            val.loss = f64::NAN;
        }
        Ok(val)
    }

    fn epoch_rows(&mut self, epoch: usize, run: &RunDir) -> Result<EpochRows, RunError> {
        self.inner.epoch_rows(epoch, run)
    }

    fn save(&self, dir: &Path) -> Result<(), RunError> {
        self.inner.save(dir)
    }

    fn load(self, dir: &Path) -> Result<Self, RunError> {
        self.try_map(|t| t.load(dir))
    }
}
