//! Depthwise convolution (`groups = c_in = c_out`, one filter per channel) with its own forward
//! and backward kernels on flex.
//!
//! The separable and dilated candidate ops run one or two depthwise convolutions each, so a
//! DARTS supernet holds hundreds of them. Burn's generic backward treats a grouped convolution
//! as `groups` separate convolutions: the weight gradient is a loop of one `conv2d` and one
//! `slice_assign` per channel, and the input gradient is a transposed convolution made of one
//! rank-1 GEMM and one scatter per (image, channel). Here each (image, channel) plane is one
//! task of the rayon pool, and every kernel is a few loops over contiguous rows:
//!
//! - forward: `y[o] = Σ_t w[t] · x[o·s + t·d − p]` over the taps `t` (per axis);
//! - input gradient: the transpose, `∂x[o·s + t·d − p] += w[t] · ∂y[o]`;
//! - weight gradient: `∂w[t] = Σ_{n, o} ∂y[n, o] · x[n, o·s + t·d − p]`, one partial per plane,
//!   summed over the batch in a fixed order, so the result does not depend on thread timing.
//!
//! Only the summation order differs from Burn's convolution (`tests/depthwise.rs` holds the two
//! together). Other backends, and other dtypes, use Burn's `conv2d` ([`conv2d`] decides).

use burn::backend::AutodiffBackend;
use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, binary};
use burn::backend::{Backend, backend_extension, tensor::FloatTensor};
use burn::tensor::module;
use burn::tensor::ops::ConvOptions;
use burn::tensor::{DType, Device, Tensor};

use crate::lanes::{axpy, dot};

/// The geometry of one depthwise convolution, per axis `[h, w]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DwGeom {
    /// Input plane size.
    pub input: [usize; 2],
    /// Kernel size.
    pub kernel: [usize; 2],
    /// Stride.
    pub stride: [usize; 2],
    /// Zero padding, both sides.
    pub padding: [usize; 2],
    /// Dilation.
    pub dilation: [usize; 2],
}

/// The depthwise convolution primitive: `x` `[N, C, H, W]`, `weight` `[C, 1, kh, kw]`.
#[backend_extension(Flex: cfg(feature = "flex"), Autodiff)]
pub trait DepthwiseBackend: Backend {
    /// The convolution, `[N, C, H', W']`.
    fn depthwise_conv2d(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        geom: DwGeom,
    ) -> FloatTensor<Self>;

    /// The gradient of the input from the output's, `[N, C, H, W]`.
    fn depthwise_conv2d_x_backward(
        grad: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        geom: DwGeom,
    ) -> FloatTensor<Self>;

    /// The gradient of the weight from the input and the output's gradient, `[C, 1, kh, kw]`.
    fn depthwise_conv2d_weight_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        geom: DwGeom,
    ) -> FloatTensor<Self>;
}

/// Whether [`conv2d`] runs this module's kernels for tensors on `device` with this dtype.
pub fn depthwise_available(device: &Device, dtype: DType) -> bool {
    crate::lanes::on_flex_f32(device, dtype)
}

/// Burn's `conv2d` without bias, except that a depthwise convolution (`groups` = input channels
/// = output channels, equal dilation on both axes) runs this module's kernels where
/// [`depthwise_available`].
pub fn conv2d(x: Tensor<4>, weight: Tensor<4>, options: ConvOptions<2>) -> Tensor<4> {
    let [_, c, h, w] = x.dims();
    let [co, ci_g, kh, kw] = weight.dims();
    let depthwise = options.groups == c && co == c && ci_g == 1 && c > 1;
    if !depthwise || !depthwise_available(&x.device(), x.dtype()) {
        return module::conv2d(x, weight, None, options);
    }
    let geom = DwGeom {
        input: [h, w],
        kernel: [kh, kw],
        stride: options.stride,
        padding: options.padding_begin(),
        dilation: options.dilation,
    };
    let out = <burn::backend::Dispatch as DepthwiseBackend>::depthwise_conv2d(
        x.into_dispatch(),
        weight.into_dispatch(),
        geom,
    );
    Tensor::from_dispatch(out)
}

impl<B: Backend + DepthwiseBackend, C: CheckpointStrategy> DepthwiseBackend for Autodiff<B, C> {
    fn depthwise_conv2d(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        geom: DwGeom,
    ) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct DepthwiseStep;

        impl<B: Backend + DepthwiseBackend> Backward<B, 2> for DepthwiseStep {
            type State = (FloatTensor<B>, FloatTensor<B>, DwGeom);

            fn backward(
                self,
                ops: Ops<Self::State, 2>,
                grads: &mut Gradients,
                _checkpointer: &mut Checkpointer,
            ) {
                let (x, weight, geom) = ops.state;
                binary::<B, _, _>(
                    ops.parents,
                    ops.node,
                    grads,
                    |grad| B::depthwise_conv2d_x_backward(grad, weight, geom),
                    |grad| B::depthwise_conv2d_weight_backward(x, grad, geom),
                );
            }
        }

