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

use super::timing::{Timing, write_csv};

/// One row of the table: a runtime on a number of threads, over every round.
struct Rate {
    name: String,
    threads: usize,
    min: f64,
    max: f64,
    /// Each round's median images/s.
    rounds: Vec<f64>,
}

impl Rate {
    /// Adds one round's rates to the row `name` on `threads` threads (made when missing).
    fn add(rows: &mut Vec<Rate>, name: &str, threads: usize, rates: Vec<f64>) {
        let at = match rows.iter().position(|r| r.name == name && r.threads == threads) {
            Some(i) => i,
            None => {
                let (min, max) = (f64::INFINITY, 0.0);
                rows.push(Rate { name: name.into(), threads, min, max, rounds: Vec::new() });
                rows.len() - 1
            }
        };
        let (row, t) = (&mut rows[at], Timing::of(rates));
        row.rounds.push(t.median);
        row.min = row.min.min(t.min);
        row.max = row.max.max(t.max);
    }

    /// The median over the rounds of each round's median images/s.
    fn median(&self) -> f64 {
        Timing::of(self.rounds.clone()).median
    }
}

/// `bench runtime`: images/s of the integer runtime over the run's test set, and of
/// onnxruntime when `python` has it. With `rounds` > 1 the two alternate (qdarts, onnxruntime,
/// qdarts, …), and each ratio is the median of the per-round ratios with their min..max.
pub fn runtime_bench(
    run: &Path,
    reps: usize,
    rounds: usize,
    direct: bool,
    python: Option<&str>,
    csv: Option<&Path>,
) -> Result<()> {
    if reps == 0 || rounds == 0 {
        bail!("--reps and --rounds must be at least 1");
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
        "integer runtime on {} ({} test images, {:.1} M MACs/image), median of {reps} passes after 1 warm-up, {rounds} round(s)",
        qdf.display(),
        n,
        model.macs()?.iter().map(|m| m.0).sum::<u64>() as f64 / 1e6
    );
    print_profile(&model, &images, n)?;
    let ort = match python {
        Some(py) => ort_bench(py, &layout, &model, &images)?,
        None => None,
    };
    let mut kernels = vec![Kernels::Fast];
    if direct {
        kernels.push(Kernels::Direct);
    }
    let runtimes = kernels
        .iter()
        .map(|&k| Runtime::with_kernels(&model, k).map(|rt| (k, rt)))
        .collect::<Result<Vec<_>, _>>()?;
    let mut rows: Vec<Rate> = Vec::new();
    let mut logits = Vec::new();
    for round in 0..rounds {
        for (k, rt) in &runtimes {
            for &t in &threads {
                let warm = rt.run(&images, t);
                if round == 0 && logits.len() == usize::from(*k == Kernels::Direct) {
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
                Rate::add(&mut rows, name, t, rates);
            }
        }
        if let Some(ort) = &ort {
            for (name, t, rates) in ort.rates(&threads, reps)? {
                Rate::add(&mut rows, &name, t, rates);
            }
        }
    }
    if let [fast, direct] = &logits[..] {
        check_direct(fast, direct, model.graph.classes.max(1), &layout)?;
    }
    print_rates(&rows, rounds, csv)
}

/// onnxruntime on the run's exported model over `images`, when the run has one.
fn ort_bench(
    python: &str,
    layout: &RunLayout,
    model: &qdarts_frozen::FrozenModel,
    images: &[f32],
) -> Result<Option<OrtBench>> {
    let onnx = layout.onnx_model();
    if !onnx.exists() {
        println!("note: {} is missing (run qdarts export): onnxruntime left out", onnx.display());
        return Ok(None);
    }
    let [c, h, w] = [0, 1, 2].map(|i| model.graph.input_shape[i]);
    OrtBench::new(python, &onnx, images, [images.len() / model_len(model), c, h, w])
}

/// The fast kernels must give the direct kernel's int32 logits on every image.
fn check_direct(fast: &[i32], direct: &[i32], classes: usize, layout: &RunLayout) -> Result<()> {
    let n = fast.len() / classes;
    let differ = fast.chunks(classes).zip(direct.chunks(classes)).filter(|(a, b)| a != b).count();
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
    Ok(())
}

/// Where one thread's time goes, per node kind (over at most 200 images).
fn print_profile(model: &qdarts_frozen::FrozenModel, images: &[f32], n: usize) -> Result<()> {
    let profiled = n.min(200);
    let profile = Runtime::new(model)?.profile(&images[..profiled * model_len(model)]);
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
    Ok(())
}

/// The table (and CSV): each row's images/s, and qdarts' images/s over the row's, as the
/// median of the per-round ratios with their min..max.
fn print_rates(rows: &[Rate], rounds: usize, csv: Option<&Path>) -> Result<()> {
    let ratio_of = |r: &Rate| {
        let ours = rows.iter().find(|o| o.name == "qdarts" && o.threads == r.threads)?;
        Some(Timing::of(ours.rounds.iter().zip(&r.rounds).map(|(q, o)| q / o).collect()))
    };
    println!(
        "{:<34} {:>8} {:>12} {:>10} {:>20} {:>22}",
        "runtime", "threads", "images/s", "ms/image", "min..max images/s", "vs qdarts"
    );
    let mut lines = Vec::new();
    for r in rows {
        let ratio = ratio_of(r);
        let shown = ratio.map_or(String::new(), |t| {
            if rounds > 1 {
                format!("{:.2}× ({:.2}..{:.2})", t.median, t.min, t.max)
            } else {
                format!("{:.2}×", t.median)
            }
        });
        println!(
            "{:<34} {:>8} {:>12.1} {:>10.3} {:>20} {:>22}",
            r.name,
            r.threads,
            r.median(),
            1000.0 / r.median(),
            format!("{:.1}..{:.1}", r.min, r.max),
            shown
        );
        lines.push(RateCsvRow {
            runtime: &r.name,
            threads: r.threads,
            images_per_s: r.median(),
            min: r.min,
            max: r.max,
            rounds,
            vs_qdarts: ratio.map(|t| t.median),
            vs_qdarts_min: ratio.map(|t| t.min),
            vs_qdarts_max: ratio.map(|t| t.max),
        });
    }
    println!(
        "(vs qdarts: qdarts' images/s over the row's, same threads; above 1 means qdarts is faster{})",
        if rounds > 1 { "; median of the per-round ratios (min..max)" } else { "" }
    );
    if let Some(p) = csv {
        write_csv(p, lines)?;
    }
    Ok(())
}

/// One row of `bench runtime --csv`.
#[derive(serde::Serialize)]
struct RateCsvRow<'a> {
    runtime: &'a str,
    threads: usize,
    images_per_s: f64,
    min: f64,
    max: f64,
    rounds: usize,
    vs_qdarts: Option<f64>,
    vs_qdarts_min: Option<f64>,
    vs_qdarts_max: Option<f64>,
}

