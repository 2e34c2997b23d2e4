//! `qdarts search`: read the experiment, run the search with a progress bar on stderr, print
//! where the run record is.

use std::ops::ControlFlow;
use std::path::Path;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use qdarts_search::config::ExperimentConfig;
use qdarts_search::search::{Progress, run_search};

use crate::backend::Backend;

/// Runs `qdarts search`.
pub fn run(
    config: &Path,
    overrides: &[String],
    resume: Option<&Path>,
    backend: Backend,
) -> Result<()> {
    // A resumed run continues with the config it was started with.
    let cfg = match resume {
        Some(dir) => {
            if !dir.is_dir() {
                anyhow::bail!("{}: no such run folder", dir.display());
            }
            ExperimentConfig::load(&dir.join("config.toml"), overrides)?
        }
        None => ExperimentConfig::load(config, overrides)?,
    };
    let device = backend.device()?;
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template(
            "epoch {prefix} [{bar:30}] {pos}/{len} {msg} ({elapsed}, eta {eta})",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    let mut last_epoch = usize::MAX;
    let mut on_progress = |p: &Progress| {
        if p.epoch != last_epoch {
            last_epoch = p.epoch;
            bar.set_length(p.steps as u64);
            bar.set_prefix(format!("{}/{}", p.epoch + 1, p.epochs));
        }
        bar.set_position(p.step as u64);
        bar.set_message(format!("loss {:.3} top1 {:.1}%", p.loss, 100.0 * p.top1));
        ControlFlow::Continue(())
    };
    let out = run_search(&cfg, &device, resume, &mut on_progress)
        .with_context(|| format!("search `{}` failed", cfg.name))?;
    bar.finish_and_clear();
    println!("{}", out.genotype.to_darts_text());
    eprintln!("run record: {}", out.run_dir.display());
    Ok(())
}