        match DepthwiseStep.prepare::<C>([x.node(), weight.node()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let (xp, wp) = (x.primitive().clone(), weight.primitive().clone());
                let out = B::depthwise_conv2d(xp.clone(), wp.clone(), geom);
                prep.finish((xp, wp, geom), out)
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(B::depthwise_conv2d(x.into_primitive(), weight.into_primitive(), geom))
            }
        }
    }

    fn depthwise_conv2d_x_backward(
        grad: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        geom: DwGeom,
    ) -> FloatTensor<Self> {
        Self::from_inner(B::depthwise_conv2d_x_backward(
            grad.into_primitive(),
            weight.into_primitive(),
            geom,
        ))
    }

    fn depthwise_conv2d_weight_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        geom: DwGeom,
    ) -> FloatTensor<Self> {
        Self::from_inner(B::depthwise_conv2d_weight_backward(
            x.into_primitive(),
            grad.into_primitive(),
            geom,
        ))
    }
}

/// A plane laid out flat with its zero padding, so that every tap of a stride-1 convolution is
/// one contiguous run.
///
/// The padded input is `hp × wp`. The stride-1 output, `oh1 × ow1`, is stored with the padded
/// row length `wp` (columns `ow1..wp` of each row are unused), and its first `len` entries
/// cover it. Tap `(i, j)` of output entry `k` then reads padded entry `k + i·dh·wp + j·dw`, for
/// every `k < len` at once. A strided convolution is the stride-1 one at every `s`-th row and
/// column.
struct Flat {
    g: DwGeom,
    wp: usize,
    hp: usize,
    /// Stride-1 output size.
    oh1: usize,
    ow1: usize,
    /// Entries of the flat stride-1 output (`(oh1 − 1)·wp + ow1`, 0 when empty).
    len: usize,
    /// Offset of each tap, row-major over `(i, j)`.
    offsets: Vec<usize>,
}

impl Flat {
    fn new(g: DwGeom) -> Self {
        let (hp, wp) = (g.input[0] + 2 * g.padding[0], g.input[1] + 2 * g.padding[1]);
        let span = |a: usize| g.dilation[a] * (g.kernel[a] - 1) + 1;
        let (oh1, ow1) = ((hp + 1).saturating_sub(span(0)), (wp + 1).saturating_sub(span(1)));
        let len = if oh1 == 0 || ow1 == 0 { 0 } else { (oh1 - 1) * wp + ow1 };
        let offsets = (0..g.kernel[0])
            .flat_map(|i| (0..g.kernel[1]).map(move |j| (i, j)))
            .map(|(i, j)| i * g.dilation[0] * wp + j * g.dilation[1])
            .collect();
        Flat { g, wp, hp, oh1, ow1, len, offsets }
    }

    /// The strided output's `(rows, cols)`.
    fn output(&self) -> [usize; 2] {
        let [sh, sw] = self.g.stride;
        [
            if self.oh1 == 0 { 0 } else { (self.oh1 - 1) / sh + 1 },
            if self.ow1 == 0 { 0 } else { (self.ow1 - 1) / sw + 1 },
        ]
    }

    /// Writes the input plane `x` `[H, W]` into `xp` (`hp·wp`) with its zero border.
    #[inline(always)]
    fn pad(&self, x: &[f32], xp: &mut [f32]) {
        let ([h, w], [ph, pw]) = (self.g.input, self.g.padding);
        xp.fill(0.0);
        for r in 0..h {
            xp[(r + ph) * self.wp + pw..][..w].copy_from_slice(&x[r * w..][..w]);
        }
    }

    /// Writes the output gradient `dy` `[H', W']` into the flat stride-1 layout `dy1` (`len`),
    /// zero everywhere else (unused columns and the rows and columns a stride skips).
    #[inline(always)]
    fn spread(&self, dy: &[f32], dy1: &mut [f32]) {
        let ([oh, ow], [sh, sw]) = (self.output(), self.g.stride);
        dy1.fill(0.0);
        for r in 0..oh {
            let row = &mut dy1[r * sh * self.wp..];
            for (c, &v) in dy[r * ow..][..ow].iter().enumerate() {
                row[c * sw] = v;
            }
        }
    }

    /// One output plane `y` `[H', W']` from the input plane and the channel's taps `w`.
    #[inline(always)]
    fn forward(&self, x: &[f32], w: &[f32], y: &mut [f32], xp: &mut [f32], acc: &mut [f32]) {
        self.pad(x, xp);
        acc.fill(0.0);
        for (&off, &wv) in self.offsets.iter().zip(w) {
            axpy(acc, wv, &xp[off..off + self.len]);
        }
        let ([oh, ow], [sh, sw]) = (self.output(), self.g.stride);
        for r in 0..oh {
            let row = &acc[r * sh * self.wp..];
            for (c, v) in y[r * ow..][..ow].iter_mut().enumerate() {
                *v = row[c * sw];
            }
        }
    }

