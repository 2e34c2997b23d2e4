//! The mix's kernels for the CubeCL backends: one thread per `(n, l)` forward and for the
//! blocks' gradients (every row at once, the number of rows compiled in), one cube per column
//! for the coefficients'.

use burn_cubecl::CubeBackend;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::MixBackend;
use crate::cat::taken;
use crate::support::cube::{
    elementwise, empty_shaped, f32_contiguous, f32_strided, packed, reduce_units,
};

/// `out[n, r, l] = Σ_c coefficients[r, c] · x[n, c, l]`: a thread per `(n, l)`, which reads
/// each column's value once (through the block's strides) and adds it into every row's sum,
/// column after column.
#[cube(launch)]
fn mix_kernel(
    coefficients: &Tensor<f32>,
    blocks: &Sequence<OwnedTensor<f32>>,
    out: &mut [f32],
    batch: usize,
    columns: usize,
    inner: usize,
    #[comptime] rows: usize,
) {
    let i = ABSOLUTE_POS;
    if i < batch * inner {
        let (n, l) = (i / inner, i % inner);
        let mut sums = Array::<f32>::new(rows);
        let mut first = 0usize;
        #[unroll]
        for p in 0..comptime!(blocks.len()) {
            let block = &blocks[p];
            let step = block.stride(1);
            let mut at = n * block.stride(0) + l * block.stride(2);
            for c in 0..block.shape(1) {
                let x = block[at];
                #[unroll]
                for r in 0..rows {
                    sums[r] += coefficients[r * columns + first + c] * x;
                }
                at += step;
            }
            first += block.shape(1);
        }
        #[unroll]
        for r in 0..rows {
            out[(n * rows + r) * inner + l] = sums[r];
        }
    }
}

/// Each block's gradient, block `p` (columns `first[p]..first[p + 1]`) from element
/// `starts[p]` of `out` as `[N, len, L]`: `Σ_r coefficients[r, c] · grad[n, r, l]`, a thread
/// per `(n, l)` reading its rows of `grad` once. The gaps between the blocks are not written.
#[cube(launch)]
fn mix_block_grad_kernel(
    coefficients: &Tensor<f32>,
    grad: &Tensor<f32>,
    out: &mut [f32],
    starts: Sequence<usize>,
    first: Sequence<usize>,
    batch: usize,
    columns: usize,
    inner: usize,
    #[comptime] rows: usize,
) {
    let i = ABSOLUTE_POS;
    if i < batch * inner {
        let (n, l) = (i / inner, i % inner);
        let mut g = Array::<f32>::new(rows);
        #[unroll]
        for r in 0..rows {
            g[r] = grad[(n * rows + r) * inner + l];
        }
        #[unroll]
        for p in 0..comptime!(first.len() - 1) {
            let (c0, len) = (first[p], first[p + 1] - first[p]);
            let mut at = starts[p] + n * len * inner + l;
            for c in 0..len {
                let mut sum = 0.0f32;
                #[unroll]
                for r in 0..rows {
                    sum += coefficients[r * columns + c0 + c] * g[r];
                }
                out[at] = sum;
                at += inner;
            }
        }
    }
}

/// `out[r, c] = Σ_{n, l} grad[n, r, l] · x[n, c, l]`: a cube per column `c`, each unit every
/// `units`-th `(n, l)` for every row at once, then one tree over the cube for all the rows.
#[cube(launch)]
fn mix_coefficient_grad_kernel(
    grad: &Tensor<f32>,
    blocks: &Sequence<OwnedTensor<f32>>,
    out: &mut [f32],
    batch: usize,
    columns: usize,
    inner: usize,
    #[comptime] rows: usize,
    #[comptime] units: usize,
) {
    let mut shared = Shared::<[f32]>::new_slice(rows * units);
    let (c, unit) = (CUBE_POS_X as usize, UNIT_POS_X as usize);
    let count = batch * inner;
    let mut sums = Array::<f32>::new(rows);
    let mut first = 0usize;
    #[unroll]
    for p in 0..comptime!(blocks.len()) {
        let block = &blocks[p];
        let len = block.shape(1);
        // Uniform over the cube: every unit takes the same block.
        if c >= first && c < first + len {
            let (s0, s2) = (block.stride(0), block.stride(2));
            let base = (c - first) * block.stride(1);
            let mut j = unit;
            while j < count {
                let (n, l) = (j / inner, j % inner);
                let x = block[base + n * s0 + l * s2];
                #[unroll]
                for r in 0..rows {
                    sums[r] += grad[(n * rows + r) * inner + l] * x;
                }
                j += units;
            }
        }
        first += len;
    }
    #[unroll]
    for r in 0..rows {
        shared[r * units + unit] = sums[r];
    }
    sync_cube();
    // Halved at run time: a comptime `units / 2` would fold into a constant the loop cannot
    // change.
    let mut active = CUBE_DIM_X as usize / 2;
    while active > 0 {
        if unit < active {
            #[unroll]
            for r in 0..rows {
                let other = shared[r * units + unit + active];
                shared[r * units + unit] += other;
            }
        }
        sync_cube();
        active /= 2;
    }
    if unit == 0 {
        #[unroll]
        for r in 0..rows {
            out[r * columns + c] = shared[r * units];
        }
    }
}

