//! The SGD update and squared-sum kernels for the CubeCL backends.

use burn_cubecl::CubeBackend;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::StepBackend;
use crate::cat::taken;
use crate::support::cube::{
    Packing, cube_sum, elementwise, empty_shaped, f32_contiguous, f32_strided, packed, strided_at,
};

/// Threads of the cube that sums a gradient (a power of two: the tree halves it).
const UNITS: u32 = 256;

/// One SGD step of each parameter `ws[t]`: `v = d` or `d·1 + velocity·μ` with
/// `d = w·λ + g·s` (`g` without `has_scale`), `out = w − v·lr`. Element `i` of the flat `out`
/// and `v` is element `i − starts[t]` of parameter `t` for `starts[t] ≤ i < ends[t]` (the gaps
/// between parts are not written); parameter `t` reads its momentum buffer `vs[t]` where bit
/// `t` of `with_velocity` is set.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn sgd_many_kernel(
    ws: &Sequence<OwnedTensor<f32>>,
    gs: &Sequence<OwnedTensor<f32>>,
    vs: &Sequence<OwnedTensor<f32>>,
    starts: Sequence<usize>,
    ends: Sequence<usize>,
    out: &mut [f32],
    v: &mut [f32],
    decay: f32,
    momentum: f32,
    lr: f32,
    scale: f32,
    #[comptime] with_velocity: u32,
    #[comptime] has_scale: bool,
) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        let count = comptime!(ws.len());
        #[unroll]
        for t in 0..count {
            if i >= starts[t] && i < ends[t] {
                let j = i - starts[t];
                let (w, g) = (&ws[t], &gs[t]);
                let wi = w[strided_at(w, j)];
                let mut gi = g[strided_at(g, j)];
                if has_scale {
                    gi *= scale;
                }
                let d = wi * decay + gi;
                let mut vi = d;
                if comptime!((with_velocity >> t) & 1 == 1) {
                    let velocity = &vs[t];
                    vi = d + velocity[strided_at(velocity, j)] * momentum;
                }
                v[i] = vi;
                out[i] = wi - vi * lr;
            }
        }
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

/// One second-order weight of each parameter `ws[t]` (written as `sgd_many_kernel` writes
/// `out`): `w·a + g·b` (the finite difference's `w ± ε·v`: `a` = keep, `b` = step), or with
/// `virtual_step` DARTS' `w − ((velocity·a + g) + w·b)·c` (μ, λ, ξ; `w − (g + w·b)·c` where
/// bit `t` of `with_velocity` is clear).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn moves_kernel(
    ws: &Sequence<OwnedTensor<f32>>,
    gs: &Sequence<OwnedTensor<f32>>,
    vs: &Sequence<OwnedTensor<f32>>,
    starts: Sequence<usize>,
    ends: Sequence<usize>,
    out: &mut [f32],
    a: f32,
    b: f32,
    c: f32,
    #[comptime] with_velocity: u32,
    #[comptime] virtual_step: bool,
) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        let count = comptime!(ws.len());
        #[unroll]
        for t in 0..count {
            if i >= starts[t] && i < ends[t] {
                let j = i - starts[t];
                let (w, g) = (&ws[t], &gs[t]);
                let wi = w[strided_at(w, j)];
                let gi = g[strided_at(g, j)];
                if virtual_step {
                    let mut m = gi;
                    if comptime!((with_velocity >> t) & 1 == 1) {
                        let velocity = &vs[t];
                        m += velocity[strided_at(velocity, j)] * a;
                    }
                    out[i] = wi - (m + wi * b) * c;
                } else {
                    out[i] = wi * a + gi * b;
                }
            }
        }
    }
}

/// The per-parameter tensor arguments of the many-parameter kernels, checked: each weight,
/// its gradient of the same shape, and its momentum buffer (passed unchecked where bit `t` of
/// `with_velocity` is clear: not read).
fn parameter_args(
    ws: &[CubeTensor],
    gs: Vec<CubeTensor>,
    vs: Vec<CubeTensor>,
    with_velocity: u32,
) -> [SequenceArg<OwnedTensor<f32>>; 3] {
    let (mut w_args, mut g_args, mut v_args) =
        (SequenceArg::new(), SequenceArg::new(), SequenceArg::new());
    let read = |t: usize| with_velocity >> t & 1 == 1;
    for (t, ((w, g), v)) in ws.iter().zip(gs).zip(vs).enumerate() {
        let (w, g) = (f32_strided(w.clone(), OP), f32_strided(g, OP));
        assert_eq!(g.meta.shape(), w.meta.shape(), "{OP}: gradient and weight {t} differ");
        let v = if read(t) { f32_strided(v, OP) } else { v };
        let n = w.meta.num_elements();
        assert!(!read(t) || v.meta.num_elements() == n, "{OP}: momentum buffer {t} size");
        w_args.push(w.into_tensor_arg());
        g_args.push(g.into_tensor_arg());
        v_args.push(v.into_tensor_arg());
    }
    [w_args, g_args, v_args]
}

/// Where each part of a packing starts and ends, as kernel arguments.
fn bounds(packing: &Packing) -> (SequenceArg<usize>, SequenceArg<usize>) {
    let (mut starts, mut ends) = (SequenceArg::new(), SequenceArg::new());
    for (&start, end) in packing.starts.iter().zip(packing.ends()) {
        starts.push(start);
        ends.push(end);
    }
    (starts, ends)
}

