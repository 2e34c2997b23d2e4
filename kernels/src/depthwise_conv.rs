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
//! Only the summation order differs from Burn's convolution (`tests/depthwise_conv.rs` holds the two
//! together). Other convolutions go to [`crate::pointwise_conv::conv2d`] (a 1×1 convolution is a
//! matrix product there, anything else Burn's `conv2d`), as do other backends and dtypes
//! ([`conv2d`] decides).

use burn::backend::AutodiffBackend;
use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, binary};
use burn::backend::{Backend, backend_extension, tensor::FloatTensor};
use burn::tensor::ops::ConvOptions;
use burn::tensor::{DType, Device, Tensor};

use crate::lanes::{correlate, dots};
use crate::plane::Flat;
pub use crate::plane::PlaneGeom;

/// The depthwise convolution primitive: `x` `[N, C, H, W]`, `weight` `[C, 1, kh, kw]`.
#[backend_extension(Flex: cfg(feature = "flex"), Autodiff)]
pub trait DepthwiseBackend: Backend {
    /// The convolution, `[N, C, H', W']`.
    fn depthwise_conv2d(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        geom: PlaneGeom,
    ) -> FloatTensor<Self>;

    /// The gradient of the input from the output's, `[N, C, H, W]`.
    fn depthwise_conv2d_x_backward(
        grad: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        geom: PlaneGeom,
    ) -> FloatTensor<Self>;

    /// The gradient of the weight from the input and the output's gradient, `[C, 1, kh, kw]`.
    fn depthwise_conv2d_weight_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        geom: PlaneGeom,
    ) -> FloatTensor<Self>;
}

/// Whether [`conv2d`] runs this module's kernels for tensors on `device` with this dtype.
pub fn depthwise_available(device: &Device, dtype: DType) -> bool {
    crate::lanes::on_flex_f32(device, dtype)
}

/// Burn's `conv2d` without bias, except that a depthwise convolution (`groups` = input channels
/// = output channels) runs this module's kernels where [`depthwise_available`], and a 1×1 one
/// is a matrix product ([`crate::pointwise_conv::conv2d`]).
pub fn conv2d(x: Tensor<4>, weight: Tensor<4>, options: ConvOptions<2>) -> Tensor<4> {
    let [_, c, h, w] = x.dims();
    let [co, ci_g, kh, kw] = weight.dims();
    let depthwise = options.groups == c && co == c && ci_g == 1 && c > 1;
    if !depthwise || !depthwise_available(&x.device(), x.dtype()) {
        return crate::pointwise_conv::conv2d(x, weight, options);
    }
    let geom = PlaneGeom {
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
        geom: PlaneGeom,
    ) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct DepthwiseStep;

        impl<B: Backend + DepthwiseBackend> Backward<B, 2> for DepthwiseStep {
            type State = (FloatTensor<B>, FloatTensor<B>, PlaneGeom);

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
        geom: PlaneGeom,
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
        geom: PlaneGeom,
    ) -> FloatTensor<Self> {
        Self::from_inner(B::depthwise_conv2d_weight_backward(
            x.into_primitive(),
            grad.into_primitive(),
            geom,
        ))
    }
}

impl Flat {
    /// The largest tap offset: the zero margin the input gradient's scratch needs on each side.
    fn reach(&self) -> usize {
        self.offsets.last().copied().unwrap_or(0)
    }

    /// `(offset, weight)` of every tap of every channel, channel after channel, from the
    /// weights `[C·kh·kw]`: the forward's [`correlate`] taps.
    fn forward_taps(&self, w: &[f32]) -> Vec<(usize, f32)> {
        let offsets = self.offsets.iter().cycle();
        offsets.zip(w).map(|(&off, &wv)| (off, wv)).collect()
    }

    /// The input gradient's taps: `∂x_p[j] = Σ_t w_t · ∂y1[j − off_t]` read as a correlation
    /// over the interior `j ≥ j0` of the padded plane and the flat output gradient behind a
    /// zero margin of [`Flat::reach`] entries.
    fn backward_taps(&self, w: &[f32]) -> Vec<(usize, f32)> {
        let base = self.interior().start + self.reach();
        let offsets = self.offsets.iter().cycle();
        offsets.zip(w).map(|(&off, &wv)| (base - off, wv)).collect()
    }

    /// The span of the padded plane that holds the input, first row to last.
    fn interior(&self) -> std::ops::Range<usize> {
        let ([h, w], [ph, pw]) = (self.g.input, self.g.padding);
        let start = ph * self.wp + pw;
        start..if h == 0 { start } else { (ph + h - 1) * self.wp + pw + w }
    }

