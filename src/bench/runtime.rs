//! `qdarts bench runtime`: images/s of a frozen model's integer runtime over its run's test
//! images, on one thread and on every core, beside onnxruntime on the run's exported ONNX
//! model over the very same images (`scripts/ort_bench.py`) when Python has onnxruntime.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use qdarts_engine::config::Experiment;
use qdarts_frozen::Runtime;
use qdarts_frozen::runtime::Kernels;
use qdarts_record::RunLayout;
use qdarts_train::eval::{check_input, normalized};
use qdarts_train::{TrainConfig, test_set};

use super::timing::write_csv;

/// One row of the table: a runtime on a number of threads.
struct Rate {
    name: String,
    threads: usize,
    median: f64,
    min: f64,
    max: f64,
}

/// `bench runtime`: images/s of the integer runtime over the run's test set, and of
/// onnxruntime when `python` has it.
pub fn runtime_bench(
    run: &Path,
    reps: usize,
    direct: bool,
    python: Option<&str>,
    csv: Option<&Path>,
) -> Result<()> {
    if reps == 0 {
        bail!("--reps must be at least 1");
    }
    let layout = RunLayout::new(run);
    let qdf = layout.frozen_model();
    let model = crate::train_cmd::load_frozen(run)?;
    let cfg = TrainConfig::load(&layout.config(), &[])?;
    let set = test_set(&cfg)?;
    check_input(&model, &set, &qdf.display().to_string())?;
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
    // Where one thread's time goes, per node kind (over at most 200 images).
    let profiled = n.min(200);
    let profile = Runtime::new(&model)?.profile(&images[..profiled * model_len(&model)]);
    let total: f64 = profile.iter().map(|p| p.seconds).sum();
    println!("one thread, fast kernels, by node kind ({profiled} images):");
    println!("{:<16} {:>8} {:>10} {:>12}", "node kind", "share", "ms/image", "GMAC/s");
    let imgs = profiled.max(1) as f64;
    for p in &profile {
        println!(
            "{:<16} {:>7.1}% {:>10.4} {:>12}",
            p.kind,
            100.0 * p.seconds / total.max(1e-12),
            1000.0 * p.seconds / imgs,
            if p.macs > 0 {
                format!("{:.2}", p.macs as f64 / p.seconds.max(1e-12) / 1e9)
            } else {
                String::new()
            }
        );
    }
    let mut kernels = vec![Kernels::Fast];
    if direct {
        kernels.push(Kernels::Direct);
    }
    let mut rows = Vec::new();
    let mut logits = Vec::new();
    for k in kernels {
        let rt = Runtime::with_kernels(&model, k)?;
        for &t in &threads {
            let warm = rt.run(&images, t);
            if logits.len() == usize::from(k == Kernels::Direct) {
                logits.push(warm);
            }
            let rates: Vec<f64> = (0..reps)
                .map(|_| {
                    let t0 = Instant::now();
                    std::hint::black_box(rt.run(&images, t));
                    n as f64 / t0.elapsed().as_secs_f64()
                })
                .collect();
            let name = match k {
                Kernels::Fast => "qdarts",
                Kernels::Direct => "qdarts (direct kernel)",
            };
            rows.push(summarise(name, t, rates));
        }
    }
    if let [fast, direct] = &logits[..] {
        let classes = model.graph.classes.max(1);
        let differ =
            fast.chunks(classes).zip(direct.chunks(classes)).filter(|(a, b)| a != b).count();
        println!(
            "fast vs direct kernel: {} of {n} images' int32 logits differ{}",
            differ,
            if differ == 0 { " (bit-exact)" } else { "" }
        );
        if differ > 0 {
            bail!(
                "the fast kernels disagree with the direct one on {differ} of {n} images of {}",
                layout.root().display()
            );
        }
    }
    if let Some(py) = python {
        let onnx = layout.onnx_model();
        if !onnx.exists() {
            println!(
                "note: {} is missing (run qdarts export): onnxruntime left out",
                onnx.display()
            );
        } else {
            let shape = [
                n,
                model.graph.input_shape[0],
                model.graph.input_shape[1],
                model.graph.input_shape[2],
            ];
            rows.extend(onnxruntime_rates(py, &onnx, &images, shape, &threads, reps)?);
        }
    }
    println!(
        "{:<34} {:>8} {:>12} {:>10} {:>20} {:>9}",
        "runtime", "threads", "images/s", "ms/image", "min..max images/s", "vs qdarts"
    );
    for r in &rows {
        let ours = rows.iter().find(|o| o.name == "qdarts" && o.threads == r.threads);
        let ratio = ours.map_or(String::new(), |o| format!("{:.2}×", o.median / r.median));
        println!(
            "{:<34} {:>8} {:>12.1} {:>10.3} {:>20} {:>9}",
            r.name,
            r.threads,
            r.median,
            1000.0 / r.median,
            format!("{:.1}..{:.1}", r.min, r.max),
            ratio
        );
    }
    println!(
        "(vs qdarts: qdarts' images/s over the row's, same threads; above 1 means qdarts is faster)"
    );
    if let Some(p) = csv {
        let lines = rows
            .iter()
            .map(|r| format!("{},{},{:.3},{:.3},{:.3}", r.name, r.threads, r.median, r.min, r.max));
        write_csv(p, "runtime,threads,images_per_s,min,max", lines)?;
    }
    Ok(())
}

