//! The per-channel primitives on the CubeCL backends (`wgpu`, `cuda`).
//!
//! As tensor expressions a training BatchNorm is dozens of launches forward and backward
//! (transposes, centring, broadcasts and their gradients, each a kernel); on a GPU every launch
//! costs host time, and Burn's reductions without autotune give each output one
//! thread, which for `C` channels of `N·H·W` values is `C` threads. Here the elementwise parts
//! are one kernel each (one thread per element), and the per-channel sums are CubeCL's cube
//! reduction (one cube of threads per channel, a tree in shared memory) over rows laid out
//! `[channel, N·H·W]` by one kernel.

use burn::tensor::DType;
use burn_cubecl::CubeBackend;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::kernel::reduce::{KernelReduceStrategy, reduce_dim};
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;
use cubek::reduce::ReduceStrategy;
use cubek::reduce::components::instructions::ReduceOperationConfig;
use cubek::reduce::launch::{RoutineStrategy, VectorizationStrategy};
use cubek::reduce::routines::{BlueprintStrategy, cube::CubeStrategy};

use super::ChannelBackend;
use crate::lanes::cube::{elementwise, empty_like, empty_shaped};

/// The channel of element `i` of `[N, C, H, W]` with `plane = H·W`. In 32 bits: a 64-bit
/// integer division is emulated on GPUs.
#[cube]
fn channel_of(i: usize, plane: u32, channels: u32) -> usize {
    ((i as u32 / plane) % channels) as usize
}

/// `out = x·w_c (+ b_c)`.
#[cube(launch)]
fn scale_shift_kernel(
    x: &[f32],
    w: &[f32],
    b: &[f32],
    out: &mut [f32],
    plane: u32,
    channels: u32,
    #[comptime] shift: bool,
) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        let c = channel_of(i, plane, channels);
        let v = x[i] * w[c];
        if shift {
            out[i] = v + b[c];
        } else {
            out[i] = v;
        }
    }
}

/// `∂x = a_c + b_c·(x − μ_c)` with `a = ∂μ/M`, `b = 2∂σ²/M` (the flex kernel's order).
#[cube(launch)]
fn moments_backward_kernel(
    x: &[f32],
    moments: &[f32],
    grad: &[f32],
    out: &mut [f32],
    plane: u32,
    channels: u32,
    count: f32,
) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        let c = channel_of(i, plane, channels);
        let a = grad[c] / count;
        let b = 2.0 * grad[channels as usize + c] / count;
        out[i] = a + b * (x[i] - moments[c]);
    }
}

/// `[N, C, H, W]` as rows `[C, N·H·W]`; with `centre`, `(x − μ_c)²` instead of `x`.
#[cube(launch)]
fn rows_kernel(
    x: &[f32],
    mean: &[f32],
    out: &mut [f32],
    plane: u32,
    channels: u32,
    #[comptime] centre: bool,
) {
    let i = ABSOLUTE_POS;
    if i < x.len() {
        let (p, c) = (plane as usize, channels as usize);
        let ch = channel_of(i, plane, channels);
        let n = i / (c * p);
        let row = (x.len() / c) * ch;
        let v = x[i];
        let at = row + n * p + i % p;
        if centre {
            let d = v - mean[ch];
            out[at] = d * d;
        } else {
            out[at] = v;
        }
    }
}

/// Rows `[2C, N·H·W]` of `∂y·x` (first `C`) and `∂y` (last `C`).
#[cube(launch)]
fn wb_rows_kernel(x: &[f32], grad: &[f32], out: &mut [f32], plane: u32, channels: u32) {
    let i = ABSOLUTE_POS;
    if i < x.len() {
        let (p, c) = (plane as usize, channels as usize);
        let ch = channel_of(i, plane, channels);
        let n = i / (c * p);
        let len = x.len() / c;
        let at = len * ch + n * p + i % p;
        let g = grad[i];
        out[at] = g * x[i];
        out[len * c + at] = g;
    }
}

fn f32_contiguous(t: CubeTensor) -> CubeTensor {
    assert_eq!(t.dtype, DType::F32, "channel op: expected f32");
    into_contiguous(t)
}

/// `(C, H·W)` of `[N, C, H, W]` as the kernels' u32 index arguments.
fn geometry(x: &CubeTensor) -> (u32, u32) {
    let dims = x.meta.shape().clone();
    let plane: usize = dims[2..].iter().product();
    let fits = |v: usize| {
        u32::try_from(v)
            .unwrap_or_else(|_| panic!("channel op: {v} exceeds the kernel's u32 indices"))
    };
    fits(x.meta.num_elements());
    (fits(dims[1]), fits(plane.max(1)))
}