fn model_len(model: &qdarts_frozen::FrozenModel) -> usize {
    model.graph.input_shape.iter().product()
}

/// `scripts/ort_bench.py`, looked for under the working directory, then in the source tree
/// the binary was built from.
fn ort_script() -> Option<PathBuf> {
    let rel = Path::new("scripts").join("ort_bench.py");
    [rel.clone(), Path::new(env!("CARGO_MANIFEST_DIR")).join(&rel)].into_iter().find(|p| p.exists())
}

/// onnxruntime timed by `scripts/ort_bench.py` on a run's ONNX model over the very images
/// the integer runtime ran (written once to a temporary file, removed on drop).
struct OrtBench {
    python: String,
    script: PathBuf,
    onnx: PathBuf,
    dir: PathBuf,
    shape: [usize; 4],
}

impl Drop for OrtBench {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl OrtBench {
    /// `None`, with a note, when the script, Python or its onnxruntime is missing.
    fn new(python: &str, onnx: &Path, images: &[f32], shape: [usize; 4]) -> Result<Option<Self>> {
        let Some(script) = ort_script() else {
            println!("note: scripts/ort_bench.py not found: onnxruntime left out");
            return Ok(None);
        };
        let dir = std::env::temp_dir().join(format!("qdarts-ort-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let bench = OrtBench { python: python.into(), script, onnx: onnx.into(), dir, shape };
        let raw = bench.images();
        let bytes: Vec<u8> = images.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(&raw, bytes).with_context(|| format!("writing {}", raw.display()))?;
        // One pass on one image tells whether Python and onnxruntime are there at all.
        match bench.call(&[1], 1, 1) {
            Ok(Some(_)) => Ok(Some(bench)),
            Ok(None) => {
                println!(
                    "note: {python} has no onnxruntime (pip install onnxruntime numpy): onnxruntime left out"
                );
                Ok(None)
            }
            Err(e) => {
                println!("note: {e:#}: onnxruntime left out (--python names the interpreter)");
                Ok(None)
            }
        }
    }

    fn images(&self) -> PathBuf {
        self.dir.join("images.f32")
    }

    /// Each optimization level's rates per thread count: (row name, threads, images/s of each
    /// timed pass).
    fn rates(&self, threads: &[usize], reps: usize) -> Result<Vec<(String, usize, Vec<f64>)>> {
        let text = self.call(threads, reps, 0)?.context("onnxruntime went missing")?;
        let mut rows = Vec::new();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split(',').collect();
            let unreadable =
                || anyhow::anyhow!("{}: unreadable row {line:?}", self.script.display());
            let level = match f.first() {
                Some(&"all") => "graph optimizations on",
                Some(&"none") => "graph optimizations off",
                _ => return Err(unreadable()),
            };
            let t = f.get(1).and_then(|v| v.parse().ok()).ok_or_else(unreadable)?;
            let passes = f
                .get(5)
                .ok_or_else(unreadable)?
                .split(';')
                .map(|v| v.parse::<f64>().map_err(|_| unreadable()))
                .collect::<Result<Vec<_>>>()?;
            rows.push((format!("onnxruntime ({level})"), t, passes));
        }
        if rows.is_empty() {
            bail!("{} printed no rows:\n{text}", self.script.display());
        }
        Ok(rows)
    }

    /// Runs the script: its stdout, `None` when Python lacks onnxruntime. `limit` > 0 times
    /// only that many images.
    fn call(&self, threads: &[usize], reps: usize, limit: usize) -> Result<Option<String>> {
        let mut cmd = Command::new(&self.python);
        cmd.arg(&self.script)
            .arg(&self.onnx)
            .arg("--images")
            .arg(self.images())
            .arg("--shape")
            .arg(self.shape.map(|v| v.to_string()).join(","))
            .arg("--threads")
            .arg(threads.iter().map(ToString::to_string).collect::<Vec<_>>().join(","))
            .arg("--reps")
            .arg(reps.to_string());
        if limit > 0 {
            cmd.arg("--limit").arg(limit.to_string());
        }
        let out = cmd.output().with_context(|| format!("running {}", self.python))?;
        match out.status.code() {
            Some(0) => Ok(Some(String::from_utf8_lossy(&out.stdout).into_owned())),
            Some(3) => Ok(None),
            _ => bail!(
                "{} failed ({}):\n{}",
                self.script.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ),
        }
    }
}
