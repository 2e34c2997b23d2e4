//! Per-channel batch statistics and the per-channel affine map: the two halves of a training
//! BatchNorm, each one pass forward and one backward on flex.
//!
//! `qdarts_ops::candidates::QBatchNorm` fake-quantizes its folded weight between
//! them, so they stay two primitives:
//!
//! - [`moments`]: `[mean, biased variance]` of every channel of `[N, C, H, W]`, as `[2, C]`.
//!   Backward: `∂x = ∂μ/M + ∂σ²·2(x − μ)/M` with `M = N·H·W`.
//! - [`affine`]: `y = x·w_c + b_c`. Backward: `∂x = ∂y·w_c`, `∂w_c = Σ ∂y·x`, `∂b_c = Σ ∂y`.
//!
//! As tensor expressions these are a dozen passes over the activation forward and backward
//! (transposed copy, mean, centring, square, broadcasts, and their gradients). On flex, sums run
//! per (image, channel) plane in eight f32 lanes and are combined over the batch in f64 in a
//! fixed order, so the result does not depend on thread timing. On the CubeCL backends (`cube`
//! submodule) each elementwise part is one kernel and each per-channel sum one cube of threads
//! per channel: one default-shape search step went from 60 059 launches to 45 039 on Mesa's
//! lavapipe, 24 fewer per BatchNorm (forward and backward). LibTorch and other dtypes use the
//! tensor expressions ([`channel_available`] decides); `tests/batch_norm.rs` holds the two
//! together on every backend of the build.

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn::backend::{AutodiffBackend, TensorMetadata};
use burn::backend::{Backend, backend_extension, tensor::FloatTensor};
use burn::tensor::{DType, Device, Tensor};

use crate::reduce::row_mean;

/// The per-channel primitives (see the module docs).
#[backend_extension(Flex: cfg(feature = "flex"), Cube: cfg(feature = "cube"), Autodiff)]
pub trait ChannelBackend: Backend {
    /// `[mean, biased variance]` per channel of `x` `[N, C, H, W]`: `[2, C]`.
    fn channel_moments(x: FloatTensor<Self>) -> FloatTensor<Self>;

    /// `∂x` from `x`, its moments and their gradient `[2, C]`.
    fn channel_moments_backward(
        x: FloatTensor<Self>,
        moments: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> FloatTensor<Self>;

    /// `x·w_c + b_c` with `w`, `b` `[C]`.
    fn channel_affine(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        b: FloatTensor<Self>,
    ) -> FloatTensor<Self>;

    /// `∂x = ∂y·w_c`.
    fn channel_affine_x_backward(
        grad: FloatTensor<Self>,
        w: FloatTensor<Self>,
    ) -> FloatTensor<Self>;

    /// `[Σ ∂y·x, Σ ∂y]` per channel: `[2, C]`.
    fn channel_affine_wb_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> FloatTensor<Self>;
}

/// Whether [`moments`] and [`affine`] run this module's kernels for tensors on `device` with
/// this dtype.
pub fn channel_available(device: &Device, dtype: DType) -> bool {
    crate::lanes::on_flex_f32(device, dtype)
        || (crate::lanes::on_cube(device) && dtype == DType::F32)
}

/// `(mean, biased variance)` per channel of `x` `[N, C, H, W]`, each `[C]`.
pub fn moments(x: Tensor<4>) -> (Tensor<1>, Tensor<1>) {
    let c = x.dims()[1];
    let m = if channel_available(&x.device(), x.dtype()) {
        Tensor::<2>::from_dispatch(<burn::backend::Dispatch as ChannelBackend>::channel_moments(
            x.into_dispatch(),
        ))
    } else {
        let [n, c, h, w] = x.dims();
        let rows = x.swap_dims(0, 1).reshape([c, n * h * w]);
        let mean = row_mean(rows.clone()).reshape([c, 1]);
        let var = row_mean(rows.sub(mean.clone()).square());
        Tensor::cat(vec![mean.reshape([1, c]), var.reshape([1, c])], 0)
    };
    (m.clone().slice([0..1, 0..c]).reshape([c]), m.slice([1..2, 0..c]).reshape([c]))
}

/// `x·w_c + b_c` for `x` `[N, C, H, W]` and `w`, `b` `[C]`.
pub fn affine(x: Tensor<4>, w: Tensor<1>, b: Tensor<1>) -> Tensor<4> {
    if channel_available(&x.device(), x.dtype()) {
        Tensor::from_dispatch(<burn::backend::Dispatch as ChannelBackend>::channel_affine(
            x.into_dispatch(),
            w.into_dispatch(),
            b.into_dispatch(),
        ))
    } else {
        let c = x.dims()[1];
        x.mul(w.reshape([1, c, 1, 1])).add(b.reshape([1, c, 1, 1]))
    }
}

impl<B: Backend + ChannelBackend, C: CheckpointStrategy> ChannelBackend for Autodiff<B, C> {
    fn channel_moments(x: FloatTensor<Self>) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct MomentsStep;