    /// One input-gradient plane `dx` `[H, W]` from the output gradient's plane and the taps.
    #[inline(always)]
    fn x_backward(&self, dy: &[f32], w: &[f32], dx: &mut [f32], dy1: &mut [f32], dxp: &mut [f32]) {
        self.spread(dy, dy1);
        dxp.fill(0.0);
        for (&off, &wv) in self.offsets.iter().zip(w) {
            axpy(&mut dxp[off..off + self.len], wv, dy1);
        }
        let ([h, wd], [ph, pw]) = (self.g.input, self.g.padding);
        for r in 0..h {
            dx[r * wd..][..wd].copy_from_slice(&dxp[(r + ph) * self.wp + pw..][..wd]);
        }
    }

    /// One plane's share of the weight gradient, `dw` `[kh·kw]`.
    #[inline(always)]
    fn weight_backward(
        &self,
        x: &[f32],
        dy: &[f32],
        dw: &mut [f32],
        xp: &mut [f32],
        dy1: &mut [f32],
    ) {
        self.pad(x, xp);
        self.spread(dy, dy1);
        for (&off, d) in self.offsets.iter().zip(dw) {
            *d = dot(dy1, &xp[off..off + self.len]);
        }
    }
}

#[cfg(feature = "flex")]
mod flex_impl {
    use super::{DepthwiseBackend, DwGeom, Flat};
    use crate::lanes::flex::{f32s, slice, tensor};

    /// The kernel's name in a dtype panic.
    const KERNEL: &str = "depthwise conv";
    use crate::lanes::planes;
    use burn::backend::flex::{Flex, FlexTensor};

    impl DepthwiseBackend for Flex {
        fn depthwise_conv2d(x: FlexTensor, weight: FlexTensor, g: DwGeom) -> FlexTensor {
            let ((xd, x), (_, w)) = (f32s(&x, KERNEL), f32s(&weight, KERNEL));
            let (xs, ws) = (slice(&x), slice(&w));
            let f = Flat::new(g);
            let (c, [h, wd], [oh, ow]) = (xd[1], g.input, f.output());
            let taps = f.offsets.len();
            let mut out = vec![0.0f32; xd[0] * c * oh * ow];
            planes(&mut out, oh * ow, [f.hp * f.wp, f.len], |p, y, xp, acc| {
                let ch = p % c;
                f.forward(&xs[p * h * wd..][..h * wd], &ws[ch * taps..][..taps], y, xp, acc);
            });
            tensor(out, vec![xd[0], c, oh, ow])
        }

        fn depthwise_conv2d_x_backward(
            grad: FlexTensor,
            weight: FlexTensor,
            g: DwGeom,
        ) -> FlexTensor {
            let ((gd, gy), (_, w)) = (f32s(&grad, KERNEL), f32s(&weight, KERNEL));
            let (gs, ws) = (slice(&gy), slice(&w));
            let f = Flat::new(g);
            let (c, [h, wd], [oh, ow]) = (gd[1], g.input, f.output());
            let taps = f.offsets.len();
            let mut out = vec![0.0f32; gd[0] * c * h * wd];
            planes(&mut out, h * wd, [f.len, f.hp * f.wp], |p, dx, dy1, dxp| {
                let ch = p % c;
                f.x_backward(&gs[p * oh * ow..][..oh * ow], &ws[ch * taps..][..taps], dx, dy1, dxp);
            });
            tensor(out, vec![gd[0], c, h, wd])
        }

        fn depthwise_conv2d_weight_backward(
            x: FlexTensor,
            grad: FlexTensor,
            g: DwGeom,
        ) -> FlexTensor {
            let ((xd, x), (_, gy)) = (f32s(&x, KERNEL), f32s(&grad, KERNEL));
            let (xs, gs) = (slice(&x), slice(&gy));
            let f = Flat::new(g);
            let (n, c, [h, wd], [oh, ow]) = (xd[0], xd[1], g.input, f.output());
            let taps = f.offsets.len();
            // One partial per plane, then a sum over the batch in a fixed order.
            let mut parts = vec![0.0f32; n * c * taps];
            planes(&mut parts, taps, [f.hp * f.wp, f.len], |p, dw, xp, dy1| {
                let (xs, gs) = (&xs[p * h * wd..][..h * wd], &gs[p * oh * ow..][..oh * ow]);
                f.weight_backward(xs, gs, dw, xp, dy1);
            });
            let mut out = vec![0.0f32; c * taps];
            for part in parts.chunks_exact(c * taps) {
                for (o, &v) in out.iter_mut().zip(part) {
                    *o += v;
                }
            }
            tensor(out, vec![c, 1, g.kernel[0], g.kernel[1]])
        }
    }
}
