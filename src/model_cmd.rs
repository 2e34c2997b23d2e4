//! `qdarts train`, `freeze`, `export` and `eval`: from a genotype to a checked integer model.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use qdarts_frozen::{FrozenModel, Runtime};
use qdarts_search::data::{self, ImageSet};
use qdarts_search::freeze::{InputSpec, freeze};
use qdarts_search::record::{RunDir, write_atomic};
use qdarts_search::search::Progress;
use qdarts_search::train::{TrainConfig, open_trained, resolve_genotype, run_train_in, test_set};

use crate::backend::Backend;
use crate::search_cmd::{progress_bar, show};

/// What `qdarts train` was asked to do.
#[derive(Debug)]
pub struct TrainArgs<'a> {
    /// Config file.
    pub config: &'a Path,
    /// `--set` overrides.
    pub overrides: &'a [String],
    /// `--resume` folder.
    pub resume: Option<&'a Path>,
    /// Backend.
    pub backend: Backend,
}

/// Runs `qdarts train`.
pub fn train(args: &TrainArgs<'_>) -> Result<()> {
    let (cfg, genotype, run) = match args.resume {
        Some(dir) => {
            if !dir.is_dir() {
                bail!("{}: no such run folder", dir.display());
            }
            let cfg = TrainConfig::load(&dir.join("config.toml"), args.overrides)?;
            let g = resolve_genotype(&dir.join("genotype.json").display().to_string())?;
            (cfg, g, RunDir::open(dir)?)
        }
        None => {
            let cfg = TrainConfig::load(args.config, args.overrides)?;
            let g = resolve_genotype(&cfg.genotype).with_context(|| {
                format!("{}: genotype `{}`", args.config.display(), cfg.genotype)
            })?;
            let run = RunDir::create(&cfg.record.results_dir, &cfg.name)?;
            (cfg, g, run)
        }
    };
    let device = args.backend.device()?;
    let dir = run.path().to_path_buf();
    eprintln!("training {} into {}", genotype.to_darts_text(), dir.display());
    let bar = progress_bar();
    let mut on_progress = |p: &Progress| {
        show(&bar, p);
        ControlFlow::Continue(())
    };
    let result =
        run_train_in(&cfg, &genotype, &device, &run, args.resume.is_some(), &mut on_progress);
    bar.finish_and_clear();
    if result.is_err() && args.resume.is_none() && !dir.join("checkpoint").exists() {
        drop(run);
        let _ = std::fs::remove_dir_all(&dir);
    }
    result.with_context(|| format!("training `{}` failed", cfg.name))?;
    let last = std::fs::read_to_string(dir.join("metrics.csv")).unwrap_or_default();
    if let Some(val) = last.lines().rev().find(|l| l.split(',').nth(2) == Some("val")) {
        let f: Vec<&str> = val.split(',').collect();
        eprintln!(
            "last epoch: test loss {}, top-1 {:.2}%",
            f[3],
            100.0 * f[4].parse::<f64>().unwrap_or(0.0)
        );
    }
    println!("{}", dir.display());
    Ok(())
}

fn input_spec(cfg: &TrainConfig, set: &ImageSet) -> InputSpec {
    let (mean, std) = cfg.data.dataset.normalization();
    let c = set.channels;
    let pick = |v: &[f32]| (0..c).map(|i| v[i.min(v.len() - 1)]).collect();
    InputSpec {
        shape: [c, set.height, set.width],
        mean: pick(mean),
        std: pick(std),
        classes: set.classes,
    }
}

fn qdf_path(run: &Path) -> PathBuf {
    run.join("frozen").join("model.qdf")
}

/// Runs `qdarts freeze <run>`: writes `<run>/frozen/model.qdf`.
pub fn freeze_cmd(run: &Path, backend: Backend) -> Result<()> {
    let device = backend.device()?;
    let trained = open_trained(run, &device)?;
    let set = test_set(&trained.cfg)?;
    let model = freeze(&trained.net, &trained.genotype, &input_spec(&trained.cfg, &set), &device)
        .with_context(|| format!("freezing {}", run.display()))?;
    let dir = run.join("frozen");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = qdf_path(run);
    model.save(&path)?;
    let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    println!("{}", path.display());
    eprintln!(
        "{} nodes, {} integer parameter bytes, file {} bytes, {:.3} GBitOPs/image (after {} trained epochs)",
        model.graph.nodes.len(),
        model.param_bytes(),
        size,
        model.bitops()? as f64 / 1e9,
        trained.epochs_done
    );
    Ok(())
}

fn load_frozen(run: &Path) -> Result<FrozenModel> {
    let path = qdf_path(run);
    if !path.exists() {
        bail!("{}: no frozen model; run `qdarts freeze {}` first", path.display(), run.display());
    }
    Ok(FrozenModel::load(&path)?)
}

