//! `qdarts bench ops`: forward+backward time of each candidate op at both strides, float
//! against fake-quant.

use std::path::Path;

use anyhow::Result;
use burn::tensor::{Device, Distribution, Tensor};
use qdarts_genotypes::Primitive;
use qdarts_ops::candidates::{CandidateOp, QTensor};
use qdarts_ops::qconfig::{Preset, QuantConfig};

use super::timing::{Timing, settle, time_reps, write_csv};
use crate::backend::Backend;

/// Float and fake-quant timings of one op.
#[derive(Debug, Clone)]
pub struct OpRow {
    pub op: String,
    pub stride: usize,
    pub float: Timing,
    pub quant: Timing,
}

fn time_op(op: &CandidateOp, x: &Tensor<4>, reps: usize) -> Result<Timing> {
    time_reps(reps, || {
        let xg = x.clone().require_grad();
        let out = op.forward(QTensor::float(xg.clone())).value;
        if out.is_tracked() {
            let grads = out.sum().backward();
            if let Some(g) = xg.grad(&grads) {
                settle(g);
            }
        } else {
            settle(out);
        }
        Ok(())
    })
}

pub fn op_rows(
    shape: [usize; 4],
    preset: Preset,
    reps: usize,
    device: &Device,
) -> Result<Vec<OpRow>> {
    let ad = device.clone().autodiff();
    let x = Tensor::<4>::random(shape, Distribution::Normal(0.0, 1.0), &ad);
    let float = QuantConfig::float();
    let quant = QuantConfig::preset(preset);
    let mut rows = Vec::new();
    for stride in [1, 2] {
        for p in Primitive::DARTS {
            let path = format!("bench.{p}");
            let f = CandidateOp::new(p, shape[1], stride, false, &float, &path, &ad)?;
            let q = CandidateOp::new(p, shape[1], stride, false, &quant, &path, &ad)?;
            rows.push(OpRow {
                op: p.name().to_string(),
                stride,
                float: time_op(&f, &x, reps)?,
                quant: time_op(&q, &x, reps)?,
            });
        }
    }
    Ok(rows)
}

pub fn render_ops(rows: &[OpRow]) -> String {
    let mut out = format!(
        "{:<14} {:>6} {:>10} {:>17} {:>12} {:>17} {:>7}\n",
        "op", "stride", "float", "min..max", "fake-quant", "min..max", "ratio"
    );
    for r in rows {
        out.push_str(&format!(
            "{:<14} {:>6} {:>10.2} {:>17} {:>12.2} {:>17} {:>7.2}\n",
            r.op,
            r.stride,
            r.float.median * 1e3,
            format!("{:.2}..{:.2}", r.float.min * 1e3, r.float.max * 1e3),
            r.quant.median * 1e3,
            format!("{:.2}..{:.2}", r.quant.min * 1e3, r.quant.max * 1e3),
            r.quant.median / r.float.median
        ));
    }
    out
}

pub fn write_ops_csv(
    path: &Path,
    backend: Backend,
    shape: [usize; 4],
    rows: &[OpRow],
) -> Result<()> {
    /// One row of `bench ops --csv`.
    #[derive(serde::Serialize)]
    struct Row<'a> {
        backend: String,
        shape: &'a str,
        op: &'a str,
        stride: usize,
        float_median_s: f64,
        float_min_s: f64,
        float_max_s: f64,
        quant_median_s: f64,
        quant_min_s: f64,
        quant_max_s: f64,
    }
    let shape = format!("{}x{}x{}x{}", shape[0], shape[1], shape[2], shape[3]);
    let lines = rows.iter().map(|r| Row {
        backend: backend.label(),
        shape: &shape,
        op: &r.op,
        stride: r.stride,
        float_median_s: r.float.median,
        float_min_s: r.float.min,
        float_max_s: r.float.max,
        quant_median_s: r.quant.median,
        quant_min_s: r.quant.min,
        quant_max_s: r.quant.max,
    });
    write_csv(path, lines)
}
