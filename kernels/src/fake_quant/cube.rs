//! The fused fake-quant kernels for the CubeCL backends (`wgpu`, `cuda`): one thread per
//! element, one read of `x` and one write of the output forward; one read of `x` and of the
//! upstream gradient backward, masked in place when the gradient buffer is contiguous and free
//! to reuse. Inputs are read through their strides (a convolution's channels-last output, a
//! channel slice of a concatenation's gradient), not copied first; the outputs are contiguous.
//!
//! Rounding is spelled out with exact operations (`|v|`, `floor`, an exact fraction, a parity
//! test) rather than the runtime's `round`: WGSL and CUDA round ties to even, but SPIR-V's
//! `Round` leaves ties to the driver. No multiply feeds an add directly, so a compiler that
//! contracts `a·b + c` into one fused multiply-add (CUDA does by default) cannot skip the rounding
//! of `x · mult` that the composite version performs: both give the same bits.

use burn_cubecl::CubeBackend;
use burn_cubecl::tensor::CubeTensor;
use cubecl::calculate_cube_count_elemwise;
use cubecl::prelude::*;

use crate::support::cube::{
    elementwise, empty_like, f32_contiguous, f32_strided, lt, read, round_ties, strided_at,
};

use super::{FakeQuantBackend, FusedLayout};

/// The channel of element `i`: `(i / inner) % channels`, or 0 per tensor. In 32 bits: a
/// 64-bit integer division is emulated on GPUs (and on Mesa's CPU driver) and costs more than
/// the rest of the kernel.
#[cube]
pub(crate) fn channel(i: usize, inner: u32, channels: u32, #[comptime] per_tensor: bool) -> usize {
    let mut c = 0u32;
    if !per_tensor {
        c = (i as u32 / inner) % channels;
    }
    c as usize
}

/// Whether `x` rounds outside `[qmin, qmax]` on the grid `(mult, zp)`.
#[cube]
pub(crate) fn clipped(
    x: f32,
    mult: f32,
    zp: f32,
    qmin: f32,
    qmax: f32,
    #[comptime] ties_away: bool,
) -> bool {
    let r = rounded(x, mult, zp, ties_away);
    lt(r, qmin) || lt(qmax, r)
}

/// `round(x · mult) + z`, unclamped.
#[cube]
fn rounded(x: f32, mult: f32, zp: f32, #[comptime] ties_away: bool) -> f32 {
    round_ties(x * mult, ties_away) + zp
}

/// The fake-quantized value of `x` on the grid `(mult, step, zp)`:
/// `(clamp(round(x · mult) + zp, qmin, qmax) − zp) · step`.
#[cube]
pub(crate) fn fake_quantized(
    x: f32,
    mult: f32,
    step: f32,
    zp: f32,
    qmin: f32,
    qmax: f32,
    #[comptime] ties_away: bool,
) -> f32 {
    dequantized(rounded(x, mult, zp, ties_away), step, zp, qmin, qmax)
}

/// Unclamped integers `r` (zero point included) clamped to `[qmin, qmax]` and dequantized:
/// `(clamp(r) − zp) · step`.
#[cube]
pub(crate) fn dequantized(r: f32, step: f32, zp: f32, qmin: f32, qmax: f32) -> f32 {
    let q = select(lt(r, qmin), qmin, r);
    let q = select(lt(qmax, q), qmax, q);
    (q - zp) * step
}

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn fake_quant_forward_kernel(
    x: &Tensor<f32>,
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
    #[comptime] strided: bool,
) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        let c = channel(i, inner, channels, per_tensor);
        out[i] =
            fake_quantized(read(x, i, strided), mult[c], step[c], zp[c], qmin, qmax, ties_away);
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
        if clipped(x[i], mult[c], zp[c], qmin, qmax, ties_away) {
            grad[i] = 0.0;
        }
    }
}

/// `out = grad` where `x` quantizes inside `[qmin, qmax]`, else 0, both read through their
/// strides: for the gradients that are not contiguous or not ours to overwrite.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn fake_quant_backward_strided_kernel(
    x: &Tensor<f32>,
    grad: &Tensor<f32>,
    mult: &[f32],
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
        let outside = clipped(x[strided_at(x, i)], mult[c], zp[c], qmin, qmax, ties_away);
        out[i] = select(outside, 0.0, grad[strided_at(grad, i)]);
    }
}

/// Bit `i % 32` of word `i / 32` of a clip mask: element `i` quantized outside the range.
#[cube]
fn mask_bit(mask: &[u32], i: usize) -> bool {
    let i = i as u32;
    ((mask[(i / 32) as usize] >> (i % 32)) & 1u32) == 1u32
}

