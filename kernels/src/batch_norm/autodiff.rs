//! BatchNorm's primitives under autodiff: each forward on the inner backend with its hand-written
//! backward step.

use super::*;
use crate::support::autodiff::unary_step;

#[cfg(feature = "cube")]
impl<B: Backend + FoldBackend, C: CheckpointStrategy> FoldBackend for Autodiff<B, C> {
    #[allow(clippy::type_complexity, clippy::too_many_arguments)]
    fn channel_fold(
        x: FloatTensor<Self>,
        mean: FloatTensor<Self>,
        var: FloatTensor<Self>,
        f0: FloatTensor<Self>,
        f1: FloatTensor<Self>,
        factors: u32,
        epsilon: f32,
        momentum: f32,
        unbias: f32,
        ties_away: bool,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
    ) {
        let (m, w, b, mean, var) = B::channel_fold(
            x.into_primitive(),
            mean.into_primitive(),
            var.into_primitive(),
            f0.into_primitive(),
            f1.into_primitive(),
            factors,
            epsilon,
            momentum,
            unbias,
            ties_away,
        );
        let [m, w, b, mean, var] = [m, w, b, mean, var].map(Self::from_inner);
        (m, w, b, mean, var)
    }

    fn channel_rstd(m: FloatTensor<Self>, epsilon: f32) -> FloatTensor<Self> {
        let forward = |m: FloatTensor<B>| (B::channel_rstd(m.clone(), epsilon), (m, epsilon));
        unary_step::<B, C, _>(m, forward, |(m, epsilon), grad| {
            B::channel_rstd_backward(m, grad, epsilon)
        })
    }

    fn channel_rstd_backward(
        m: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        epsilon: f32,
    ) -> FloatTensor<Self> {
        Self::from_inner(B::channel_rstd_backward(
            m.into_primitive(),
            grad.into_primitive(),
            epsilon,
        ))
    }

    fn channel_shift(m: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct ShiftStep;

        impl<B: Backend + FoldBackend> Backward<B, 2> for ShiftStep {
            type State = (FloatTensor<B>, FloatTensor<B>);

            fn backward(
                self,
                ops: Ops<Self::State, 2>,
                grads: &mut Gradients,
                _checkpointer: &mut Checkpointer,
            ) {
                let [node_m, node_w] = ops.parents;
                let grad = grads.consume::<B>(&ops.node);
                let (m, w) = ops.state;
                let (dm, dw) = B::channel_shift_backward(m, w, grad);
                if let Some(node) = node_m {
                    grads.register::<B>(node.id, dm);
                }
                if let Some(node) = node_w {
                    grads.register::<B>(node.id, dw);
                }
            }
        }

        match ShiftStep.prepare::<C>([m.node(), w.node()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let (mp, wp) = (m.primitive().clone(), w.primitive().clone());
                prep.finish((mp.clone(), wp.clone()), B::channel_shift(mp, wp))
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(B::channel_shift(m.into_primitive(), w.into_primitive()))
            }
        }
    }

    fn channel_shift_backward(
        m: FloatTensor<Self>,
        w: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (dm, dw) = B::channel_shift_backward(
            m.into_primitive(),
            w.into_primitive(),
            grad.into_primitive(),
        );
        (Self::from_inner(dm), Self::from_inner(dw))
    }

    fn channel_normalize(
        x: FloatTensor<Self>,
        m: FloatTensor<Self>,
        w: FloatTensor<Self>,
        b: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let (m, w, b) = (m.into_primitive(), w.into_primitive(), b.into_primitive());
        let forward = |x: FloatTensor<B>| {
            let out = B::channel_normalize(x.clone(), m.clone(), w.clone(), b);
            (out, (x, m, w))
        };
        // The state: `x`, `m` and `w`.
        unary_step::<B, C, _>(x, forward, |(x, m, w), grad| {
            B::channel_normalize_backward(x, m, w, grad)
        })
    }

    fn channel_normalize_backward(
        x: FloatTensor<Self>,
        m: FloatTensor<Self>,
        w: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        Self::from_inner(B::channel_normalize_backward(
            x.into_primitive(),
            m.into_primitive(),
            w.into_primitive(),
            grad.into_primitive(),
        ))
    }

    fn channel_running(
        mean: FloatTensor<Self>,
        var: FloatTensor<Self>,
        m: FloatTensor<Self>,
        momentum: f32,
        unbias: f32,
    ) -> FloatTensor<Self> {
        Self::from_inner(B::channel_running(
            mean.into_primitive(),
            var.into_primitive(),
            m.into_primitive(),
            momentum,
            unbias,
        ))
    }
}

impl<B: Backend + ChannelBackend, C: CheckpointStrategy> ChannelBackend for Autodiff<B, C> {
    fn channel_moments(x: FloatTensor<Self>) -> FloatTensor<Self> {
        let forward = |x: FloatTensor<B>| {
            let m = B::channel_moments(x.clone());
            (m.clone(), (x, m))
        };
        unary_step::<B, C, _>(x, forward, |(x, m), grad| B::channel_moments_backward(x, m, grad))
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
