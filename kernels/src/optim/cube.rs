//! The SGD update and squared-sum kernels for the CubeCL backends.

use burn_cubecl::CubeBackend;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::StepBackend;
use crate::cat::taken;
use crate::support::cube::{
    cube_sum, elementwise, empty_like, empty_shaped, f32_contiguous, f32_strided,
    f32_strided_alike, strided_at,
};

/// Threads of the cube that sums a gradient (a power of two: the tree halves it).
const UNITS: u32 = 256;

/// `v = d` or `d·1 + velocity·μ` with `d = w·λ + g·s` (`g` without `has_scale`);
/// `out = w − v·lr`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn sgd_kernel(
    w: &Tensor<f32>,
    g: &Tensor<f32>,
    velocity: &[f32],
    out: &mut [f32],
    v: &mut [f32],
    decay: f32,
    momentum: f32,
    lr: f32,
    scale: f32,
    #[comptime] has_velocity: bool,
    #[comptime] has_scale: bool,
) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        let wi = w[strided_at(w, i)];
        let mut gi = g[strided_at(g, i)];
        if has_scale {
            gi *= scale;
        }
        let d = wi * decay + gi;
        let mut vi = d;
        if has_velocity {
            vi = d + velocity[i] * momentum;
        }
        v[i] = vi;
        out[i] = wi - vi * lr;
    }
}

/// `out[0] = ((before[0] + Σ g₀²) + Σ g₁²) + …` over the gradients `gs` (without `has_acc`
/// the first sum alone starts it): each gradient's sum by one cube, each unit a fixed stride of
/// its elements, then a tree in shared memory; the sums added in order, as one launch per
/// gradient would add them.
#[cube(launch)]
fn squared_sum_kernel(
    gs: &Sequence<OwnedTensor<f32>>,
    before: &[f32],
    out: &mut [f32],
    #[comptime] units: usize,
    #[comptime] has_acc: bool,
) {
    let mut shared = Shared::<[f32]>::new_slice(units);
    let count = comptime!(gs.len());
    let mut running = 0.0f32;
    if has_acc {
        running = before[0];
    }
    #[unroll]
    for t in 0..count {
        let g = &gs[t];
        let mut n = 1usize;
        for d in 0..g.rank() {
            n *= g.shape(d);
        }
        let mut acc = 0.0f32;
        let mut j = UNIT_POS_X as usize;
        while j < n {
            let v = g[strided_at(g, j)];
            acc += v * v;
            j += CUBE_DIM_X as usize;
        }
        let total = cube_sum(&mut shared, acc);
        if comptime!(t == 0 && !has_acc) {
            running = total;
        } else {
            running += total;
        }
    }
    if UNIT_POS_X == 0 {
        out[0] = running;
    }
}

/// `out = w·keep + g·step`.
#[cube(launch)]
fn axpy_kernel(w: &Tensor<f32>, g: &Tensor<f32>, out: &mut [f32], keep: f32, step: f32) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        out[i] = w[strided_at(w, i)] * keep + g[strided_at(g, i)] * step;
    }
}

/// `out = w − ((velocity·μ + g) + w·λ)·ξ`, or `w − (g + w·λ)·ξ`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn virtual_step_kernel(
    w: &Tensor<f32>,
    g: &Tensor<f32>,
    velocity: &Tensor<f32>,
    out: &mut [f32],
    momentum: f32,
    decay: f32,
    xi: f32,
    #[comptime] has_velocity: bool,
) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        let wi = w[strided_at(w, i)];
        let mut m = g[strided_at(g, i)];
        if has_velocity {
            m += velocity[strided_at(velocity, i)] * momentum;
        }
        out[i] = wi - (m + wi * decay) * xi;
    }
}

/// The panics' name for these kernels.
const OP: &str = "optimizer step";

impl StepBackend for CubeBackend {
    fn sgd_update(
        w: CubeTensor,
        g: CubeTensor,
        velocity: CubeTensor,
        has_velocity: bool,
        [decay, momentum, lr, scale]: [f32; 4],
        has_scale: bool,
    ) -> (CubeTensor, CubeTensor) {
        let (w, g) = (f32_strided(w, OP), f32_strided(g, OP));
        let n = w.meta.num_elements();
        assert_eq!(g.meta.shape(), w.meta.shape(), "optimizer step: gradient and weight differ");
        // Not read without `has_velocity`: laid out as it is.
        let velocity = if has_velocity { f32_contiguous(velocity, OP) } else { velocity };
        assert_eq!(velocity.meta.num_elements(), n, "optimizer step: momentum buffer size");
        let (out, v) = (empty_like(&w), empty_shaped(&w, vec![n]));
        let (cubes, dim) = elementwise(&w.client, n);
        sgd_kernel::launch(
            &w.client,
            cubes,
            dim,
            w.clone().into_tensor_arg(),
            g.into_tensor_arg(),
            velocity.into_buffer_arg(),
            out.clone().into_buffer_arg(),
            v.clone().into_buffer_arg(),
            decay,
            momentum,
            lr,
            scale,
            has_velocity,
            has_scale,
        );
        (out, v)
    }

    fn axpy(w: CubeTensor, g: CubeTensor, keep: f32, step: f32) -> CubeTensor {
        let [w, g] = f32_strided_alike([w, g], OP);
        let out = empty_like(&w);
        let (cubes, dim) = elementwise(&w.client, w.meta.num_elements());
        axpy_kernel::launch(
            &w.client,
            cubes,
            dim,
            w.clone().into_tensor_arg(),
            g.into_tensor_arg(),
            out.clone().into_buffer_arg(),
            keep,
            step,
        );
        out
    }

    fn virtual_step(
        w: CubeTensor,
        g: CubeTensor,
        velocity: CubeTensor,
        has_velocity: bool,
        [momentum, decay, xi]: [f32; 3],
    ) -> CubeTensor {
        let [w, g, velocity] = f32_strided_alike([w, g, velocity], OP);
        let out = empty_like(&w);
        let (cubes, dim) = elementwise(&w.client, w.meta.num_elements());
        virtual_step_kernel::launch(
            &w.client,
            cubes,
            dim,
            w.clone().into_tensor_arg(),
            g.into_tensor_arg(),
            velocity.into_tensor_arg(),
            out.clone().into_buffer_arg(),
            momentum,
            decay,
            xi,
            has_velocity,
        );
        out
    }

    fn squared_sum(
        g0: CubeTensor,
        g1: CubeTensor,
        g2: CubeTensor,
        g3: CubeTensor,
        g4: CubeTensor,
        g5: CubeTensor,
        g6: CubeTensor,
        g7: CubeTensor,
        count: usize,
        acc: CubeTensor,
        has_acc: bool,
    ) -> CubeTensor {
        let gs = taken([g0, g1, g2, g3, g4, g5, g6, g7], count);
        let acc = if has_acc { f32_contiguous(acc, OP) } else { gs[0].clone() };
        let out = empty_shaped(&gs[0], vec![1]);
        let client = out.client.clone();
        let mut args = SequenceArg::<OwnedTensor<f32>>::new();
        for g in gs {
            args.push(f32_strided(g, OP).into_tensor_arg());
        }
        squared_sum_kernel::launch(
            &client,
            CubeCount::new_1d(1),
            CubeDim::new_1d(UNITS),
            args,
            acc.into_buffer_arg(),
            out.clone().into_buffer_arg(),
            UNITS as usize,
            has_acc,
        );
        out
    }
}