/// Per-row mean or sum of contiguous `[R, L]`, one cube per row: `[R, 1]`.
fn per_row(rows: CubeTensor, config: ReduceOperationConfig) -> CubeTensor {
    let strategy = ReduceStrategy {
        routine: RoutineStrategy::Cube(BlueprintStrategy::Inferred(CubeStrategy {
            use_planes: false,
        })),
        vectorization: VectorizationStrategy { parallel_output_vectorization: false },
        autotune_level: Default::default(),
    };
    reduce_dim(rows, None, 1, KernelReduceStrategy::Specific(strategy), config)
        .unwrap_or_else(|e| panic!("channel op: the per-channel reduction failed: {e:?}"))
}

/// `[N, C, H, W]` as rows `[C, N·H·W]` (`centre`: of `(x − μ_c)²`).
fn rows(x: &CubeTensor, mean: &CubeTensor, centre: bool) -> CubeTensor {
    let (c, plane) = geometry(x);
    let out = empty_shaped(x, vec![c as usize, x.meta.num_elements() / c.max(1) as usize]);
    let (count, dim) = elementwise(&x.client, x.meta.num_elements());
    rows_kernel::launch(
        &x.client,
        count,
        dim,
        x.clone().into_buffer_arg(),
        mean.clone().into_buffer_arg(),
        out.clone().into_buffer_arg(),
        plane,
        c,
        centre,
    );
    out
}

fn scale_shift(x: CubeTensor, w: CubeTensor, b: Option<CubeTensor>) -> CubeTensor {
    let (x, w) = (f32_contiguous(x), f32_contiguous(w));
    let (c, plane) = geometry(&x);
    let shift = b.is_some();
    let b = b.map(f32_contiguous).unwrap_or_else(|| w.clone());
    let out = empty_like(&x);
    let (count, dim) = elementwise(&x.client, x.meta.num_elements());
    scale_shift_kernel::launch(
        &x.client,
        count,
        dim,
        x.clone().into_buffer_arg(),
        w.into_buffer_arg(),
        b.into_buffer_arg(),
        out.clone().into_buffer_arg(),
        plane,
        c,
        shift,
    );
    out
}

fn reshape(t: CubeTensor, shape: Vec<usize>) -> CubeTensor {
    <CubeBackend as burn::backend::ops::FloatTensorOps<CubeBackend>>::float_reshape(t, shape.into())
}

fn cat_rows(a: CubeTensor, b: CubeTensor) -> CubeTensor {
    <CubeBackend as burn::backend::ops::FloatTensorOps<CubeBackend>>::float_cat(vec![a, b], 0)
}

impl ChannelBackend for CubeBackend {
    fn channel_moments(x: CubeTensor) -> CubeTensor {
        let x = f32_contiguous(x);
        let c = geometry(&x).0 as usize;
        let mean = per_row(rows(&x, &x, false), ReduceOperationConfig::Mean);
        let var = per_row(rows(&x, &mean, true), ReduceOperationConfig::Mean);
        cat_rows(reshape(mean, vec![1, c]), reshape(var, vec![1, c]))
    }

    fn channel_moments_backward(
        x: CubeTensor,
        moments: CubeTensor,
        grad: CubeTensor,
    ) -> CubeTensor {
        let (x, m, g) = (f32_contiguous(x), f32_contiguous(moments), f32_contiguous(grad));
        let (c, plane) = geometry(&x);
        let count = (x.meta.num_elements() / c.max(1) as usize) as f32;
        let out = empty_like(&x);
        let (cubes, dim) = elementwise(&x.client, x.meta.num_elements());
        moments_backward_kernel::launch(
            &x.client,
            cubes,
            dim,
            x.clone().into_buffer_arg(),
            m.into_buffer_arg(),
            g.into_buffer_arg(),
            out.clone().into_buffer_arg(),
            plane,
            c,
            count,
        );
        out
    }

    fn channel_affine(x: CubeTensor, w: CubeTensor, b: CubeTensor) -> CubeTensor {
        scale_shift(x, w, Some(b))
    }

    fn channel_affine_x_backward(grad: CubeTensor, w: CubeTensor) -> CubeTensor {
        scale_shift(grad, w, None)
    }

    fn channel_affine_wb_backward(x: CubeTensor, grad: CubeTensor) -> CubeTensor {
        let (x, g) = (f32_contiguous(x), f32_contiguous(grad));
        let (c, plane) = geometry(&x);
        let len = x.meta.num_elements() / c.max(1) as usize;
        let out = empty_shaped(&x, vec![2 * c as usize, len]);
        let (cubes, dim) = elementwise(&x.client, x.meta.num_elements());
        wb_rows_kernel::launch(
            &x.client,
            cubes,
            dim,
            x.clone().into_buffer_arg(),
            g.into_buffer_arg(),
            out.clone().into_buffer_arg(),
            plane,
            c,
        );
        reshape(per_row(out, ReduceOperationConfig::Sum), vec![2, c as usize])
    }
}
