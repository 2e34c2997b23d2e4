//! `qdarts train`, `freeze`, `export` and `eval`: from a genotype to a checked integer model.

use std::ops::ControlFlow;
use std::path::Path;

use anyhow::{Context, Result, bail};
use qdarts_engine::Progress;
use qdarts_engine::RunKind;
use qdarts_engine::config::Experiment;
use qdarts_frozen::FrozenModel;
use qdarts_record::{MetricsRow, Phase, RunDir, RunLayout, read_table, write_atomic};
use qdarts_train::eval::{evaluate_frozen, input_spec};
use qdarts_train::freeze::freeze;
use qdarts_train::{
    TrainConfig, open_trained, prepare_train, resolve_genotype, run_train_prepared, test_set,
};

use crate::backend::Backend;
use crate::search_cmd::{config_source, progress_bar, resumed_config, show};

/// What `qdarts train` was asked to do.
#[derive(Debug)]
pub struct TrainArgs<'a> {
    /// Config file.
    pub config: &'a Path,
    /// `--set` overrides.
    pub overrides: &'a [String],
    /// `--resume` folder.
    pub resume: Option<&'a Path>,
    /// `--extend-epochs` (0: none).
    pub extend_epochs: usize,
    /// Backend.
    pub backend: Backend,
}

/// Runs `qdarts train`.
pub fn train(args: &TrainArgs<'_>) -> Result<()> {
    // A resumed run continues with the config and genotype it was started with.
    let (cfg, genotype) = match args.resume {
        Some(dir) => {
            let mut cfg = resumed_config(dir, RunKind::Train, |p| TrainConfig::load(p, &[]))?;
            cfg.train.epochs += args.extend_epochs;
            let g = resolve_genotype(&RunLayout::new(dir).genotype_json().display().to_string())?;
            (cfg, g)
        }
        None => {
            let cfg = TrainConfig::load(args.config, args.overrides)?;
            let g = resolve_genotype(&cfg.genotype).with_context(|| {
                format!("{}: genotype `{}`", args.config.display(), cfg.genotype)
            })?;
            (cfg, g)
        }
    };
    let source = config_source(args.config, args.resume);
    let device = args.backend.device()?;
    // The data is read and checked before the run folder exists.
    let prepared = prepare_train(&cfg, &genotype, &device)
        .with_context(|| format!("training `{}` ({}) failed", cfg.name, source.display()))?;
    let run = match args.resume {
        Some(dir) => RunDir::open(dir)?,
        None => RunDir::create(&cfg.record.results_dir, &cfg.name)?,
    };
    let dir = run.root().to_path_buf();
    eprintln!("training {} into {}", genotype.to_darts_text(), dir.display());
    let bar = progress_bar();
    let mut on_progress = |p: &Progress| {
        show(&bar, p);
        ControlFlow::Continue(())
    };
    let resume = args.resume.is_some();
    let result =
        crate::run_loop(&mut on_progress, |p| run_train_prepared(prepared, &run, resume, p));
    bar.finish_and_clear();
    if result.is_err() && args.resume.is_none() && !run.checkpoint().exists() {
        drop(run);
        let _ = std::fs::remove_dir_all(&dir);
    }
    result.with_context(|| format!("training `{}` ({}) failed", cfg.name, source.display()))?;
    let rows: Vec<MetricsRow> = read_table(&RunLayout::new(&dir).table::<MetricsRow>())?;
    if let Some(val) = rows.iter().rev().find(|r| r.phase == Phase::Val) {
        eprintln!("last epoch: test loss {:.6}, top-1 {:.2}%", val.loss, 100.0 * val.top1);
    }
    println!("{}", dir.display());
    Ok(())
}

/// Runs `qdarts freeze <run>`: writes `<run>/frozen/model.qdf`.
pub fn freeze_cmd(run: &Path, backend: Backend) -> Result<()> {
    let device = backend.device()?;
    let trained = open_trained(run, &device)?;
    let set = test_set(&trained.cfg)?;
    let model = freeze(&trained.net, &trained.genotype, &input_spec(&trained.cfg, &set), &device)
        .with_context(|| format!("freezing {}", run.display()))?;
    let layout = RunLayout::new(run);
    let dir = layout.frozen_dir();
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = layout.frozen_model();
    model.save(&path)?;
    let size =
        std::fs::metadata(&path).with_context(|| format!("reading {}", path.display()))?.len();
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

/// The frozen model of a training run, or an error saying how to make it.
pub fn load_frozen(run: &Path) -> Result<FrozenModel> {
    let path = RunLayout::new(run).frozen_model();
    if !path.exists() {
        bail!("{}: no frozen model; run `qdarts freeze {}` first", path.display(), run.display());
    }
    Ok(FrozenModel::load(&path)?)
}

/// Runs `qdarts export <run>`: writes `<run>/frozen/model.onnx` from `model.qdf`.
pub fn export(run: &Path) -> Result<()> {
    let model = load_frozen(run)?;
    let bytes = qdarts_frozen::onnx::export(&model)?;
    let path = RunLayout::new(run).onnx_model();
    write_atomic(&path, &bytes)?;
    println!("{}", path.display());
    eprintln!(
        "{} bytes, ONNX opset {} (QuantizeLinear/DequantizeLinear around float ops)",
        bytes.len(),
        qdarts_frozen::onnx::OPSET
    );
    Ok(())
}

/// Runs `qdarts eval <run>`: fake-quant vs integer model on the test set.
pub fn eval(run: &Path, backend: Backend, threads: usize) -> Result<()> {
    let device = backend.device()?;
    let trained = open_trained(run, &device)?;
    let model = load_frozen(run)?;
    let set = test_set(&trained.cfg)?;
    let layout = RunLayout::new(run);
    let qdf_bytes = std::fs::metadata(layout.frozen_model())
        .with_context(|| format!("reading {}", layout.frozen_model().display()))?
        .len();
    let ev = evaluate_frozen(&trained, &model, &set, threads, qdf_bytes, &device)?;
    let r = &ev.report;
    let n = r.images;
    let count = |frac: f64| (frac * n as f64).round() as usize;
    println!("eval of {} on {} test images ({})", run.display(), n, backend.label());
    println!(
        "  fake-quant model top-1   {:>8.2} %   ({}/{n}, {:.2} s)",
        100.0 * r.fake_quant_top1,
        count(r.fake_quant_top1),
        ev.fake_quant_seconds
    );
    println!(
        "  integer model top-1      {:>8.2} %   ({}/{n}, {:.2} s, {threads} threads)",
        100.0 * r.integer_top1,
        count(r.integer_top1),
        ev.integer_seconds
    );
    println!(
        "  top-1 agreement          {:>8.2} %   ({}/{n})",
        100.0 * r.agreement,
        count(r.agreement)
    );
    println!(
        "  max |logit difference|   {:>8.3} LSB (logit LSB = {:e})",
        r.max_logit_diff_lsb, r.logit_scale as f32
    );
    println!(
        "  model size               {:>8} bytes (.qdf), {} bytes of integer parameters",
        r.qdf_bytes, r.param_bytes
    );
    println!("  weights at their widths  {:>8} bytes (packed, biases not counted)", r.weight_bytes);
    println!(
        "  compute                  {:>8.4} GBitOPs/image ({} MACs)",
        r.bitops as f64 / 1e9,
        r.macs
    );
    let json = serde_json::to_string_pretty(r).context("encoding eval.json")?;
    write_atomic(&layout.eval_report(), format!("{json}\n").as_bytes())?;
    write_atomic(&layout.predictions(), ev.predictions_csv().as_bytes())?;
    Ok(())
}
