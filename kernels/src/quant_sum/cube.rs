//! The quantized sum's kernels for the CubeCL backends (`wgpu`, `cuda`): one thread per
//! element; operands read through their strides, the running integer sum and the outputs
//! contiguous.

use burn_cubecl::CubeBackend;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::QuantSumBackend;
use crate::cat::taken;
use crate::fake_quant::FusedLayout;
use crate::fake_quant::cube::{channel, dequantized, index_args};
use crate::support::cube::{
    elementwise, empty_like, f32_contiguous, f32_strided, lt, read, round_ties,
};

/// `acc = round(x · mult)` (`start`), else `acc += round(x · mult)`: in place, or from `prev`
/// into a fresh `acc` (`copy`).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn add_kernel(
    x: &Tensor<f32>,
    mult: &[f32],
    prev: &[f32],
    acc: &mut [f32],
    inner: u32,
    channels: u32,
    #[comptime] per_tensor: bool,
    #[comptime] ties_away: bool,
    #[comptime] strided: bool,
    #[comptime] start: bool,
    #[comptime] copy: bool,
) {
    let i = ABSOLUTE_POS;
    if i < acc.len() {
        let c = channel(i, inner, channels, per_tensor);
        let q = round_ties(read(x, i, strided) * mult[c], ties_away);
        if start {
            acc[i] = q;
        } else if copy {
            acc[i] = prev[i] + q;
        } else {
            acc[i] += q;
        }
    }
}

/// `r = acc + round(x · mult) + zp`, `out = (clamp(r, qmin, qmax) − zp) · step`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn finish_kernel(
    x: &Tensor<f32>,
    acc: &[f32],
    mult: &[f32],
    step: &[f32],
    zp: &[f32],
    r: &mut [f32],
    out: &mut [f32],
    qmin: f32,
    qmax: f32,
    inner: u32,
    channels: u32,
    #[comptime] per_tensor: bool,
    #[comptime] ties_away: bool,
    #[comptime] strided: bool,
) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        let c = channel(i, inner, channels, per_tensor);
        let sum = acc[i] + round_ties(read(x, i, strided) * mult[c], ties_away);
        let v = sum + zp[c];
        r[i] = v;
        out[i] = dequantized(v, step[c], zp[c], qmin, qmax);
    }
}

/// `r = ((round(x₀ · mult) + round(x₁ · mult)) + …) + zp` over the operands `xs` (added in
/// their order, as the chain of [`add_kernel`] and [`finish_kernel`] adds them) and
/// `out = (clamp(r, qmin, qmax) − zp) · step`, in one launch.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn sum_all_kernel(
    xs: &Sequence<OwnedTensor<f32>>,
    mult: &[f32],
    step: &[f32],
    zp: &[f32],
    r: &mut [f32],
    out: &mut [f32],
    qmin: f32,
    qmax: f32,
    inner: u32,
    channels: u32,
    #[comptime] per_tensor: bool,
    #[comptime] ties_away: bool,
    #[comptime] strided: bool,
) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        let c = channel(i, inner, channels, per_tensor);
        let m = mult[c];
        let mut sum = round_ties(read(&xs[0], i, strided) * m, ties_away);
        #[unroll]
        for t in 1..comptime!(xs.len()) {
            sum += round_ties(read(&xs[t], i, strided) * m, ties_away);
        }
        let v = sum + zp[c];
        r[i] = v;
        out[i] = dequantized(v, step[c], zp[c], qmin, qmax);
    }
}

/// `grad · [qmin ≤ r ≤ qmax]` (a NaN sum passes) into `out`; `in_place`: `out` holds the
/// gradient (and `grad` is not read).
#[cube(launch)]
fn backward_kernel(
    r: &[f32],
    grad: &Tensor<f32>,
    out: &mut [f32],
    qmin: f32,
    qmax: f32,
    #[comptime] strided: bool,
    #[comptime] in_place: bool,
) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        let v = r[i];
        let inside = !(lt(v, qmin) || lt(qmax, v));
        let g = if in_place { out[i] } else { read(grad, i, strided) };
        // A product, as the expressions' mask: −0 where a negative gradient is clipped.
        out[i] = g * select(inside, 1.0, 0.0);
    }
}

/// The panics' name for these kernels.
const OP: &str = "quantized sum";

/// `acc + round(x · mult)`, or `round(x · mult)` without `acc`.
fn launch_add(
    acc: Option<CubeTensor>,
    x: CubeTensor,
    mult: CubeTensor,
    layout: FusedLayout,
) -> CubeTensor {
    let x = f32_strided(x, OP);
    let mult = f32_contiguous(mult, OP);
    let (inner, channels) = index_args(&layout, &[&mult]);
    let client = x.client.clone();
    let (cube_count, cube_dim) = elementwise(&client, x.meta.num_elements());
    let strided = !x.is_contiguous();
    let start = acc.is_none();
    // The running sum is ours (contiguous, from the start launch) unless a caller kept it.
    let (prev, out, copy) = match acc {
        Some(a) if a.can_mut() && a.is_contiguous() => (mult.clone(), a, false),
        Some(a) => {
            let a = f32_contiguous(a, OP);
            (a, empty_like(&x), true)
        }
        None => (mult.clone(), empty_like(&x), false),
    };
    add_kernel::launch(
        &client,
        cube_count,
        cube_dim,
        x.into_tensor_arg(),
        mult.into_buffer_arg(),
        prev.into_buffer_arg(),
        out.clone().into_buffer_arg(),
        inner,
        channels,
        channels == 1,
        layout.ties_away,
        strided,
        start,
        copy,
    );
    out
}

