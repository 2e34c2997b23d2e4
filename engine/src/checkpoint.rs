//! The loop's checkpoint: its position and counters (`state.json`, beside the task's files),
//! written atomically, read back on resume or rollback, and the tables cut back to it.

use qdarts_record::{
    AlphaRow, BitRow, ChangeRow, CheckpointPart, CostRow, Damaged, GenotypeRow, MetricsRow,
    NanEventRow, Plan, QuantErrorRow, RunDir, SelectionRow, choose_checkpoint, utc_stamp,
    write_atomic,
};
use serde::{Deserialize, Serialize};

use crate::epoch::EpochTask;
use crate::{RunError, checkpoint_error};

/// The loop's position and counters, saved as the checkpoint's `state.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoopState {
    /// Epochs completed.
    pub epochs_done: usize,
    /// Global step.
    pub step: usize,
    /// Data-order generator.
    pub rng: u64,
    /// Non-finite events so far.
    pub nan_events: usize,
    /// Factor on the weight learning rate (halved by each rollback).
    #[serde(default = "LoopState::unit_lr_scale")]
    pub lr_scale: f64,
    /// Steps of the epoch `epochs_done` already taken (0: the checkpoint is at an epoch start).
    #[serde(default)]
    pub step_in_epoch: usize,
    /// Data-order generator at the start of that epoch (it shuffles the epoch's order).
    #[serde(default)]
    pub epoch_rng: u64,
    /// Training images seen in that epoch so far (running top-1).
    #[serde(default)]
    pub seen: usize,
    /// Of which classified right.
    #[serde(default)]
    pub right: usize,
    /// Steps whose update the NaN guard skipped.
    #[serde(default)]
    pub skipped_steps: usize,
}

impl LoopState {
    fn unit_lr_scale() -> f64 {
        1.0
    }

    /// The state of a run that has not taken a step.
    pub fn fresh(seed: u64) -> Self {
        LoopState {
            epochs_done: 0,
            step: 0,
            rng: seed,
            nan_events: 0,
            lr_scale: 1.0,
            step_in_epoch: 0,
            epoch_rng: seed,
            seen: 0,
            right: 0,
            skipped_steps: 0,
        }
    }

    /// Reads the state of a run's last checkpoint.
    pub fn read(run: &qdarts_record::RunLayout) -> Result<Self, RunError> {
        Self::read_in(&run.checkpoint())
    }

    /// Reads the state of the checkpoint folder `dir`.
    pub fn read_in(dir: &std::path::Path) -> Result<Self, RunError> {
        let path = CheckpointPart::State.in_dir(dir);
        let bytes = std::fs::read(&path).map_err(|e| checkpoint_error(&path, e))?;
        serde_json::from_slice(&bytes).map_err(|e| checkpoint_error(&path, e))
    }
}

pub(crate) fn save<T: EpochTask>(run: &RunDir, task: &T, st: &LoopState) -> Result<(), RunError> {
    run.replace_checkpoint(|tmp| {
        task.save(tmp)?;
        let path = CheckpointPart::State.in_dir(tmp);
        let json = serde_json::to_vec_pretty(st).map_err(|e| checkpoint_error(&path, e))?;
        Ok(write_atomic(&path, &json)?)
    })
}

pub(crate) fn load<T: EpochTask>(run: &RunDir, task: T) -> Result<(T, LoopState), RunError> {
    let st = LoopState::read(run)?;
    Ok((task.load(&run.checkpoint())?, st))
}

/// Cuts every table back to what the last checkpoint had seen (`keep_nan`: the NaN events
/// stay, as a rollback must not forget why it happened).
pub(crate) fn truncate_tables(
    run: &RunDir,
    st: &LoopState,
    keep_nan: bool,
) -> Result<(), RunError> {
    let (e, s) = (st.epochs_done, st.step);
    run.truncate::<MetricsRow>(e, s)?;
    if !keep_nan {
        run.truncate::<NanEventRow>(e, s)?;
    }
    run.truncate::<QuantErrorRow>(e, s)?;
    run.truncate::<AlphaRow>(e, s)?;
    run.truncate::<GenotypeRow>(e, s)?;
    run.truncate::<BitRow>(e, s)?;
    run.truncate::<CostRow>(e, s)?;
    run.truncate::<SelectionRow>(e, s)?;
    Ok(())
}

fn remove_tables(run: &RunDir) -> Result<(), RunError> {
    run.remove::<MetricsRow>()?;
    run.remove::<NanEventRow>()?;
    run.remove::<QuantErrorRow>()?;
    run.remove::<AlphaRow>()?;
    run.remove::<GenotypeRow>()?;
    run.remove::<BitRow>()?;
    run.remove::<CostRow>()?;
    run.remove::<SelectionRow>()?;
    Ok(())
}

/// Prepares `run` for the loop: with `resume`, the newest checkpoint that verifies is loaded
/// (`checkpoint/`, else `checkpoint.prev/`: see [`choose_checkpoint`]) and the tables are cut
/// back to it (a run killed before its first checkpoint starts over; a run whose every
/// checkpoint is damaged is an error that says what is wrong with each); without one, an
/// initial checkpoint is written, the state a rollback in the first epoch returns to.
pub fn start<T: EpochTask>(
    run: &RunDir,
    task: T,
    seed: u64,
    resume: bool,
) -> Result<(T, LoopState), RunError> {
    if resume {
        let choice = choose_checkpoint(run);
        if let Some(mut dir) = choice.dir {
            if dir == run.checkpoint_new() {
                // Killed between the two renames of a swap: the new checkpoint is complete.
                std::fs::rename(&dir, run.checkpoint()).map_err(|e| checkpoint_error(&dir, e))?;
                dir = run.checkpoint();
            }
            let st = LoopState::read_in(&dir)?;
            let task = task.load(&dir)?;
            truncate_tables(run, &st, false)?;
            return Ok((task, st));
        }
        if !choice.damaged.is_empty() {
            return Err(checkpoint_error(&run.checkpoint(), damaged_message(&choice.damaged)));
        }
        remove_tables(run)?;
    }
    let st = LoopState::fresh(seed);
    if !run.checkpoint().exists() {
        save(run, &task, &st)?;
    }
    Ok((task, st))
}

/// What is wrong with each damaged checkpoint, for an error or a note.
pub fn damaged_message(damaged: &[Damaged]) -> String {
    let each: Vec<String> = damaged
        .iter()
        .map(|d| {
            let name = d.dir.file_name().map_or_else(String::new, |n| n.to_string_lossy().into());
            format!("{name}/ does not verify ({})", d.reason)
        })
        .collect();
    each.join("; ")
}

/// Records in `changes.csv` that a resumed run's epochs (`key`) went from the old plan's to
/// `new`'s, at the global step it resumed at (`--extend-epochs`).
pub fn note_epochs_change(
    run: &RunDir,
    old: Option<&Plan>,
    new: &Plan,
    key: &str,
    step: usize,
) -> Result<(), RunError> {
    let Some(old) = old.filter(|o| o.epochs != new.epochs) else { return Ok(()) };
    run.writer::<ChangeRow>()?.push(&ChangeRow {
        utc: utc_stamp(),
        step,
        key: key.into(),
        from: old.epochs.to_string(),
        to: new.epochs.to_string(),
    })?;
    Ok(())
}
