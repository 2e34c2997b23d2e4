//! The observer as a CubeCL backend extension, with its autodiff step (the fake quantization's).

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::backend::{AutodiffBackend, Backend, backend_extension};

use super::{GridRule, Rule};
use crate::fake_quant::{FakeQuantBackend, FakeQuantStep, FusedLayout};

/// The observer kernels (see [`observe_available`](super::observe_available)); CubeCL
/// only.
#[backend_extension(Cube, Autodiff)]
pub trait ObserveBackend: Backend {
    /// `(a', b', T, mult, step, zero_point)` (see [`observe`](super::observe)); `axis`
    /// equal to the rank of `x`: per tensor. Not differentiated.
    #[allow(clippy::type_complexity)] // The extension macro reads the outputs from the tuple.
    fn observe(
        x: FloatTensor<Self>,
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        axis: usize,
        rule: Rule,
        grid: GridRule,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
    );

    /// [`observe`](Self::observe)'s outputs, then `x` fake-quantized on the grid (see
    /// [`observe_fake_quant`](super::observe_fake_quant)); `layout` is the fake
    /// quantization's over `x`.
    #[allow(clippy::type_complexity)] // The extension macro reads the outputs from the tuple.
    fn observe_fake_quant(
        x: FloatTensor<Self>,
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        axis: usize,
        rule: Rule,
        grid: GridRule,
        layout: FusedLayout,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
    );
}

/// A per-tensor [`ObserveBackend::observe_fake_quant`] that also writes the clip mask of
/// its fake quantization (bit `i % 32` of `u32` word `i / 32`: element `i` rounded outside
/// the integer range), so that the straight-through gradient keeps one bit per element
/// instead of the input (on a DARTS supernet, most of a quantized step's extra memory).
pub(crate) trait MaskBackend: Backend {
    /// [`ObserveBackend::observe_fake_quant`]'s outputs and the clip mask, in the same
    /// launch.
    #[allow(clippy::type_complexity)]
    fn observe_fake_quant_masked(
        x: FloatTensor<Self>,
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        axis: usize,
        rule: Rule,
        grid: GridRule,
        layout: FusedLayout,
    ) -> (Quantized<Self>, IntTensor<Self>);

    /// `grad` where the clip mask is clear, else 0.
    fn fake_quant_masked_backward(
        mask: IntTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> FloatTensor<Self>;
}

/// The autodiff step of a fake quantization with a clip mask.
#[derive(Debug)]
struct MaskedStep;

impl<B: Backend + MaskBackend> Backward<B, 1> for MaskedStep {
    type State = IntTensor<B>;

    fn backward(
        self,
        ops: Ops<Self::State, 1>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let mask = ops.state;
        unary::<B, _>(ops.parents, ops.node, grads, |grad| {
            B::fake_quant_masked_backward(mask, grad)
        });
    }
}

/// [`ObserveBackend::observe`]'s outputs on `B`.
type Grid<B> = (
    FloatTensor<B>,
    FloatTensor<B>,
    FloatTensor<B>,
    FloatTensor<B>,
    FloatTensor<B>,
    FloatTensor<B>,
);

/// [`ObserveBackend::observe_fake_quant`]'s outputs on `B`.
pub(crate) type Quantized<B> = (
    FloatTensor<B>,
    FloatTensor<B>,
    FloatTensor<B>,
    FloatTensor<B>,
    FloatTensor<B>,
    FloatTensor<B>,
    FloatTensor<B>,
);

/// The autodiff step of a fake quantization that clips nothing
/// ([`passes_every_gradient`](super::passes_every_gradient)): the gradient passes as it is.
#[derive(Debug)]
pub(super) struct StraightThrough;

impl<B: Backend> Backward<B, 1> for StraightThrough {
    type State = ();

    fn backward(
        self,
        ops: Ops<Self::State, 1>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        unary::<B, _>(ops.parents, ops.node, grads, |grad| grad);
    }
}

impl<B: Backend + ObserveBackend + FakeQuantBackend + MaskBackend, C: CheckpointStrategy>
    ObserveBackend for Autodiff<B, C>
{
    fn observe(
        x: FloatTensor<Self>,
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        axis: usize,
        rule: Rule,
        grid: GridRule,
    ) -> Grid<Self> {
        let (s0, s1, s2, mult, step, zp) = B::observe(
            x.into_primitive(),
            a.into_primitive(),
            b.into_primitive(),
            axis,
            rule,
            grid,
        );
        let w = Self::from_inner;
        (w(s0), w(s1), w(s2), w(mult), w(step), w(zp))
    }

    fn observe_fake_quant(
        x: FloatTensor<Self>,
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        axis: usize,
        rule: Rule,
        grid: GridRule,
        layout: FusedLayout,
    ) -> Quantized<Self> {
        let (a, b) = (a.into_primitive(), b.into_primitive());
        let plain = |x| B::observe_fake_quant(x, a.clone(), b.clone(), axis, rule, grid, layout);
        let (s0, s1, s2, mult, step, zp, out) =
            if super::passes_every_gradient(rule, grid, (layout.qmin, layout.qmax)) {
                let node = x.node();
                let (s0, s1, s2, mult, step, zp, out) = plain(x.into_primitive());
                let out = StraightThrough.prepare::<C>([node]).compute_bound().stateless(out);
                (s0, s1, s2, mult, step, zp, out)
            } else if layout.channels == 1 {
                // Per tensor: the backward keeps the clip mask, not `x`.
                match MaskedStep.prepare::<C>([x.node()]).compute_bound().stateful() {
                    OpsKind::Tracked(prep) => {
                        let ((s0, s1, s2, mult, step, zp, out), mask) =
                            B::observe_fake_quant_masked(
                                x.into_primitive(),
                                a.clone(),
                                b.clone(),
                                axis,
                                rule,
                                grid,
                                layout,
                            );
                        (s0, s1, s2, mult, step, zp, prep.finish(mask, out))
                    }
                    OpsKind::UnTracked(prep) => {
                        let (s0, s1, s2, mult, step, zp, out) = plain(x.into_primitive());
                        (s0, s1, s2, mult, step, zp, prep.finish(out))
                    }
                }
            } else {
                match FakeQuantStep.prepare::<C>([x.node()]).compute_bound().stateful() {
                    OpsKind::Tracked(prep) => {
                        let xp = x.primitive().clone();
                        let (s0, s1, s2, mult, step, zp, out) = plain(xp.clone());
                        let out = prep.finish((xp, mult.clone(), zp.clone(), layout), out);
                        (s0, s1, s2, mult, step, zp, out)
                    }
                    OpsKind::UnTracked(prep) => {
                        let (s0, s1, s2, mult, step, zp, out) = plain(x.into_primitive());
                        (s0, s1, s2, mult, step, zp, prep.finish(out))
                    }
                }
            };
        let w = Self::from_inner;
        (w(s0), w(s1), w(s2), w(mult), w(step), w(zp), out)
    }
}
