//! The pools on flex: one rayon task per (image, channel) plane.

use burn::backend::flex::{Flex, FlexTensor};

use super::{Flat, PlaneGeom, PoolBackend, Rounding};
use crate::support::flex::{f32s, slice, tensor};
use crate::support::lanes::planes;

/// The kernel's name in a dtype panic.
const KERNEL: &str = "pooling";

impl PoolBackend for Flex {
    fn pool_max2d(x: FlexTensor, g: PlaneGeom) -> FlexTensor {
        let (xd, x) = f32s(&x, KERNEL);
        let xs = slice(&x);
        let f = Flat::new(g);
        let ([h, w], [oh, ow]) = (g.input, f.output());
        let out = planes(
            xd[0] * xd[1],
            oh * ow,
            [f.padded(), f.padded(), f.len],
            #[inline(always)]
            |p, y, s| {
                f.max_forward(&xs[p * h * w..][..h * w], y, s);
            },
        );
        tensor(out, vec![xd[0], xd[1], oh, ow])
    }

    fn pool_max2d_backward(x: FlexTensor, grad: FlexTensor, g: PlaneGeom) -> FlexTensor {
        let ((xd, x), (_, gy)) = (f32s(&x, KERNEL), f32s(&grad, KERNEL));
        let (xs, gs) = (slice(&x), slice(&gy));
        let f = Flat::new(g);
        let ([h, w], [oh, ow]) = (g.input, f.output());
        let (pad, len) = (f.padded(), f.len);
        let out = planes(
            xd[0] * xd[1],
            h * w,
            [pad, pad, len, len, pad],
            #[inline(always)]
            |p, dx, s| {
                f.max_backward(&xs[p * h * w..][..h * w], &gs[p * oh * ow..][..oh * ow], dx, s);
            },
        );
        tensor(out, xd)
    }

    fn pool_avg2d(x: FlexTensor, g: PlaneGeom, include_pad: bool) -> FlexTensor {
        let (xd, x) = f32s(&x, KERNEL);
        let xs = slice(&x);
        let f = Flat::new(g);
        let ([h, w], [oh, ow]) = (g.input, f.output());
        let counts = f.counts(include_pad);
        let out = planes(
            xd[0] * xd[1],
            oh * ow,
            [f.padded(), f.padded(), f.len],
            #[inline(always)]
            |p, y, [xp, tmp, acc]| {
                let s = [xp.as_mut_slice(), tmp.as_mut_slice(), acc.as_mut_slice()];
                f.avg_forward(&xs[p * h * w..][..h * w], y, &counts, s);
            },
        );
        tensor(out, vec![xd[0], xd[1], oh, ow])
    }

    fn pool_avg2d_backward(grad: FlexTensor, g: PlaneGeom, include_pad: bool) -> FlexTensor {
        let (gd, gy) = f32s(&grad, KERNEL);
        let gs = slice(&gy);
        let f = Flat::new(g);
        let ([h, w], [oh, ow]) = (g.input, f.output());
        let counts = f.counts(include_pad);
        let out = planes(
            gd[0] * gd[1],
            h * w,
            [f.len, f.padded(), f.padded()],
            #[inline(always)]
            |p, dx, s| {
                f.avg_backward(&gs[p * oh * ow..][..oh * ow], dx, &counts, s);
            },
        );
        tensor(out, vec![gd[0], gd[1], h, w])
    }

    fn pool_avg2d_rounded(
        x: FlexTensor,
        mult: FlexTensor,
        step: FlexTensor,
        g: PlaneGeom,
        r: Rounding,
    ) -> FlexTensor {
        let ((xd, x), (_, mult), (_, step)) =
            (f32s(&x, KERNEL), f32s(&mult, KERNEL), f32s(&step, KERNEL));
        let (xs, ms, ss) = (slice(&x), slice(&mult), slice(&step));
        let f = Flat::new(g);
        let ([h, w], [oh, ow]) = (g.input, f.output());
        let counts = f.counts(r.include_pad);
        let round = |v: f32| if r.ties_away { v.round() } else { v.round_ties_even() };
        let pad = f.padded();
        let out = planes(
            xd[0] * xd[1],
            oh * ow,
            [pad, pad, f.len, h * w, oh * ow],
            #[inline(always)]
            |p, y, [xp, tmp, acc, q, qa]| {
                // Per channel: planes are (image, channel) in order.
                let ch = if ms.len() == 1 { 0 } else { p % xd[1] };
                let (m, st) = (ms[ch], ss[ch]);
                let x = &xs[p * h * w..][..h * w];
                for (q, &v) in q.iter_mut().zip(x) {
                    *q = round(v * m);
                }
                f.avg_forward(q, qa, &counts, [&mut xp[..], &mut tmp[..], &mut acc[..]]);
                f.avg_forward(x, y, &counts, [&mut xp[..], &mut tmp[..], &mut acc[..]]);
                // The expressions' value: avg + (qa·step − avg).
                for (y, &qa) in y.iter_mut().zip(&*qa) {
                    *y += round(qa) * st - *y;
                }
            },
        );
        tensor(out, vec![xd[0], xd[1], oh, ow])
    }
}