/// Packs each unit's `clip` into the clip mask: the cube's units are elements `base + unit`
/// (`CUBE_DIM_X` a multiple of 32, `base` of 32), and the words of those below `n` are
/// written, each by one unit, through `bits` (`CUBE_DIM_X` long, free again on return). Every
/// unit of the cube must call it.
#[cube]
pub(crate) fn pack_clipped(
    bits: &mut Shared<[u32]>,
    clip: bool,
    base: u32,
    n: u32,
    mask: &mut [u32],
) {
    let unit = UNIT_POS_X;
    bits[unit as usize] = select(clip, 1u32 << (unit % 32), 0u32);
    sync_cube();
    let words = CUBE_DIM_X / 32;
    if unit < words {
        let first = base + unit * 32;
        if first < n {
            let mut word = 0u32;
            for k in 0..32u32 {
                word |= bits[(unit * 32 + k) as usize];
            }
            mask[(first / 32) as usize] = word;
        }
    }
    sync_cube();
}

/// Per tensor: `out = fake_quantized(x)` and the clip mask, one unit per element, cubes of
/// `units` (a multiple of 32) consecutive elements.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn fake_quant_masked_kernel(
    x: &Tensor<f32>,
    mult: &[f32],
    step: &[f32],
    zp: &[f32],
    out: &mut [f32],
    mask: &mut [u32],
    n: u32,
    qmin: f32,
    qmax: f32,
    #[comptime] ties_away: bool,
    #[comptime] strided: bool,
    #[comptime] units: usize,
) {
    let mut bits = Shared::<[u32]>::new_slice(units);
    let i = ABSOLUTE_POS;
    let mut clip = false;
    if i < n as usize {
        let v = read(x, i, strided);
        out[i] = fake_quantized(v, mult[0], step[0], zp[0], qmin, qmax, ties_away);
        clip = clipped(v, mult[0], zp[0], qmin, qmax, ties_away);
    }
    let base = (i - UNIT_POS_X as usize) as u32;
    pack_clipped(&mut bits, clip, base, n, mask);
}

/// Zeroes `grad` where the clip mask is set, in place.
#[cube(launch)]
fn masked_backward_kernel(mask: &[u32], grad: &mut [f32]) {
    let i = ABSOLUTE_POS;
    if i < grad.len() && mask_bit(mask, i) {
        grad[i] = 0.0;
    }
}

/// `out = grad` where the clip mask is clear, else 0, `grad` read through its strides.
#[cube(launch)]
fn masked_backward_strided_kernel(mask: &[u32], grad: &Tensor<f32>, out: &mut [f32]) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        out[i] = select(mask_bit(mask, i), 0.0, grad[strided_at(grad, i)]);
    }
}

/// Units of a cube of [`fake_quant_masked_kernel`].
const MASK_UNITS: u32 = 256;

/// Words of the clip mask of `n` elements.
pub(crate) fn mask_words(n: usize) -> usize {
    n.div_ceil(32).max(1)
}

/// A clip mask for `n` elements on `like`'s device, not yet written.
pub(crate) fn empty_mask(like: &CubeTensor, n: usize) -> CubeTensor {
    burn_cubecl::ops::numeric::empty_device_contiguous_dtype(
        like.client.clone(),
        like.device.clone(),
        vec![mask_words(n)].into(),
        burn::tensor::DType::U32,
    )
}

/// Per tensor: `x` fake-quantized on the `[1]` grid, and its clip mask (one launch).
///
/// # Panics
/// If a grid parameter does not hold one value, or `x` exceeds the kernels' u32 indices.
pub(crate) fn fake_quant_masked(
    x: CubeTensor,
    mult: CubeTensor,
    step: CubeTensor,
    zero_point: CubeTensor,
    layout: FusedLayout,
) -> (CubeTensor, CubeTensor) {
    assert_eq!(layout.channels, 1, "{OP}: a clip mask is per tensor");
    let x = f32_strided(x, OP);
    let (mult, step, zp) =
        (f32_contiguous(mult, OP), f32_contiguous(step, OP), f32_contiguous(zero_point, OP));
    index_args(&layout, &[&mult, &step, &zp]);
    let n = x.meta.num_elements();
    let client = x.client.clone();
    let out = empty_like(&x);
    let mask = empty_mask(&x, n);
    let cube_dim = CubeDim::new_1d(MASK_UNITS);
    let cube_count = calculate_cube_count_elemwise(&client, n, cube_dim);
    let strided = !x.is_contiguous();
    fake_quant_masked_kernel::launch(
        &client,
        cube_count,
        cube_dim,
        x.into_tensor_arg(),
        mult.into_buffer_arg(),
        step.into_buffer_arg(),
        zp.into_buffer_arg(),
        out.clone().into_buffer_arg(),
        mask.clone().into_buffer_arg(),
        u32::try_from(n).unwrap_or_else(|_| panic!("{OP}: {n} elements exceed u32")),
        layout.qmin as f32,
        layout.qmax as f32,
        layout.ties_away,
        strided,
        MASK_UNITS as usize,
    );
    (out, mask)
}

