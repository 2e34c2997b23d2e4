//! The depthwise convolution on flex: one rayon task per (image, channel) plane.

use super::cpu::{Phases, PlaneConv};
use super::{DepthwiseBackend, Flat, PlaneGeom};
use crate::support::flex::{f32s, slice, tensor};
use crate::support::lanes::{planes, planes_to};
use burn::backend::flex::{Flex, FlexTensor};

/// The kernel's name in a dtype panic.
const KERNEL: &str = "depthwise conv";

/// `run` with the layout for `g`'s stride: [`Flat`] for stride 1, else [`Phases`].
fn with_layout<R>(g: PlaneGeom, run: impl FnOnce(&dyn Layout) -> R) -> R {
    if g.stride == [1, 1] { run(&Flat::new(g)) } else { run(&Phases::new(g)) }
}

/// [`PlaneConv`] behind a reference, so one generic body serves both layouts.
trait Layout {
    fn forward(&self, xs: &[f32], ws: &[f32], n: usize, c: usize) -> Vec<f32>;
    fn x_backward(&self, gs: &[f32], ws: &[f32], n: usize, c: usize) -> Vec<f32>;
    fn backward(&self, xs: &[f32], gs: &[f32], ws: &[f32], n: usize, c: usize) -> [Vec<f32>; 2];
}

impl<P: PlaneConv> Layout for P {
    fn forward(&self, xs: &[f32], ws: &[f32], n: usize, c: usize) -> Vec<f32> {
        let f = self.flat();
        let ([h, wd], [oh, ow]) = (f.g.input, f.output());
        let (taps, all) = (f.offsets.len(), self.forward_taps(ws));
        planes(
            n * c,
            oh * ow,
            self.forward_scratch(),
            #[inline(always)]
            |p, y, scratch| {
                let ch = p % c;
                let x = &xs[p * h * wd..][..h * wd];
                PlaneConv::forward(self, x, &all[ch * taps..][..taps], y, scratch);
            },
        )
    }

    fn x_backward(&self, gs: &[f32], ws: &[f32], n: usize, c: usize) -> Vec<f32> {
        let f = self.flat();
        let ([h, wd], [oh, ow]) = (f.g.input, f.output());
        let (taps, all) = (f.offsets.len(), self.backward_taps(ws));
        planes(
            n * c,
            h * wd,
            self.x_scratch(),
            #[inline(always)]
            |p, dx, scratch| {
                let ch = p % c;
                let dy = &gs[p * oh * ow..][..oh * ow];
                PlaneConv::x_backward(self, dy, &all[ch * taps..][..taps], dx, scratch);
            },
        )
    }

    fn backward(&self, xs: &[f32], gs: &[f32], ws: &[f32], n: usize, c: usize) -> [Vec<f32>; 2] {
        let f = self.flat();
        let ([h, wd], [oh, ow]) = (f.g.input, f.output());
        let (taps, all) = (f.offsets.len(), self.backward_taps(ws));
        planes_to(
            n * c,
            [h * wd, taps],
            self.backward_scratch(),
            #[inline(always)]
            |p, dst, scratch| {
                let (xs, gs) = (&xs[p * h * wd..][..h * wd], &gs[p * oh * ow..][..oh * ow]);
                let ch = p % c;
                PlaneConv::backward(self, [xs, gs], &all[ch * taps..][..taps], dst, scratch);
            },
        )
    }
}

impl DepthwiseBackend for Flex {
    fn depthwise_conv2d(x: FlexTensor, weight: FlexTensor, g: PlaneGeom) -> FlexTensor {
        let ((xd, x), (_, w)) = (f32s(&x, KERNEL), f32s(&weight, KERNEL));
        let (xs, ws) = (slice(&x), slice(&w));
        let [oh, ow] = Flat::new(g).output();
        let out = with_layout(g, |l| l.forward(xs, ws, xd[0], xd[1]));
        tensor(out, vec![xd[0], xd[1], oh, ow])
    }

    fn depthwise_conv2d_x_backward(
        grad: FlexTensor,
        weight: FlexTensor,
        g: PlaneGeom,
    ) -> FlexTensor {
        let ((gd, gy), (_, w)) = (f32s(&grad, KERNEL), f32s(&weight, KERNEL));
        let (gs, ws) = (slice(&gy), slice(&w));
        let out = with_layout(g, |l| l.x_backward(gs, ws, gd[0], gd[1]));
        tensor(out, vec![gd[0], gd[1], g.input[0], g.input[1]])
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
        weight_sum(&parts, c, g)
    }

    fn depthwise_conv2d_backward(
        x: FlexTensor,
        grad: FlexTensor,
        weight: FlexTensor,
        g: PlaneGeom,
    ) -> (FlexTensor, FlexTensor) {
        let ((xd, x), (_, gy), (_, w)) =
            (f32s(&x, KERNEL), f32s(&grad, KERNEL), f32s(&weight, KERNEL));
        let (xs, gs, ws) = (slice(&x), slice(&gy), slice(&w));
        let [dx, parts] = with_layout(g, |l| l.backward(xs, gs, ws, xd[0], xd[1]));
        (tensor(dx, xd.clone()), weight_sum(&parts, xd[1], g))
    }
}

/// The weight gradient `[C, 1, kh, kw]` from one partial per plane, summed over the batch
/// image by image.
fn weight_sum(parts: &[f32], c: usize, g: PlaneGeom) -> FlexTensor {
    let taps = g.kernel[0] * g.kernel[1];
    let mut out = vec![0.0f32; c * taps];
    for part in parts.chunks_exact(c * taps) {
        for (o, &v) in out.iter_mut().zip(part) {
            *o += v;
        }
    }
    tensor(out, vec![c, 1, g.kernel[0], g.kernel[1]])
}
