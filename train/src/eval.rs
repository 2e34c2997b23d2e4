//! `qdarts eval` as a library function: the fake-quant network and the frozen integer model
//! on the same test images, their top-1, how often they agree, the largest logit difference
//! in integer steps, and the model's size and compute.

use std::time::Instant;

use burn::tensor::Device;
use qdarts_data::{self as data, ImageSet};
use qdarts_engine::{RunError, read_f32};
use qdarts_frozen::{FrozenModel, Runtime};
use serde::Serialize;

use crate::config::TrainConfig;
use crate::freeze::InputSpec;
use crate::run::TrainedRun;

/// The input a frozen model of a training config expects: the test images' shape and the
/// dataset's normalization, one value per channel.
pub fn input_spec(cfg: &TrainConfig, set: &ImageSet) -> InputSpec {
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

/// Checks that a frozen model takes the images of `set` (its input shape is theirs); `what`
/// names the model in the error.
pub fn check_input(model: &FrozenModel, set: &ImageSet, what: &str) -> Result<(), RunError> {
    let want = model.graph.input_shape;
    let got = [set.channels, set.height, set.width];
    if want != got {
        return Err(RunError::Config(qdarts_engine::ConfigError::invalid(
            std::path::Path::new(what),
            "input shape",
            format!(
                "is {}×{}×{}, but the run's test images are {}×{}×{} (a model frozen from \
                 another run?)",
                want[0], want[1], want[2], got[0], got[1], got[2]
            ),
        )));
    }
    Ok(())
}

/// Normalized float images of a set, `[N, C, H, W]` flattened, as the fake-quant model sees
/// them (the integer runtime's input).
pub fn normalized(set: &ImageSet, model: &FrozenModel) -> Vec<f32> {
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

/// What `qdarts eval` reports (`eval.json`; fields in name order, as it has always been
/// written).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EvalReport {
    /// Fraction of images where both models predict the same class.
    pub agreement: f64,
    /// Bit operations per image of the integer model.
    pub bitops: u64,
    /// Top-1 of the fake-quant network.
    pub fake_quant_top1: f64,
    /// Test images.
    pub images: usize,
    /// Top-1 of the integer model.
    pub integer_top1: f64,
    /// The real value of one integer logit step.
    pub logit_scale: f64,
    /// Multiply-accumulates per image.
    pub macs: u64,
    /// Largest |fake-quant logit / logit_scale − integer logit| over all images and classes.
    pub max_logit_diff_lsb: f64,
    /// Bytes of integer parameters as stored (one byte per weight).
    pub param_bytes: u64,
    /// Size of the `.qdf` file.
    pub qdf_bytes: u64,
    /// Bytes of the weights packed at their widths (biases not counted).
    pub weight_bytes: u64,
}

/// One image's label and the two models' predictions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prediction {
    /// True class.
    pub label: usize,
    /// Fake-quant network's class.
    pub fake_quant: usize,
    /// Integer model's class.
    pub integer: usize,
}

/// An evaluation: the report, per-image predictions and the time each model took.
#[derive(Debug, Clone)]
pub struct Evaluated {
    /// The report.
    pub report: EvalReport,
    /// Per image.
    pub predictions: Vec<Prediction>,
    /// Seconds of the fake-quant pass.
    pub fake_quant_seconds: f64,
    /// Seconds of the integer pass.
    pub integer_seconds: f64,
}

impl Evaluated {
    /// The predictions as CSV (`index,label,fake_quant,integer`).
    pub fn predictions_csv(&self) -> String {
        let mut out = String::from("index,label,fake_quant,integer\n");
        for (i, p) in self.predictions.iter().enumerate() {
            out.push_str(&format!("{i},{},{},{}\n", p.label, p.fake_quant, p.integer));
        }
        out
    }
}

/// Runs the fake-quant network of `trained` and the integer model `model` on `set` (the
/// integer runtime on `threads` threads) and compares them. `qdf_bytes` is the model file's
/// size, for the report.
pub fn evaluate_frozen(
    trained: &TrainedRun,
    model: &FrozenModel,
    set: &ImageSet,
    threads: usize,
    qdf_bytes: u64,
    device: &Device,
) -> Result<Evaluated, RunError> {
    let frozen_err = |e: qdarts_frozen::ModelError| RunError::ReadBack {
        what: "the frozen model".into(),
        message: e.to_string(),
    };
    check_input(model, set, "frozen/model.qdf")?;
    let kind = trained.cfg.data.dataset;
    let n = set.len();
    let classes = model.graph.classes;

    let t0 = Instant::now();
    let idx: Vec<usize> = (0..n).collect();
    let mut fq: Vec<f32> = Vec::with_capacity(n * classes);
    for chunk in idx.chunks(100) {
        let (x, _) = data::batch(set, kind, chunk, None, device);
        fq.extend(read_f32(trained.net.forward(x), "fake-quant logits")?);
    }
    let fake_quant_seconds = t0.elapsed().as_secs_f64();

    let rt = Runtime::new(model).map_err(frozen_err)?;
    let images = normalized(set, model);
    let t1 = Instant::now();
    let int = rt.run(&images, threads);
    let integer_seconds = t1.elapsed().as_secs_f64();
    let scale = rt.logit_scale();

    let (mut fq_right, mut int_right, mut agree) = (0usize, 0usize, 0usize);
    let mut max_lsb = 0f64;
    let mut predictions = Vec::with_capacity(n);
    for i in 0..n {
        let f = &fq[i * classes..(i + 1) * classes];
        let q: Vec<f32> = int[i * classes..(i + 1) * classes].iter().map(|&v| v as f32).collect();
        let (pf, pq) = (argmax(f), argmax(&q));
        let label = usize::from(set.labels[i]);
        fq_right += usize::from(pf == label);
        int_right += usize::from(pq == label);
        agree += usize::from(pf == pq);
        predictions.push(Prediction { label, fake_quant: pf, integer: pq });
        for (a, b) in f.iter().zip(&q) {
            max_lsb = max_lsb.max((f64::from(*a) / f64::from(scale) - f64::from(*b)).abs());
        }
    }
    let frac = |k: usize| k as f64 / n.max(1) as f64;
    let report = EvalReport {
        agreement: frac(agree),
        bitops: model.bitops().map_err(frozen_err)?,
        fake_quant_top1: frac(fq_right),
        images: n,
        integer_top1: frac(int_right),
        logit_scale: f64::from(scale),
        macs: model.macs().map_err(frozen_err)?.iter().map(|m| m.0).sum(),
        max_logit_diff_lsb: max_lsb,
        param_bytes: model.param_bytes(),
        qdf_bytes,
        weight_bytes: model.weight_bytes(),
    };
    Ok(Evaluated { report, predictions, fake_quant_seconds, integer_seconds })
}