impl QuantSumBackend for CubeBackend {
    fn quant_sum_start(x: CubeTensor, mult: CubeTensor, layout: FusedLayout) -> CubeTensor {
        launch_add(None, x, mult, layout)
    }

    fn quant_sum_add(
        acc: CubeTensor,
        x: CubeTensor,
        mult: CubeTensor,
        layout: FusedLayout,
    ) -> CubeTensor {
        launch_add(Some(acc), x, mult, layout)
    }

    fn quant_sum_finish(
        _sum: CubeTensor,
        acc: CubeTensor,
        x: CubeTensor,
        mult: CubeTensor,
        step: CubeTensor,
        zero_point: CubeTensor,
        layout: FusedLayout,
    ) -> (CubeTensor, CubeTensor) {
        let (x, acc) = (f32_strided(x, OP), f32_contiguous(acc, OP));
        let (mult, step, zp) =
            (f32_contiguous(mult, OP), f32_contiguous(step, OP), f32_contiguous(zero_point, OP));
        let (inner, channels) = index_args(&layout, &[&mult, &step, &zp]);
        let client = x.client.clone();
        let (cube_count, cube_dim) = elementwise(&client, x.meta.num_elements());
        let strided = !x.is_contiguous();
        let (r, out) = (empty_like(&x), empty_like(&x));
        finish_kernel::launch(
            &client,
            cube_count,
            cube_dim,
            x.into_tensor_arg(),
            acc.into_buffer_arg(),
            mult.into_buffer_arg(),
            step.into_buffer_arg(),
            zp.into_buffer_arg(),
            r.clone().into_buffer_arg(),
            out.clone().into_buffer_arg(),
            layout.qmin as f32,
            layout.qmax as f32,
            inner,
            channels,
            channels == 1,
            layout.ties_away,
            strided,
        );
        (out, r)
    }

    fn quant_sum_all(
        _sum: CubeTensor,
        x0: CubeTensor,
        x1: CubeTensor,
        x2: CubeTensor,
        x3: CubeTensor,
        x4: CubeTensor,
        x5: CubeTensor,
        x6: CubeTensor,
        x7: CubeTensor,
        count: usize,
        mult: CubeTensor,
        step: CubeTensor,
        zero_point: CubeTensor,
        layout: FusedLayout,
    ) -> (CubeTensor, CubeTensor) {
        let xs: Vec<CubeTensor> = taken([x0, x1, x2, x3, x4, x5, x6, x7], count)
            .into_iter()
            .map(|x| f32_strided(x, OP))
            .collect();
        for x in &xs[1..] {
            assert_eq!(x.meta.shape(), xs[0].meta.shape(), "{OP}: operands of two shapes");
        }
        let (mult, step, zp) =
            (f32_contiguous(mult, OP), f32_contiguous(step, OP), f32_contiguous(zero_point, OP));
        let (inner, channels) = index_args(&layout, &[&mult, &step, &zp]);
        let client = xs[0].client.clone();
        let (cube_count, cube_dim) = elementwise(&client, xs[0].meta.num_elements());
        let strided = xs.iter().any(|x| !x.is_contiguous());
        let (r, out) = (empty_like(&xs[0]), empty_like(&xs[0]));
        let mut args = SequenceArg::<OwnedTensor<f32>>::new();
        for x in xs {
            args.push(x.into_tensor_arg());
        }
        sum_all_kernel::launch(
            &client,
            cube_count,
            cube_dim,
            args,
            mult.into_buffer_arg(),
            step.into_buffer_arg(),
            zp.into_buffer_arg(),
            r.clone().into_buffer_arg(),
            out.clone().into_buffer_arg(),
            layout.qmin as f32,
            layout.qmax as f32,
            inner,
            channels,
            channels == 1,
            layout.ties_away,
            strided,
        );
        (out, r)
    }

    fn quant_sum_backward(r: CubeTensor, grad: CubeTensor, layout: FusedLayout) -> CubeTensor {
        let (r, grad) = (f32_contiguous(r, OP), f32_strided(grad, OP));
        let client = r.client.clone();
        let (cube_count, cube_dim) = elementwise(&client, r.meta.num_elements());
        let strided = !grad.is_contiguous();
        // Masked in place when the gradient is contiguous and ours to overwrite (then `r`
        // stands in for the unread `grad`: one buffer must not be bound twice for writing).
        let in_place = !strided && grad.can_mut();
        let (grad, out) = if in_place { (r.clone(), grad) } else { (grad, empty_like(&r)) };
        backward_kernel::launch(
            &client,
            cube_count,
            cube_dim,
            r.into_buffer_arg(),
            grad.into_tensor_arg(),
            out.clone().into_buffer_arg(),
            layout.qmin as f32,
            layout.qmax as f32,
            strided,
            in_place,
        );
        out
    }
}
