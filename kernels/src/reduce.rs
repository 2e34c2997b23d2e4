//! Row reductions of `[R, L]` tensors (max, min, mean) that keep a GPU busy.
//!
//! Burn's CubeCL backends, built without CubeCL's autotune as qdarts builds them, reduce each
//! output value with one thread. A row of an observer or a BatchNorm is long and there are few
//! of them, so one thread reads a whole activation (measured: `docs/results/2026-11-25-gpu-h100.md`).
//!
//! On those backends a long row is viewed as `[R, k, m]` (`k·m` its longest prefix, `k ≈ √L`)
//! and reduced over `k` first, by `R·m` threads of which neighbours read neighbouring values,
//! then over `m`; the tail past `k·m` is reduced on its own and combined. Max and min are
//! exact in any order, so their results are the same bits; a mean adds in another order,
//! which changes last bits only where the order was not PyTorch's to begin with. Flex and
//! LibTorch keep the one-pass reduction.

use burn::tensor::Tensor;

use crate::support::on_cube;

/// Rows shorter than this are reduced in one pass everywhere.
const SPLIT_FROM: usize = 4096;

#[derive(Clone, Copy, Debug)]
enum Op {
    Max,
    Min,
    Mean,
    Sum,
}

/// Per-row maximum of `[R, L]`: `[R]`.
pub fn row_max(rows: Tensor<2>) -> Tensor<1> {
    reduce(rows, Op::Max)
}

/// Per-row minimum of `[R, L]`: `[R]`.
pub fn row_min(rows: Tensor<2>) -> Tensor<1> {
    reduce(rows, Op::Min)
}

/// Per-row mean of `[R, L]`: `[R]`.
pub fn row_mean(rows: Tensor<2>) -> Tensor<1> {
    reduce(rows, Op::Mean)
}

/// The sum of every value of `x`, `[1]`: Burn's `sum` on flex and LibTorch (the same bits as
/// before), the split reduction of one row on the CubeCL backends, where Burn's gives the whole
/// tensor to one thread (a quantizer's error statistics sum whole activations).
pub fn sum_all<const D: usize>(x: Tensor<D>) -> Tensor<1> {
    if !on_cube(&x.device()) {
        return x.sum();
    }
    let n = x.dims().iter().product();
    reduce(x.reshape([1, n]), Op::Sum)
}

fn reduce(rows: Tensor<2>, op: Op) -> Tensor<1> {
    let [r, l] = rows.dims();
    if l < SPLIT_FROM || !on_cube(&rows.device()) {
        let one = match op {
            Op::Max => rows.max_dim(1),
            Op::Min => rows.min_dim(1),
            Op::Mean => rows.mean_dim(1),
            Op::Sum => rows.sum_dim(1),
        };
        return one.reshape([r]);
    }
    let k = (l as f64).sqrt() as usize;
    let m = l / k;
    let head = rows.clone().slice([0..r, 0..k * m]).reshape([r, k, m]);
    let head = along::<3>(head, 1, op).reshape([r, m]);
    let mut out = along::<2>(head, 1, op).reshape([r]);
    if k * m < l {
        let tail = along::<2>(rows.slice([0..r, k * m..l]), 1, op).reshape([r]);
        out = match op {
            Op::Max => out.max_pair(tail),
            Op::Min => out.min_pair(tail),
            Op::Mean | Op::Sum => out.add(tail),
        };
    }
    match op {
        Op::Mean => out.div_scalar(l as f32),
        _ => out,
    }
}

/// One stage of the split reduction; a mean's stages sum, and [`reduce`] divides once.
fn along<const D: usize>(x: Tensor<D>, dim: usize, op: Op) -> Tensor<D> {
    match op {
        Op::Max => x.max_dim(dim),
        Op::Min => x.min_dim(dim),
        Op::Mean | Op::Sum => x.sum_dim(dim),
    }
}