/// The panics' name for these kernels.
const OP: &str = "optimizer step";

impl StepBackend for CubeBackend {
    fn sgd_update(
        w: CubeTensor,
        g: CubeTensor,
        velocity: CubeTensor,
        has_velocity: bool,
        constants: [f32; 4],
        has_scale: bool,
    ) -> (CubeTensor, CubeTensor) {
        // The many-parameter kernel with one parameter (its other slots are not read).
        let [w1, w2, w3, w4, w5, w6, w7] = [(); 7].map(|()| w.clone());
        let [g1, g2, g3, g4, g5, g6, g7] = [(); 7].map(|()| g.clone());
        let [v1, v2, v3, v4, v5, v6, v7] = [(); 7].map(|()| velocity.clone());
        let with_velocity = u32::from(has_velocity);
        let mut outs = Self::sgd_updates(
            w,
            w1,
            w2,
            w3,
            w4,
            w5,
            w6,
            w7,
            g,
            g1,
            g2,
            g3,
            g4,
            g5,
            g6,
            g7,
            velocity,
            v1,
            v2,
            v3,
            v4,
            v5,
            v6,
            v7,
            1,
            with_velocity,
            constants,
            has_scale,
        );
        let v = outs.pop().expect("the momentum buffer");
        (outs.pop().expect("the weight"), v)
    }

    fn sgd_updates(
        w0: CubeTensor,
        w1: CubeTensor,
        w2: CubeTensor,
        w3: CubeTensor,
        w4: CubeTensor,
        w5: CubeTensor,
        w6: CubeTensor,
        w7: CubeTensor,
        g0: CubeTensor,
        g1: CubeTensor,
        g2: CubeTensor,
        g3: CubeTensor,
        g4: CubeTensor,
        g5: CubeTensor,
        g6: CubeTensor,
        g7: CubeTensor,
        v0: CubeTensor,
        v1: CubeTensor,
        v2: CubeTensor,
        v3: CubeTensor,
        v4: CubeTensor,
        v5: CubeTensor,
        v6: CubeTensor,
        v7: CubeTensor,
        count: usize,
        with_velocity: u32,
        [decay, momentum, lr, scale]: [f32; 4],
        has_scale: bool,
    ) -> Vec<CubeTensor> {
        let ws = taken([w0, w1, w2, w3, w4, w5, w6, w7], count);
        let gs = taken([g0, g1, g2, g3, g4, g5, g6, g7], count);
        let vs = taken([v0, v1, v2, v3, v4, v5, v6, v7], count);
        let [w_args, g_args, v_args] = parameter_args(&ws, gs, vs, with_velocity);
        let shapes: Vec<Vec<usize>> = ws.iter().map(|w| w.meta.shape().to_vec()).collect();
        let flat: Vec<Vec<usize>> = shapes.iter().map(|s| vec![s.iter().product()]).collect();
        let (out, v) = (packed(&ws[0], shapes), packed(&ws[0], flat));
        let (starts, ends) = bounds(&out);
        let client = ws[0].client.clone();
        let (cubes, dim) = elementwise(&client, out.flat.meta.num_elements());
        sgd_many_kernel::launch(
            &client,
            cubes,
            dim,
            w_args,
            g_args,
            v_args,
            starts,
            ends,
            out.flat.clone().into_buffer_arg(),
            v.flat.clone().into_buffer_arg(),
            decay,
            momentum,
            lr,
            scale,
            with_velocity,
            has_scale,
        );
        out.parts().into_iter().chain(v.parts()).collect()
    }

    fn moves(
        w0: CubeTensor,
        w1: CubeTensor,
        w2: CubeTensor,
        w3: CubeTensor,
        w4: CubeTensor,
        w5: CubeTensor,
        w6: CubeTensor,
        w7: CubeTensor,
        g0: CubeTensor,
        g1: CubeTensor,
        g2: CubeTensor,
        g3: CubeTensor,
        g4: CubeTensor,
        g5: CubeTensor,
        g6: CubeTensor,
        g7: CubeTensor,
        v0: CubeTensor,
        v1: CubeTensor,
        v2: CubeTensor,
        v3: CubeTensor,
        v4: CubeTensor,
        v5: CubeTensor,
        v6: CubeTensor,
        v7: CubeTensor,
        count: usize,
        with_velocity: u32,
        virtual_step: bool,
        [a, b, c]: [f32; 3],
    ) -> Vec<CubeTensor> {
        let ws = taken([w0, w1, w2, w3, w4, w5, w6, w7], count);
        let gs = taken([g0, g1, g2, g3, g4, g5, g6, g7], count);
        let vs = taken([v0, v1, v2, v3, v4, v5, v6, v7], count);
        let [w_args, g_args, v_args] = parameter_args(&ws, gs, vs, with_velocity);
        let out = packed(&ws[0], ws.iter().map(|w| w.meta.shape().to_vec()).collect());
        let (starts, ends) = bounds(&out);
        let client = ws[0].client.clone();
        let (cubes, dim) = elementwise(&client, out.flat.meta.num_elements());
        moves_kernel::launch(
            &client,
            cubes,
            dim,
            w_args,
            g_args,
            v_args,
            starts,
            ends,
            out.flat.clone().into_buffer_arg(),
            a,
            b,
            c,
            with_velocity,
            virtual_step,
        );
        out.parts()
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
