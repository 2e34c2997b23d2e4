//! `qdarts bench runtime`: images/s of a frozen model's integer runtime over its run's test
//! images, on one thread and on every core.

use std::path::Path;
use std::time::Instant;

use anyhow::{Result, bail};
use qdarts_frozen::Runtime;
use qdarts_record::RunLayout;
use qdarts_train::eval::{check_input, normalized};
use qdarts_train::{TrainConfig, test_set};

use super::timing::write_csv;

/// `bench runtime`: images/s of the integer runtime over the run's test set.
pub fn runtime_bench(run: &Path, reps: usize, csv: Option<&Path>) -> Result<()> {
    if reps == 0 {
        bail!("--reps must be at least 1");
    }
    let layout = RunLayout::new(run);
    let qdf = layout.frozen_model();
    let model = crate::train_cmd::load_frozen(run)?;
    let cfg = TrainConfig::load(&layout.config(), &[])?;
    let set = test_set(&cfg)?;
    check_input(&model, &set, &qdf.display().to_string())?;
    let rt = Runtime::new(&model)?;
    let images = normalized(&set, &model);
    let n = set.len();
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let mut threads = vec![1];
    if cores > 1 {
        threads.push(cores);
    }
    println!(
        "integer runtime on {} ({} test images, {:.1} M MACs/image), median of {reps} passes after 1 warm-up",
        qdf.display(),
        n,
        model.macs()?.iter().map(|m| m.0).sum::<u64>() as f64 / 1e6
    );
    println!("{:>8} {:>12} {:>12} {:>22}", "threads", "images/s", "ms/image", "min..max images/s");
    let mut lines = Vec::new();
    for t in threads {
        let _ = rt.run(&images, t);
        let mut rates: Vec<f64> = (0..reps)
            .map(|_| {
                let t0 = Instant::now();
                std::hint::black_box(rt.run(&images, t));
                n as f64 / t0.elapsed().as_secs_f64()
            })
            .collect();
        rates.sort_by(f64::total_cmp);
        let med = rates[rates.len() / 2];
        println!(
            "{t:>8} {med:>12.1} {:>12.3} {:>22}",
            1000.0 / med,
            format!("{:.1}..{:.1}", rates[0], rates[rates.len() - 1])
        );
        lines.push(format!("{t},{med:.3},{:.3},{:.3}", rates[0], rates[rates.len() - 1]));
    }
    if let Some(p) = csv {
        write_csv(p, "threads,images_per_s,min,max", lines)?;
    }
    Ok(())
}