/// The straight-through gradient from a clip mask: `grad` where the mask is clear, else 0
/// (in place where `grad` is contiguous and ours to overwrite).
pub(crate) fn masked_backward(mask: CubeTensor, grad: CubeTensor) -> CubeTensor {
    let grad = f32_strided(grad, OP);
    let n = grad.meta.num_elements();
    assert!(mask.meta.num_elements() >= mask_words(n), "{OP}: the clip mask is too short");
    let client = grad.client.clone();
    let (cube_count, cube_dim) = elementwise(&client, n);
    if grad.is_contiguous() && grad.can_mut() {
        masked_backward_kernel::launch(
            &client,
            cube_count,
            cube_dim,
            mask.into_buffer_arg(),
            grad.clone().into_buffer_arg(),
        );
        return grad;
    }
    let out = empty_like(&grad);
    masked_backward_strided_kernel::launch(
        &client,
        cube_count,
        cube_dim,
        mask.into_buffer_arg(),
        grad.into_tensor_arg(),
        out.clone().into_buffer_arg(),
    );
    out
}

/// The kernel's `inner` and `channels` arguments. The grid parameters must hold one value per
/// channel (the dispatching wrapper expands `[1]` ones).
///
/// # Panics
/// If a parameter's length is not `layout.channels`, or a run length exceeds `u32`.
pub(crate) fn index_args(layout: &FusedLayout, params: &[&CubeTensor]) -> (u32, u32) {
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

/// The panics' name for these kernels.
const OP: &str = "fused fake quant";

impl FakeQuantBackend for CubeBackend {
    fn fake_quant_fused(
        x: CubeTensor,
        mult: CubeTensor,
        step: CubeTensor,
        zero_point: CubeTensor,
        layout: FusedLayout,
    ) -> CubeTensor {
        let x = f32_strided(x, OP);
        let (mult, step, zp) =
            (f32_contiguous(mult, OP), f32_contiguous(step, OP), f32_contiguous(zero_point, OP));
        let n = x.meta.num_elements();
        let (inner, channels) = index_args(&layout, &[&mult, &step, &zp]);
        let client = x.client.clone();
        let out = empty_like(&x);
        let (cube_count, cube_dim) = elementwise(&client, n);
        let strided = !x.is_contiguous();
        fake_quant_forward_kernel::launch(
            &client,
            cube_count,
            cube_dim,
            x.into_tensor_arg(),
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
            strided,
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
        let (x, grad) = (f32_strided(x, OP), f32_strided(grad, OP));
        let (mult, zp) = (f32_contiguous(mult, OP), f32_contiguous(zero_point, OP));
        let n = x.meta.num_elements();
        let (inner, channels) = index_args(&layout, &[&mult, &zp]);
        let client = x.client.clone();
        let (cube_count, cube_dim) = elementwise(&client, n);
        let (qmin, qmax) = (layout.qmin as f32, layout.qmax as f32);
        // The upstream gradient is usually contiguous and owned here: mask it in place. Else
        // read both through their strides into a fresh gradient (no copies first).
        if x.is_contiguous() && grad.is_contiguous() && grad.can_mut() {
            fake_quant_backward_kernel::launch(
                &client,
                cube_count,
                cube_dim,
                x.into_buffer_arg(),
                mult.into_buffer_arg(),
                zp.into_buffer_arg(),
                grad.clone().into_buffer_arg(),
                qmin,
                qmax,
                inner,
                channels,
                channels == 1,
                layout.ties_away,
            );
            return grad;
        }
        let out = empty_like(&grad);
        fake_quant_backward_strided_kernel::launch(
            &client,
            cube_count,
            cube_dim,
            x.into_tensor_arg(),
            grad.into_tensor_arg(),
            mult.into_buffer_arg(),
            zp.into_buffer_arg(),
            out.clone().into_buffer_arg(),
            qmin,
            qmax,
            inner,
            channels,
            channels == 1,
            layout.ties_away,
        );
        out
    }
}
