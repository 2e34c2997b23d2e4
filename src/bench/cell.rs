//! `qdarts bench cell`: one float search cell's forward and backward, edge by edge
//! (`SearchCell`) against in waves (`BatchedCell`), in interleaved rounds: the kernels each
//! launches and its seconds.

use std::path::Path;
use std::time::Instant;

use anyhow::Result;
use burn::tensor::activation::softmax;
use burn::tensor::{Device, Distribution, Tensor};
use qdarts_genotypes::Primitive;
use qdarts_kernels::launches::counted_by_kernel;
use qdarts_ops::candidates::{Pass, QTensor};
use qdarts_ops::qconfig::QuantConfig;
use qdarts_search::supernet::{BatchedCell, CellShape, SearchCell};

use super::timing::{Timing, settle, write_csv};
use crate::backend::Backend;

/// One cell's two forms, measured.
#[derive(Debug, Clone)]
pub struct CellRow {
    /// `normal` or `reduction`.
    pub cell: &'static str,
    /// Kernel launches of one forward+backward, edge by edge and in waves (CubeCL runtimes).
    pub launches: [Option<u64>; 2],
    /// The same launches by kernel, most launched first.
    pub kernels: [Option<Vec<(&'static str, u64)>>; 2],
    /// Seconds of one forward+backward, edge by edge and in waves.
    pub seconds: [Timing; 2],
    /// The per-round ratio waves / edges.
    pub ratio: Timing,
}

/// One forward and backward of `f`'s output, finished.
fn step(f: &dyn Fn(QTensor, QTensor) -> Tensor<4>, s0: &Tensor<4>, s1: &Tensor<4>) {
    let x = s1.clone().require_grad();
    let out = f(QTensor::float(s0.clone()), QTensor::float(x.clone()));
    let grads = out.sum().backward();
    settle(x.grad(&grads).expect("the cell's input has a gradient"));
}

/// Both forms of a DARTS cell (4 nodes, the 8 DARTS candidates) on `[batch, c, size, size]`
/// inputs, normal and reduction, each measured in `rounds` interleaved rounds after a warm-up.
pub fn cell_rows(
    [batch, c, size]: [usize; 3],
    cfg: &QuantConfig,
    rounds: usize,
    device: &Device,
) -> Result<Vec<CellRow>> {
    let d = device.clone().autodiff();
    let mut rows = Vec::new();
    for reduction in [false, true] {
        let shape = CellShape {
            c_pp: c,
            c_p: c,
            c,
            reduction,
            reduction_prev: false,
            nodes: 4,
            partial: 1,
        };
        let prims = Primitive::DARTS;
        let (cell, s0, s1, weights) = qdarts_ops::seeded(&d, 1, || -> Result<_> {
            let cell = SearchCell::new(shape, &prims, cfg, "cells.0", &d)?;
            let normal = Distribution::Normal(0.0, 1.0);
            let x = || Tensor::<4>::random([batch, c, size, size], normal, &d);
            let weights: Vec<Tensor<1>> = (0..14)
                .map(|_| softmax(Tensor::<1>::random([prims.len()], normal, &d), 0))
                .collect();
            Ok((cell, x(), x(), weights))
        })?;
        let batched = BatchedCell::from_cell(&cell, &prims)?;
        // The network gives the waves its `[edges, K]` weights whole, as here: stacked once.
        let stacked = Tensor::stack::<2>(weights.clone(), 0);
        let edges =
            |a: QTensor, b: QTensor| cell.forward(a, b, &weights, None, 0.0, Pass::default()).value;
        let waves = |a: QTensor, b: QTensor| {
            let (a, b) = (cell.preproc0.forward(a), cell.preproc1.forward(b));
            batched.forward((a, b), stacked.clone(), None, 0.0, &cell, Pass::default()).value
        };
        let forms: [&dyn Fn(QTensor, QTensor) -> Tensor<4>; 2] = [&edges, &waves];
        for f in forms {
            step(f, &s0, &s1); // warm-up: kernels compiled, pools grown
        }
        let kernels = forms.map(|f| counted_by_kernel(device, || step(f, &s0, &s1)).1);
        let launches =
            kernels.each_ref().map(|k| k.as_ref().map(|k| k.iter().map(|(_, n)| n).sum()));
        let mut seconds = [Vec::new(), Vec::new()];
        let mut ratios = Vec::new();
        for _ in 0..rounds {
            for (i, f) in forms.iter().enumerate() {
                let start = Instant::now();
                step(*f, &s0, &s1);
                seconds[i].push(start.elapsed().as_secs_f64());
            }
            let n = seconds[0].len() - 1;
            ratios.push(seconds[1][n] / seconds[0][n]);
        }
        rows.push(CellRow {
            cell: if reduction { "reduction" } else { "normal" },
            launches,
            kernels,
            seconds: seconds.map(Timing::of),
            ratio: Timing::of(ratios),
        });
    }
    Ok(rows)
}

fn launches(n: Option<u64>) -> String {
    n.map_or_else(|| "-".into(), |n| n.to_string())
}

/// The table.
pub fn render(rows: &[CellRow]) -> String {
    let mut out = format!(
        "{:<10} {:>14} {:>14} {:>24} {:>24} {:>22}\n",
        "cell",
        "launches edges",
        "launches waves",
        "s edges (min..max)",
        "s waves (min..max)",
        "waves/edges (min..max)"
    );
    let t = |t: &Timing| format!("{:.4} ({:.4}..{:.4})", t.median, t.min, t.max);
    for r in rows {
        out.push_str(&format!(
            "{:<10} {:>14} {:>14} {:>24} {:>24} {:>22}\n",
            r.cell,
            launches(r.launches[0]),
            launches(r.launches[1]),
            t(&r.seconds[0]),
            t(&r.seconds[1]),
            format!("{:.3} ({:.3}..{:.3})", r.ratio.median, r.ratio.min, r.ratio.max),
        ));
    }
    out
}

/// Each form's `top` most launched kernels, per cell: launches and the kernel's name without
/// its crate path and generic arguments (kernels of one name summed).
pub fn render_kernels(rows: &[CellRow], top: usize) -> String {
    let mut out = String::new();
    for r in rows {
        for (form, kernels) in ["edges", "waves"].iter().zip(&r.kernels) {
            let Some(kernels) = kernels else { continue };
            out.push_str(&format!("{} cell, {form}: the {top} most launched kernels\n", r.cell));
            // Kernels that differ only in their generic arguments under one name.
            let mut named: Vec<(String, u64)> = Vec::new();
            for (name, n) in kernels {
                let short = short_name(name);
                match named.iter_mut().find(|(s, _)| *s == short) {
                    Some((_, total)) => *total += n,
                    None => named.push((short, *n)),
                }
            }
            named.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            for (name, n) in named.iter().take(top) {
                out.push_str(&format!("{n:>8}  {name}\n"));
            }
        }
    }
    out
}

/// `a::b::kernel<T, U>` as `b::kernel`.
fn short_name(name: &str) -> String {
    let bare = name.split('<').next().unwrap_or(name);
    let parts: Vec<&str> = bare.rsplitn(3, "::").collect();
    parts.iter().take(2).rev().copied().collect::<Vec<_>>().join("::")
}

/// The table as CSV.
pub fn write_cell_csv(
    path: &Path,
    backend: Backend,
    shape: [usize; 3],
    rows: &[CellRow],
) -> Result<()> {
    /// One row of `bench cell --csv`.
    #[derive(serde::Serialize)]
    struct Row<'a> {
        backend: String,
        batch: usize,
        channels: usize,
        size: usize,
        cell: &'a str,
        launches_edges: Option<u64>,
        launches_waves: Option<u64>,
        edges_median_s: f64,
        edges_min_s: f64,
        edges_max_s: f64,
        waves_median_s: f64,
        waves_min_s: f64,
        waves_max_s: f64,
        ratio_median: f64,
        ratio_min: f64,
        ratio_max: f64,
    }
    let [batch, channels, size] = shape;
    let lines = rows.iter().map(|r| {
        let [e, w] = &r.seconds;
        Row {
            backend: backend.label(),
            batch,
            channels,
            size,
            cell: r.cell,
            launches_edges: r.launches[0],
            launches_waves: r.launches[1],
            edges_median_s: e.median,
            edges_min_s: e.min,
            edges_max_s: e.max,
            waves_median_s: w.median,
            waves_min_s: w.min,
            waves_max_s: w.max,
            ratio_median: r.ratio.median,
            ratio_min: r.ratio.min,
            ratio_max: r.ratio.max,
        }
    });
    write_csv(path, lines)
}
