//! The held-rounding kernels for the CubeCL backends: one thread per element, every input
//! read through its strides, the output contiguous.

use burn_cubecl::CubeBackend;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::HoldBackend;
use crate::fake_quant::FusedLayout;
use crate::fake_quant::cube::{channel, clipped, index_args};
use crate::plane::PlaneGeom;
use crate::support::cube::{elementwise, empty_like, f32_contiguous, f32_strided_alike, lt, read};

/// Whether `x_w` rounds inside `[qmin, qmax]` on `(mult, zp)`.
#[cube]
fn inside(x_w: f32, mult: f32, zp: f32, qmin: f32, qmax: f32, #[comptime] ties_away: bool) -> bool {
    !clipped(x_w, mult, zp, qmin, qmax, ties_away)
}

/// `out = x·m + (a − x_w·m)`, `m` 1 where `x_w` rounds inside the range, else 0.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn held_kernel(
    x: &Tensor<f32>,
    x_w: &Tensor<f32>,
    a: &Tensor<f32>,
    mult: &[f32],
    zp: &[f32],
    out: &mut [f32],
    qmin: f32,
    qmax: f32,
    inner: u32,
    channels: u32,
    zero: f32,
    #[comptime] per_tensor: bool,
    #[comptime] ties_away: bool,
    #[comptime] strided: bool,
) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        let c = channel(i, inner, channels, per_tensor);
        let (v, vw, va) = (read(x, i, strided), read(x_w, i, strided), read(a, i, strided));
        // The products by 1 are the factors themselves; those by 0 are computed (a NaN or an
        // infinity stays NaN, a sign stays on the zero).
        out[i] = select(
            inside(vw, mult[c], zp[c], qmin, qmax, ties_away),
            v + (va - vw),
            v * zero + (va - vw * zero),
        );
    }
}

/// `out = grad·m`, `m` as in `held_kernel`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn held_backward_kernel(
    x_w: &Tensor<f32>,
    grad: &Tensor<f32>,
    mult: &[f32],
    zp: &[f32],
    out: &mut [f32],
    qmin: f32,
    qmax: f32,
    inner: u32,
    channels: u32,
    zero: f32,
    #[comptime] per_tensor: bool,
    #[comptime] ties_away: bool,
    #[comptime] strided: bool,
) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        let c = channel(i, inner, channels, per_tensor);
        let g = read(grad, i, strided);
        out[i] = select(
            inside(read(x_w, i, strided), mult[c], zp[c], qmin, qmax, ties_away),
            g,
            g * zero,
        );
    }
}

/// `out = x·[key > 0]`.
#[cube(launch)]
fn gate_kernel(
    x: &Tensor<f32>,
    key: &Tensor<f32>,
    out: &mut [f32],
    zero: f32,
    #[comptime] strided: bool,
) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        let v = read(x, i, strided);
        out[i] = select(lt(0.0, read(key, i, strided)), v, v * zero);
    }
}

/// The panics' name for these kernels.
const OP: &str = "held rounding";

/// `ts` checked (f32, 32-bit offsets, one shape), and whether any is not contiguous.
fn checked<const N: usize>(ts: [CubeTensor; N]) -> ([CubeTensor; N], bool) {
    let ts = f32_strided_alike(ts, OP);
    let strided = ts.iter().any(|t| !t.is_contiguous());
    (ts, strided)
}

impl HoldBackend for CubeBackend {
    fn max_pool_at(x: CubeTensor, key: CubeTensor, geom: PlaneGeom) -> CubeTensor {
        crate::pool2d::cube::max_at(x, key, geom)
    }

    fn held_fake_quant(
        x: CubeTensor,
        x_w: CubeTensor,
        at_w: CubeTensor,
        mult: CubeTensor,
        zero_point: CubeTensor,
        layout: FusedLayout,
    ) -> CubeTensor {
        let ([x, x_w, at_w], strided) = checked([x, x_w, at_w]);
        let (mult, zp) = (f32_contiguous(mult, OP), f32_contiguous(zero_point, OP));
        let (inner, channels) = index_args(&layout, &[&mult, &zp]);
        let out = empty_like(&x);
        let client = x.client.clone();
        let (cubes, dim) = elementwise(&client, x.meta.num_elements());
        held_kernel::launch(
            &client,
            cubes,
            dim,
            x.into_tensor_arg(),
            x_w.into_tensor_arg(),
            at_w.into_tensor_arg(),
            mult.into_buffer_arg(),
            zp.into_buffer_arg(),
            out.clone().into_buffer_arg(),
            layout.qmin as f32,
            layout.qmax as f32,
            inner,
            channels,
            0.0,
            channels == 1,
            layout.ties_away,
            strided,
        );
        out
    }

    fn held_fake_quant_backward(
        x_w: CubeTensor,
        grad: CubeTensor,
        mult: CubeTensor,
        zero_point: CubeTensor,
        layout: FusedLayout,
    ) -> CubeTensor {
        let ([x_w, grad], strided) = checked([x_w, grad]);
        let (mult, zp) = (f32_contiguous(mult, OP), f32_contiguous(zero_point, OP));
        let (inner, channels) = index_args(&layout, &[&mult, &zp]);
        let out = empty_like(&grad);
        let client = grad.client.clone();
        let (cubes, dim) = elementwise(&client, grad.meta.num_elements());
        held_backward_kernel::launch(
            &client,
            cubes,
            dim,
            x_w.into_tensor_arg(),
            grad.into_tensor_arg(),
            mult.into_buffer_arg(),
            zp.into_buffer_arg(),
            out.clone().into_buffer_arg(),
            layout.qmin as f32,
            layout.qmax as f32,
            inner,
            channels,
            0.0,
            channels == 1,
            layout.ties_away,
            strided,
        );
        out
    }

    fn gate(x: CubeTensor, key: CubeTensor) -> CubeTensor {
        let ([x, key], strided) = checked([x, key]);
        let out = empty_like(&x);
        let client = x.client.clone();
        let (cubes, dim) = elementwise(&client, x.meta.num_elements());
        gate_kernel::launch(
            &client,
            cubes,
            dim,
            x.into_tensor_arg(),
            key.into_tensor_arg(),
            out.clone().into_buffer_arg(),
            0.0,
            strided,
        );
        out
    }
}
