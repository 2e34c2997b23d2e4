//! The fused fake-quant kernels for the CubeCL backends (`wgpu`, `cuda`): one thread per
//! element, one read of `x` and one write of the output forward; one read of `x` and of the
//! upstream gradient backward, masked in place when the gradient buffer is free to reuse.
//!
//! Rounding is spelled out with exact operations (`|v|`, `floor`, an exact fraction, a parity
//! test) rather than the runtime's `round`: WGSL and CUDA round ties to even, but SPIR-V's
//! `Round` leaves ties to the driver. No multiply feeds an add directly, so a compiler that
//! contracts `a·b + c` into one fused multiply-add (CUDA does by default) cannot skip the rounding
//! of `x · mult` that the composite version performs: both give the same bits.

use burn::tensor::DType;
use burn_cubecl::CubeBackend;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use crate::lanes::cube::{elementwise, empty_like, round_ties};

use super::{FakeQuantBackend, FusedLayout};

/// The channel of element `i`: `(i / inner) % channels`, or 0 per tensor. In 32 bits: a
/// 64-bit integer division is emulated on GPUs (and on Mesa's CPU driver) and costs more than
/// the rest of the kernel.
#[cube]
fn channel(i: usize, inner: u32, channels: u32, #[comptime] per_tensor: bool) -> usize {
    let mut c = 0u32;
    if !per_tensor {
        c = (i as u32 / inner) % channels;
    }
    c as usize
}

/// `round(x · mult) + z`, unclamped.
#[cube]
fn rounded(x: f32, mult: f32, zp: f32, #[comptime] ties_away: bool) -> f32 {
    round_ties(x * mult, ties_away) + zp
}

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn fake_quant_forward_kernel(
    x: &[f32],
    mult: &[f32],
    step: &[f32],
    zp: &[f32],
    out: &mut [f32],
    qmin: f32,
    qmax: f32,
    inner: u32,
    channels: u32,
    #[comptime] per_tensor: bool,
    #[comptime] ties_away: bool,
) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        let c = channel(i, inner, channels, per_tensor);
        let z = zp[c];
        let r = rounded(x[i], mult[c], z, ties_away);
        let q = select(r < qmin, qmin, r);
        let q = select(q > qmax, qmax, q);
        out[i] = (q - z) * step[c];
    }
}

/// Zeroes `grad` where `x` quantizes outside `[qmin, qmax]`, in place.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn fake_quant_backward_kernel(
    x: &[f32],
    mult: &[f32],
    zp: &[f32],
    grad: &mut [f32],
    qmin: f32,
    qmax: f32,
    inner: u32,
    channels: u32,
    #[comptime] per_tensor: bool,
    #[comptime] ties_away: bool,
) {
    let i = ABSOLUTE_POS;
    if i < grad.len() {
        let c = channel(i, inner, channels, per_tensor);
        let r = rounded(x[i], mult[c], zp[c], ties_away);
        if r < qmin || r > qmax {
            grad[i] = 0.0;
        }
    }
}

/// A contiguous f32 tensor.
///
/// # Panics
/// If `t` is not f32 (the dispatching wrapper only calls the kernels for f32).
fn contiguous_f32(t: CubeTensor) -> CubeTensor {
    assert_eq!(t.dtype, DType::F32, "fused fake quant: expected f32");
    into_contiguous(t)
}

/// The kernel's `inner` and `channels` arguments. The grid parameters must hold one value per
/// channel (the dispatching wrapper expands `[1]` ones).
///
/// # Panics
/// If a parameter's length is not `layout.channels`, or a run length exceeds `u32`.
fn index_args(layout: &FusedLayout, params: &[&CubeTensor]) -> (u32, u32) {
    for p in params {
        assert_eq!(
            p.meta.num_elements(),
            layout.channels,
            "fused fake quant: a grid parameter has the wrong length"
        );
    }
    let fits = |v: usize| {
        u32::try_from(v)
            .unwrap_or_else(|_| panic!("fused fake quant: {v} exceeds the kernel's u32 indices"))
    };
    // Per tensor the kernel ignores `inner` (which is then the element count).
    let inner = if layout.channels == 1 { 1 } else { fits(layout.inner) };
    (inner, fits(layout.channels))
}

impl FakeQuantBackend for CubeBackend {
    fn fake_quant_fused(
        x: CubeTensor,
        mult: CubeTensor,
        step: CubeTensor,
        zero_point: CubeTensor,
        layout: FusedLayout,
    ) -> CubeTensor {
        let x = contiguous_f32(x);
        let (mult, step, zp) =
            (contiguous_f32(mult), contiguous_f32(step), contiguous_f32(zero_point));
        let n = x.meta.num_elements();
        let (inner, channels) = index_args(&layout, &[&mult, &step, &zp]);
        let client = x.client.clone();
        let out = empty_like(&x);
        let (cube_count, cube_dim) = elementwise(&client, n);
        fake_quant_forward_kernel::launch(
            &client,
            cube_count,
            cube_dim,
            x.into_buffer_arg(),
            mult.into_buffer_arg(),
            step.into_buffer_arg(),
            zp.into_buffer_arg(),
            out.clone().into_buffer_arg(),
            layout.qmin as f32,
            layout.qmax as f32,
            inner,
            channels,
            channels == 1,
            layout.ties_away,
        );
        out
    }

    fn fake_quant_fused_backward(
        x: CubeTensor,
        grad: CubeTensor,
        mult: CubeTensor,
        zero_point: CubeTensor,
        layout: FusedLayout,
    ) -> CubeTensor {
        let x = contiguous_f32(x);
        let (mult, zp) = (contiguous_f32(mult), contiguous_f32(zero_point));
        // The upstream gradient is usually owned here: mask it in place, else mask a copy.
        let grad = contiguous_f32(grad);
        let grad = if grad.can_mut() { grad } else { copy(grad) };
        let n = x.meta.num_elements();
        let (inner, channels) = index_args(&layout, &[&mult, &zp]);
        let client = x.client.clone();
        let (cube_count, cube_dim) = elementwise(&client, n);
        fake_quant_backward_kernel::launch(
            &client,
            cube_count,
            cube_dim,
            x.into_buffer_arg(),
            mult.into_buffer_arg(),
            zp.into_buffer_arg(),
            grad.clone().into_buffer_arg(),
            layout.qmin as f32,
            layout.qmax as f32,
            inner,
            channels,
            channels == 1,
            layout.ties_away,
        );
        grad
    }
}

/// A fresh contiguous copy of `t` (whose buffer is shared, so not ours to write).
fn copy(t: CubeTensor) -> CubeTensor {
    #[cube(launch)]
    fn copy_kernel(src: &[f32], dst: &mut [f32]) {
        let i = ABSOLUTE_POS;
        if i < dst.len() {
            dst[i] = src[i];
        }
    }
    let client = t.client.clone();
    let out = empty_like(&t);
    let (cube_count, cube_dim) = elementwise(&client, t.meta.num_elements());
    copy_kernel::launch(
        &client,
        cube_count,
        cube_dim,
        t.into_buffer_arg(),
        out.clone().into_buffer_arg(),
    );
    out
}