/// Runs `qdarts export <run>`: writes `<run>/frozen/model.onnx` from `model.qdf`.
pub fn export(run: &Path) -> Result<()> {
    let model = load_frozen(run)?;
    let bytes = qdarts_frozen::onnx::export(&model)?;
    let path = run.join("frozen").join("model.onnx");
    write_atomic(&path, &bytes)?;
    println!("{}", path.display());
    eprintln!(
        "{} bytes, ONNX opset {} (QuantizeLinear/DequantizeLinear around float ops)",
        bytes.len(),
        qdarts_frozen::onnx::OPSET
    );
    Ok(())
}

/// Normalized float images of a set, `[N, C, H, W]` flattened, as the fake-quant model sees them.
fn normalized(set: &ImageSet, model: &FrozenModel) -> Vec<f32> {
    let [c, h, w] = model.graph.input_shape;
    set.images
        .chunks_exact(c * h * w)
        .flat_map(|img| {
            img.iter().enumerate().map(|(i, &p)| {
                let ch = i / (h * w);
                (p as f32 / 255.0 - model.graph.mean[ch]) / model.graph.std[ch]
            })
        })
        .collect()
}

fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, v) in row.iter().enumerate() {
        if *v > row[best] {
            best = i;
        }
    }
    best
}

/// Runs `qdarts eval <run>`: fake-quant vs integer model on the test set.
pub fn eval(run: &Path, backend: Backend, threads: usize) -> Result<()> {
    let device = backend.device()?;
    let trained = open_trained(run, &device)?;
    let model = load_frozen(run)?;
    let set = test_set(&trained.cfg)?;
    let kind = trained.cfg.data.dataset;
    let n = set.len();
    let classes = model.graph.classes;

    // Fake-quant (float) logits.
    let t0 = Instant::now();
    let idx: Vec<usize> = (0..n).collect();
    let mut fq: Vec<f32> = Vec::with_capacity(n * classes);
    for chunk in idx.chunks(100) {
        let (x, _) = data::batch(&set, kind, chunk, None, &device);
        let logits = trained.net.forward(x);
        fq.extend(logits.into_data().convert::<f32>().try_to_vec::<f32>().unwrap_or_default());
    }
    let fq_secs = t0.elapsed().as_secs_f64();

    // Integer logits.
    let rt = Runtime::new(&model)?;
    let images = normalized(&set, &model);
    let t1 = Instant::now();
    let int = rt.run(&images, threads);
    let int_secs = t1.elapsed().as_secs_f64();
    let scale = rt.logit_scale();

    let (mut fq_right, mut int_right, mut agree) = (0usize, 0usize, 0usize);
    let mut max_lsb = 0f64;
    let mut preds = String::from("index,label,fake_quant,integer\n");
    for i in 0..n {
        let f = &fq[i * classes..(i + 1) * classes];
        let q: Vec<f32> = int[i * classes..(i + 1) * classes].iter().map(|&v| v as f32).collect();
        let (pf, pq) = (argmax(f), argmax(&q));
        let label = usize::from(set.labels[i]);
        fq_right += usize::from(pf == label);
        int_right += usize::from(pq == label);
        agree += usize::from(pf == pq);
        preds.push_str(&format!("{i},{label},{pf},{pq}\n"));
        for (a, b) in f.iter().zip(&q) {
            max_lsb = max_lsb.max((f64::from(*a) / f64::from(scale) - f64::from(*b)).abs());
        }
    }
    let pct = |k: usize| 100.0 * k as f64 / n.max(1) as f64;
    let file_bytes = std::fs::metadata(qdf_path(run)).map(|m| m.len()).unwrap_or(0);
    let bitops = model.bitops()?;
    let macs: u64 = model.macs()?.iter().map(|m| m.0).sum();
    println!("eval of {} on {} test images ({})", run.display(), n, backend.name());
    println!(
        "  fake-quant model top-1   {:>8.2} %   ({fq_right}/{n}, {fq_secs:.2} s)",
        pct(fq_right)
    );
    println!(
        "  integer model top-1      {:>8.2} %   ({int_right}/{n}, {int_secs:.2} s, {threads} threads)",
        pct(int_right)
    );
    println!("  top-1 agreement          {:>8.2} %   ({agree}/{n})", pct(agree));
    println!("  max |logit difference|   {max_lsb:>8.3} LSB (logit LSB = {scale:e})");
    println!(
        "  model size               {:>8} bytes (.qdf), {} bytes of integer parameters",
        file_bytes,
        model.param_bytes()
    );
    println!(
        "  compute                  {:>8.4} GBitOPs/image ({} MACs)",
        bitops as f64 / 1e9,
        macs
    );
    let report = serde_json::json!({
        "images": n,
        "fake_quant_top1": fq_right as f64 / n.max(1) as f64,
        "integer_top1": int_right as f64 / n.max(1) as f64,
        "agreement": agree as f64 / n.max(1) as f64,
        "max_logit_diff_lsb": max_lsb,
        "logit_scale": scale,
        "qdf_bytes": file_bytes,
        "param_bytes": model.param_bytes(),
        "bitops": bitops,
        "macs": macs,
    });
    write_atomic(&run.join("eval.json"), format!("{report:#}\n").as_bytes())?;
    write_atomic(&run.join("frozen").join("predictions.csv"), preds.as_bytes())?;
    Ok(())
}
