//! `qdarts check RUN`: is a run folder whole? Its config, both checkpoints against their
//! checksums, every table against the checkpoint a resume would load, and the frozen model.
//! Prints one line per part; exit 1 when something is wrong.

use std::path::Path;

use anyhow::{Result, bail};
use qdarts_engine::config::Experiment;
use qdarts_engine::{LoopState, RunKind};
use qdarts_frozen::FrozenModel;
use qdarts_record::{
    AlphaRow, BitRow, CostRow, GenotypeRow, MetricsRow, NanEventRow, Phase, QuantErrorRow,
    RunLayout, SelectionRow, Table, Verified, choose_checkpoint, read_plan, read_table,
    verify_checkpoint,
};
use qdarts_search::config::ExperimentConfig;
use qdarts_train::TrainConfig;

/// What the check found.
#[derive(Default)]
struct Findings {
    problems: usize,
}

impl Findings {
    fn ok(&self, part: &str, what: impl std::fmt::Display) {
        println!("  ok       {part:<22} {what}");
    }
    fn bad(&mut self, part: &str, what: impl std::fmt::Display) {
        self.problems += 1;
        println!("  PROBLEM  {part:<22} {what}");
    }
    fn note(&self, part: &str, what: impl std::fmt::Display) {
        println!("  note     {part:<22} {what}");
    }
}

/// Runs `qdarts check`.
pub fn check(run: &Path) -> Result<()> {
    let layout = RunLayout::new(run);
    if !run.is_dir() {
        bail!("{}: no such run folder", run.display());
    }
    if !layout.looks_like_run() {
        bail!("{}: not a run folder (no config.toml or metrics.csv)", run.display());
    }
    println!("{}", run.display());
    let mut f = Findings::default();
    check_config(&layout, &mut f);
    let step = check_checkpoints(&layout, &mut f);
    check_tables(&layout, step, &mut f);
    check_frozen(&layout, &mut f);
    if f.problems > 0 {
        bail!("{}: {} problem(s) found", run.display(), f.problems);
    }
    println!("no problems found");
    Ok(())
}

fn check_config(layout: &RunLayout, f: &mut Findings) {
    let path = layout.config();
    let parsed = match RunKind::of(layout.root()) {
        Some(RunKind::Search) => ExperimentConfig::load(&path, &[]).map(|_| "a search"),
        Some(RunKind::Train) => TrainConfig::load(&path, &[]).map(|_| "a training run"),
        None => {
            f.bad("config.toml", "missing, or neither a search nor a training config");
            return;
        }
    };
    match parsed {
        Ok(kind) => f.ok("config.toml", kind),
        Err(e) => f.bad("config.toml", e),
    }
    match read_plan(layout) {
        Some(p) => f.ok("plan.json", format!("{} epochs of {} steps", p.epochs, p.steps_per_epoch)),
        None => f.bad("plan.json", "missing or unreadable"),
    }
}

/// Checks both checkpoints; returns the global step of the one a resume would load.
fn check_checkpoints(layout: &RunLayout, f: &mut Findings) -> Option<usize> {
    for (name, dir) in
        [("checkpoint/", layout.checkpoint()), ("checkpoint.prev/", layout.checkpoint_prev())]
    {
        if !dir.exists() {
            f.note(name, "absent");
            continue;
        }
        let step = LoopState::read_in(&dir).map(|s| s.step);
        match (verify_checkpoint(&dir), step) {
            (Ok(Verified::Ok), Ok(s)) => f.ok(name, format!("step {s}, every checksum matches")),
            (Ok(Verified::Unchecked), Ok(s)) => {
                f.ok(name, format!("step {s}, written before checksums: not verified"));
            }
            (Ok(_), Err(e)) => f.bad(name, e),
            (Err(reason), _) => f.bad(name, format!("does not verify: {reason}")),
        }
    }
    let choice = choose_checkpoint(layout);
    let dir = choice.dir?;
    let step = LoopState::read_in(&dir).ok()?.step;
    let name = dir.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    f.note("resume", format!("would continue from {name}/ at step {step}"));
    Some(step)
}

/// Reads every table; counts the training rows past the checkpoint a resume loads (a resume
/// cuts them: steps run after the last checkpoint, or the row in flight).
fn check_tables(layout: &RunLayout, step: Option<usize>, f: &mut Findings) {
    fn read<T: Table>(layout: &RunLayout, f: &mut Findings) -> Option<Vec<T>> {
        let path = layout.table::<T>();
        let name = path.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        if !path.exists() {
            return None;
        }
        match read_table::<T>(&path) {
            Ok(rows) => {
                f.ok(&name, format!("{} rows", rows.len()));
                Some(rows)
            }
            Err(e) => {
                f.bad(&name, e);
                None
            }
        }
    }
    let metrics = read::<MetricsRow>(layout, f);
    read::<NanEventRow>(layout, f);
    read::<QuantErrorRow>(layout, f);
    read::<AlphaRow>(layout, f);
    read::<GenotypeRow>(layout, f);
    read::<BitRow>(layout, f);
    read::<CostRow>(layout, f);
    read::<SelectionRow>(layout, f);
    if let (Some(rows), Some(step)) = (metrics, step) {
        let after = rows.iter().filter(|r| r.phase == Phase::Train && r.step > step).count();
        if after > 0 {
            let (rows, them) = if after == 1 { ("row", "it") } else { ("rows", "them") };
            let what =
                format!("{after} training {rows} after step {step} (a resume redoes {them})");
            f.note("metrics.csv", what);
        }
    }
}

fn check_frozen(layout: &RunLayout, f: &mut Findings) {
    let path = layout.frozen_model();
    if !path.exists() {
        return;
    }
    match FrozenModel::load(&path) {
        Ok(m) => {
            f.ok("frozen/model.qdf", format!("{} nodes, loads and validates", m.graph.nodes.len()))
        }
        Err(e) => f.bad("frozen/model.qdf", e),
    }
}
