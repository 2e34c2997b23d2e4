//! BatchNorm's statistics and affine map on flex: sums per plane in eight f32 lanes, combined over
//! the batch in f64 in a fixed order.

use burn::backend::flex::{Flex, FlexTensor};

use super::ChannelBackend;
use crate::support::flex::{f32s, slice, tensor};

/// The kernel's name in a dtype panic.
const KERNEL: &str = "channel op";
use crate::support::lanes::{centered_squares, dot_and_sum, planes, sum};

/// `[N, C, H, W]` as (channels, plane size, elements per channel).
fn geometry(dims: &[usize]) -> (usize, usize, usize) {
    let plane: usize = dims[2..].iter().product();
    (dims[1], plane, dims[0] * plane)
}

/// Per-plane values (`parts`, `[N·C]` then reduced) summed over the batch per channel, in
/// f64, image by image.
fn per_channel(parts: &[f32], c: usize) -> Vec<f64> {
    let mut out = vec![0.0f64; c];
    for image in parts.chunks_exact(c) {
        for (o, &v) in out.iter_mut().zip(image) {
            *o += f64::from(v);
        }
    }
    out
}

/// `f(p, plane)` for every plane `p` of `xs` (`plane` long), in parallel: one value each.
fn per_plane(xs: &[f32], plane: usize, f: impl Fn(usize, &[f32]) -> f32 + Sync) -> Vec<f32> {
    planes(
        xs.len() / plane.max(1),
        1,
        [],
        #[inline(always)]
        |p, out, _| out[0] = f(p, &xs[p * plane..][..plane]),
    )
}

/// `xs·w_c (+ b_c)` over `[N, C, H, W]` `dims`.
fn scale_shift(xs: &[f32], dims: Vec<usize>, ws: &[f32], bs: Option<&[f32]>) -> FlexTensor {
    let (c, plane, _) = geometry(&dims);
    let out = planes(
        xs.len() / plane.max(1),
        plane,
        [],
        #[inline(always)]
        |p, y, _| {
            let (wv, src) = (ws[p % c], &xs[p * plane..][..plane]);
            match bs {
                Some(bs) => {
                    let bv = bs[p % c];
                    for (o, &v) in y.iter_mut().zip(src) {
                        *o = v * wv + bv;
                    }
                }
                None => {
                    for (o, &v) in y.iter_mut().zip(src) {
                        *o = v * wv;
                    }
                }
            }
        },
    );
    tensor(out, dims)
}

impl ChannelBackend for Flex {
    fn channel_moments(x: FlexTensor) -> FlexTensor {
        let (xd, x) = f32s(&x, KERNEL);
        let xs = slice(&x);
        let (c, plane, count) = geometry(&xd);
        let count = count as f64;
        let means: Vec<f64> = per_channel(
            &per_plane(
                xs,
                plane,
                #[inline(always)]
                |_, v| sum(v),
            ),
            c,
        )
        .into_iter()
        .map(|s| s / count)
        .collect();
        let mean32: Vec<f32> = means.iter().map(|&m| m as f32).collect();
        let squares = per_plane(
            xs,
            plane,
            #[inline(always)]
            |p, v| centered_squares(v, mean32[p % c]),
        );
        let vars = per_channel(&squares, c).into_iter().map(|s| s / count);
        let out = mean32.iter().copied().chain(vars.map(|v| v as f32)).collect();
        tensor(out, vec![2, c])
    }

    fn channel_moments_backward(
        x: FlexTensor,
        moments: FlexTensor,
        grad: FlexTensor,
    ) -> FlexTensor {
        let ((xd, x), (_, m), (_, g)) =
            (f32s(&x, KERNEL), f32s(&moments, KERNEL), f32s(&grad, KERNEL));
        let (xs, ms, gs) = (slice(&x), slice(&m), slice(&g));
        let (c, plane, count) = geometry(&xd);
        let count = count as f32;
        // ∂x = a + b·(x − μ), a = ∂μ/M, b = 2∂σ²/M.
        let ab: Vec<(f32, f32, f32)> =
            (0..c).map(|ch| (gs[ch] / count, 2.0 * gs[c + ch] / count, ms[ch])).collect();
        let out = planes(
            xs.len() / plane.max(1),
            plane,
            [],
            #[inline(always)]
            |p, dx, _| {
                let (a, b, mean) = ab[p % c];
                for (d, &v) in dx.iter_mut().zip(&xs[p * plane..][..plane]) {
                    *d = a + b * (v - mean);
                }
            },
        );
        tensor(out, xd)
    }

    fn channel_affine(x: FlexTensor, w: FlexTensor, b: FlexTensor) -> FlexTensor {
        let ((xd, x), (_, w), (_, b)) = (f32s(&x, KERNEL), f32s(&w, KERNEL), f32s(&b, KERNEL));
        scale_shift(slice(&x), xd, slice(&w), Some(slice(&b)))
    }

    fn channel_affine_x_backward(grad: FlexTensor, w: FlexTensor) -> FlexTensor {
        let ((gd, g), (_, w)) = (f32s(&grad, KERNEL), f32s(&w, KERNEL));
        scale_shift(slice(&g), gd, slice(&w), None)
    }

    fn channel_affine_wb_backward(x: FlexTensor, grad: FlexTensor) -> FlexTensor {
        let ((xd, x), (_, g)) = (f32s(&x, KERNEL), f32s(&grad, KERNEL));
        let (xs, gs) = (slice(&x), slice(&g));
        let (c, plane, _) = geometry(&xd);
        // `[Σ ∂y·x, Σ ∂y]` of each plane in one pass over it.
        let parts = planes(
            gs.len() / plane.max(1),
            2,
            [],
            #[inline(always)]
            |p, out, _| {
                let at = p * plane;
                out.copy_from_slice(&dot_and_sum(&gs[at..][..plane], &xs[at..][..plane]));
            },
        );
        let (dw, db): (Vec<f32>, Vec<f32>) = parts.chunks_exact(2).map(|p| (p[0], p[1])).unzip();
        let out = per_channel(&dw, c).into_iter().chain(per_channel(&db, c));
        tensor(out.map(|v| v as f32).collect(), vec![2, c])
    }
}
