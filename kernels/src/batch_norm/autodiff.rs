//! BatchNorm's primitives under autodiff: each forward on the inner backend with its hand-written
//! backward step.

use super::*;
use crate::support::autodiff::{step, unary_step};

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

    #[allow(clippy::type_complexity, clippy::too_many_arguments)]
    fn channel_fold_normalize(
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
        FloatTensor<Self>,
    ) {
        let (mean, var) = (mean.into_primitive(), var.into_primitive());
        let (f0, f1) = (f0.into_primitive(), f1.into_primitive());
        let mut folded = None;
        // `y` differentiated as `channel_normalize`'s: the state `x`, `m` and `w`.
        let y = unary_step::<B, C, _>(
            x,
            |x| {
                let (m, w, b, mean, var, y) = B::channel_fold_normalize(
                    x.clone(),
                    mean,
                    var,
                    f0,
                    f1,
                    factors,
                    epsilon,
                    momentum,
                    unbias,
                    ties_away,
                );
                folded = Some([m.clone(), w.clone(), b, mean, var]);
                (y, (x, m, w))
            },
            |(x, m, w), grad| B::channel_normalize_backward(x, m, w, grad),
        );
        let [m, w, b, mean, var] = folded.expect("the forward ran").map(Self::from_inner);
        (m, w, b, mean, var, y)
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
        let keep = |[m, w]: &[FloatTensor<B>; 2]| (m.clone(), w.clone());
        let forward = |[m, w]: [FloatTensor<B>; 2]| B::channel_shift(m, w);
        step::<B, C, _, 2>([m, w], keep, forward, |(m, w), grad, [dm, dw]| {
            let (m_grad, w_grad) = B::channel_shift_backward(m, w, grad);
            [dm.then_some(m_grad), dw.then_some(w_grad)]
        })
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
        let c = x.primitive().shape()[1];
        // `x`, `w` and the number of channels.
        let keep = |[x, w, _]: &[FloatTensor<B>; 3]| (x.clone(), w.clone(), c);
        let forward = |[x, w, b]: [FloatTensor<B>; 3]| B::channel_affine(x, w, b);
        step::<B, C, _, 3>([x, w, b], keep, forward, |(x, w, c), grad, [dx, dw, db]| {
            let (mut w_grad, mut b_grad) = (None, None);
            if dw || db {
                let wb = B::channel_affine_wb_backward(x, grad.clone());
                let row = |r: usize| {
                    let t = B::float_slice(wb.clone(), &[(r..r + 1).into(), (0..c).into()]);
                    B::float_reshape(t, [c].into())
                };
                (w_grad, b_grad) = (dw.then(|| row(0)), db.then(|| row(1)));
            }
            [dx.then(|| B::channel_affine_x_backward(grad, w)), w_grad, b_grad]
        })
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