/// The panics' name for these kernels.
const OP: &str = "mix";

/// `[N, c, L]` of a rank-3 tensor (`what` names it in the panic).
fn dims3(t: &CubeTensor, what: &str) -> [usize; 3] {
    match t.meta.shape()[..] {
        [n, c, l] => [n, c, l],
        ref other => panic!("{OP}: {what} {other:?} is not [N, C, L]"),
    }
}

/// The blocks as the kernels' sequence (each read through its three strides).
fn block_args(blocks: Vec<CubeTensor>) -> SequenceArg<OwnedTensor<f32>> {
    let mut args = SequenceArg::<OwnedTensor<f32>>::new();
    for b in blocks {
        args.push(f32_strided(b, OP).into_tensor_arg());
    }
    args
}

impl MixBackend for CubeBackend {
    fn mix_blocks(
        coefficients: CubeTensor,
        p0: CubeTensor,
        p1: CubeTensor,
        p2: CubeTensor,
        p3: CubeTensor,
        p4: CubeTensor,
        p5: CubeTensor,
        p6: CubeTensor,
        p7: CubeTensor,
        count: usize,
    ) -> CubeTensor {
        let blocks = taken([p0, p1, p2, p3, p4, p5, p6, p7], count);
        let coefficients = f32_contiguous(coefficients, OP);
        let [_, rows, columns] = dims3(&coefficients, "coefficients");
        let [n, _, inner] = dims3(&blocks[0], "block");
        let out = empty_shaped(&blocks[0], vec![n, rows, inner]);
        let client = out.client.clone();
        let (cubes, dim) = elementwise(&client, n * inner);
        mix_kernel::launch(
            &client,
            cubes,
            dim,
            coefficients.into_tensor_arg(),
            block_args(blocks),
            out.clone().into_buffer_arg(),
            n,
            columns,
            inner,
            rows,
        );
        out
    }

    fn mix_block_grads(
        coefficients: CubeTensor,
        grad: CubeTensor,
        columns: Vec<usize>,
    ) -> Vec<CubeTensor> {
        let (coefficients, grad) = (f32_contiguous(coefficients, OP), f32_contiguous(grad, OP));
        let [_, rows, all] = dims3(&coefficients, "coefficients");
        let [n, _, inner] = dims3(&grad, "∂out");
        assert_eq!(columns.iter().sum::<usize>(), all, "{OP}: blocks of {columns:?} columns");
        let out = packed(&grad, columns.iter().map(|&c| vec![n, c, inner]).collect());
        let (mut starts, mut first) = (SequenceArg::<usize>::new(), SequenceArg::<usize>::new());
        let mut at = 0;
        for (&start, &c) in out.starts.iter().zip(&columns) {
            starts.push(start);
            first.push(at);
            at += c;
        }
        first.push(at);
        let client = grad.client.clone();
        let (cubes, dim) = elementwise(&client, n * inner);
        mix_block_grad_kernel::launch(
            &client,
            cubes,
            dim,
            coefficients.into_tensor_arg(),
            grad.into_tensor_arg(),
            out.flat.clone().into_buffer_arg(),
            starts,
            first,
            n,
            all,
            inner,
            rows,
        );
        out.parts()
    }

    fn mix_coefficient_grad(
        grad: CubeTensor,
        p0: CubeTensor,
        p1: CubeTensor,
        p2: CubeTensor,
        p3: CubeTensor,
        p4: CubeTensor,
        p5: CubeTensor,
        p6: CubeTensor,
        p7: CubeTensor,
        count: usize,
    ) -> CubeTensor {
        let blocks = taken([p0, p1, p2, p3, p4, p5, p6, p7], count);
        let grad = f32_contiguous(grad, OP);
        let [n, rows, inner] = dims3(&grad, "∂out");
        let columns: usize = blocks.iter().map(|b| dims3(b, "block")[1]).sum();
        let out = empty_shaped(&grad, vec![1, rows, columns]);
        let units = reduce_units(n * inner);
        mix_coefficient_grad_kernel::launch(
            &grad.client,
            CubeCount::new_1d(columns as u32),
            CubeDim::new_1d(units),
            grad.clone().into_tensor_arg(),
            block_args(blocks),
            out.clone().into_buffer_arg(),
            n,
            columns,
            inner,
            rows,
            units as usize,
        );
        out
    }
}