fn model_len(model: &qdarts_frozen::FrozenModel) -> usize {
    model.graph.input_shape.iter().product()
}

fn summarise(name: &str, threads: usize, mut rates: Vec<f64>) -> Rate {
    rates.sort_by(f64::total_cmp);
    Rate {
        name: name.into(),
        threads,
        median: rates[rates.len() / 2],
        min: rates[0],
        max: rates[rates.len() - 1],
    }
}

/// `scripts/ort_bench.py`, looked for under the working directory, then in the source tree
/// the binary was built from.
fn ort_script() -> Option<PathBuf> {
    let rel = Path::new("scripts").join("ort_bench.py");
    [rel.clone(), Path::new(env!("CARGO_MANIFEST_DIR")).join(&rel)].into_iter().find(|p| p.exists())
}

/// onnxruntime's images/s on `onnx` over `images` (the normalized floats the integer runtime
/// ran), at both graph optimization levels. Empty, with a note, when Python, onnxruntime or
/// the script is missing.
fn onnxruntime_rates(
    python: &str,
    onnx: &Path,
    images: &[f32],
    shape: [usize; 4],
    threads: &[usize],
    reps: usize,
) -> Result<Vec<Rate>> {
    let Some(script) = ort_script() else {
        println!("note: scripts/ort_bench.py not found: onnxruntime left out");
        return Ok(Vec::new());
    };
    let dir = std::env::temp_dir().join(format!("qdarts-ort-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let raw = dir.join("images.f32");
    let bytes: Vec<u8> = images.iter().flat_map(|v| v.to_le_bytes()).collect();
    let written = std::fs::write(&raw, bytes).with_context(|| format!("writing {}", raw.display()));
    let out = written.and_then(|()| {
        Command::new(python)
            .arg(&script)
            .arg(onnx)
            .arg("--images")
            .arg(&raw)
            .arg("--shape")
            .arg(shape.map(|v| v.to_string()).join(","))
            .arg("--threads")
            .arg(threads.iter().map(ToString::to_string).collect::<Vec<_>>().join(","))
            .arg("--reps")
            .arg(reps.to_string())
            .output()
            .with_context(|| format!("running {python}"))
    });
    let _ = std::fs::remove_dir_all(&dir);
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            println!("note: {e:#}: onnxruntime left out (--python names the interpreter)");
            return Ok(Vec::new());
        }
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    match out.status.code() {
        Some(0) => {}
        Some(3) => {
            println!(
                "note: {python} has no onnxruntime (pip install onnxruntime numpy): onnxruntime left out"
            );
            return Ok(Vec::new());
        }
        _ => bail!("{} failed ({}):\n{stderr}", script.display(), out.status),
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut rows = Vec::new();
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        let parse = |i: usize| -> Result<f64> {
            f.get(i)
                .and_then(|v| v.parse().ok())
                .with_context(|| format!("{}: unreadable row {line:?}", script.display()))
        };
        let level = match f.first() {
            Some(&"all") => "graph optimizations on",
            Some(&"none") => "graph optimizations off",
            _ => bail!("{}: unreadable row {line:?}", script.display()),
        };
        rows.push(Rate {
            name: format!("onnxruntime ({level})"),
            threads: parse(1)? as usize,
            median: parse(2)?,
            min: parse(3)?,
            max: parse(4)?,
        });
    }
    if rows.is_empty() {
        bail!("{} printed no rows:\n{text}{stderr}", script.display());
    }
    Ok(rows)
}