    /// One output plane `y` `[H', W']` from the input plane and the channel's `taps`
    /// ([`Flat::forward_taps`]).
    #[inline(always)]
    fn forward(
        &self,
        x: &[f32],
        taps: &[(usize, f32)],
        y: &mut [f32],
        xp: &mut [f32],
        acc: &mut [f32],
    ) {
        self.pad(x, xp);
        correlate(&mut acc[..self.len], xp, taps);
        self.gather_with(acc, y, |_, _, v| v);
    }

    /// One input-gradient plane `dx` `[H, W]` from the output gradient's plane and the
    /// channel's `taps` ([`Flat::backward_taps`]); `dy1` holds the flat output gradient behind
    /// and before a zero margin ([`Flat::reach`] entries each).
    #[inline(always)]
    fn x_backward(
        &self,
        dy: &[f32],
        taps: &[(usize, f32)],
        dx: &mut [f32],
        dy1: &mut [f32],
        dxp: &mut [f32],
    ) {
        if self.len == 0 {
            dx.fill(0.0);
            return;
        }
        let m = self.reach();
        dy1[..m].fill(0.0);
        dy1[m + self.len..].fill(0.0);
        self.spread(dy, &mut dy1[m..m + self.len]);
        correlate(&mut dxp[self.interior()], dy1, taps);
        self.unpad(dxp, dx);
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
        dots(dy1, xp, &self.offsets, dw);
    }
}

#[cfg(feature = "flex")]
mod flex_impl {
    use super::{DepthwiseBackend, Flat, PlaneGeom};
    use crate::lanes::flex::{f32s, slice, tensor};

    /// The kernel's name in a dtype panic.
    const KERNEL: &str = "depthwise conv";
    use crate::lanes::planes;
    use burn::backend::flex::{Flex, FlexTensor};

    impl DepthwiseBackend for Flex {
        fn depthwise_conv2d(x: FlexTensor, weight: FlexTensor, g: PlaneGeom) -> FlexTensor {
            let ((xd, x), (_, w)) = (f32s(&x, KERNEL), f32s(&weight, KERNEL));
            let (xs, ws) = (slice(&x), slice(&w));
            let f = Flat::new(g);
            let (c, [h, wd], [oh, ow]) = (xd[1], g.input, f.output());
            let (taps, all) = (f.offsets.len(), f.forward_taps(ws));
            let out = planes(
                xd[0] * c,
                oh * ow,
                [f.padded(), f.len],
                #[inline(always)]
                |p, y, [xp, acc]| {
                    let ch = p % c;
                    f.forward(&xs[p * h * wd..][..h * wd], &all[ch * taps..][..taps], y, xp, acc);
                },
            );
            tensor(out, vec![xd[0], c, oh, ow])
        }

        fn depthwise_conv2d_x_backward(
            grad: FlexTensor,
            weight: FlexTensor,
            g: PlaneGeom,
        ) -> FlexTensor {
            let ((gd, gy), (_, w)) = (f32s(&grad, KERNEL), f32s(&weight, KERNEL));
            let (gs, ws) = (slice(&gy), slice(&w));
            let f = Flat::new(g);
            let (c, [h, wd], [oh, ow]) = (gd[1], g.input, f.output());
            let (taps, all) = (f.offsets.len(), f.backward_taps(ws));
            let dy1 = f.len + 2 * f.reach();
            let out = planes(
                gd[0] * c,
                h * wd,
                [dy1, f.padded()],
                #[inline(always)]
                |p, dx, [dy1, dxp]| {
                    let ch = p % c;
                    f.x_backward(
                        &gs[p * oh * ow..][..oh * ow],
                        &all[ch * taps..][..taps],
                        dx,
                        dy1,
                        dxp,
                    );
                },
            );
            tensor(out, vec![gd[0], c, h, wd])
        }

        fn depthwise_conv2d_weight_backward(
            x: FlexTensor,
            grad: FlexTensor,
            g: PlaneGeom,
        ) -> FlexTensor {
            let ((xd, x), (_, gy)) = (f32s(&x, KERNEL), f32s(&grad, KERNEL));
            let (xs, gs) = (slice(&x), slice(&gy));
            let f = Flat::new(g);
            let (n, c, [h, wd], [oh, ow]) = (xd[0], xd[1], g.input, f.output());
            let taps = f.offsets.len();
            // One partial per plane, then a sum over the batch in a fixed order.
            let parts = planes(
                n * c,
                taps,
                [f.padded(), f.len],
                #[inline(always)]
                |p, dw, [xp, dy1]| {
                    let (xs, gs) = (&xs[p * h * wd..][..h * wd], &gs[p * oh * ow..][..oh * ow]);
                    f.weight_backward(xs, gs, dw, xp, dy1);
                },
            );
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