        impl<B: Backend + ChannelBackend> Backward<B, 1> for MomentsStep {
            type State = (FloatTensor<B>, FloatTensor<B>);

            fn backward(
                self,
                ops: Ops<Self::State, 1>,
                grads: &mut Gradients,
                _checkpointer: &mut Checkpointer,
            ) {
                let (x, m) = ops.state;
                unary::<B, _>(ops.parents, ops.node, grads, |grad| {
                    B::channel_moments_backward(x, m, grad)
                });
            }
        }

        match MomentsStep.prepare::<C>([x.node()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let xp = x.primitive().clone();
                let m = B::channel_moments(xp.clone());
                prep.finish((xp, m.clone()), m)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::channel_moments(x.into_primitive())),
        }
    }

    fn channel_moments_backward(
        x: FloatTensor<Self>,
        moments: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        Self::from_inner(B::channel_moments_backward(
            x.into_primitive(),
            moments.into_primitive(),
            grad.into_primitive(),
        ))
    }

    fn channel_affine(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        b: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct AffineStep;

        impl<B: Backend + ChannelBackend> Backward<B, 3> for AffineStep {
            /// `x`, `w` and the number of channels.
            type State = (FloatTensor<B>, FloatTensor<B>, usize);

            fn backward(
                self,
                ops: Ops<Self::State, 3>,
                grads: &mut Gradients,
                _checkpointer: &mut Checkpointer,
            ) {
                let [node_x, node_w, node_b] = ops.parents;
                let grad = grads.consume::<B>(&ops.node);
                let (x, w, c) = ops.state;
                if node_w.is_some() || node_b.is_some() {
                    let wb = B::channel_affine_wb_backward(x, grad.clone());
                    let row = |r: usize| {
                        let t = B::float_slice(wb.clone(), &[(r..r + 1).into(), (0..c).into()]);
                        B::float_reshape(t, [c].into())
                    };
                    if let Some(node) = node_w {
                        grads.register::<B>(node.id, row(0));
                    }
                    if let Some(node) = node_b {
                        grads.register::<B>(node.id, row(1));
                    }
                }
                if let Some(node) = node_x {
                    grads.register::<B>(node.id, B::channel_affine_x_backward(grad, w));
                }
            }
        }

        let c = x.primitive().shape()[1];
        let prep = AffineStep.prepare::<C>([x.node(), w.node(), b.node()]);
        match prep.compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let (xp, wp) = (x.primitive().clone(), w.primitive().clone());
                let out = B::channel_affine(xp.clone(), wp.clone(), b.into_primitive());
                prep.finish((xp, wp, c), out)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::channel_affine(
                x.into_primitive(),
                w.into_primitive(),
                b.into_primitive(),
            )),
        }
    }

    fn channel_affine_x_backward(
        grad: FloatTensor<Self>,
        w: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        Self::from_inner(B::channel_affine_x_backward(grad.into_primitive(), w.into_primitive()))
    }

    fn channel_affine_wb_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        Self::from_inner(B::channel_affine_wb_backward(x.into_primitive(), grad.into_primitive()))
    }
}

#[cfg(feature = "cube")]
mod cube;

#[cfg(feature = "flex")]
mod flex_impl {
    use burn::backend::flex::{Flex, FlexTensor};

    use super::ChannelBackend;
    use crate::lanes::flex::{f32s, slice, tensor};

    /// The kernel's name in a dtype panic.
    const KERNEL: &str = "channel op";
    use crate::lanes::{centered_squares, dot_and_sum, planes, sum};

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
            let (dw, db): (Vec<f32>, Vec<f32>) =
                parts.chunks_exact(2).map(|p| (p[0], p[1])).unzip();
            let out = per_channel(&dw, c).into_iter().chain(per_channel(&db, c));
            tensor(out.map(|v| v as f32).collect(), vec![2, c])
        }
    }
}
