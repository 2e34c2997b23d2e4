//! The quantized add as a CubeCL backend extension, with its autodiff step.

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn::backend::{AutodiffBackend, Backend, backend_extension, tensor::FloatTensor};

use crate::fake_quant::FusedLayout;

/// The quantized sum's kernels (see [`fake_quant_sum`](super::fake_quant_sum)); CubeCL
/// only. `mult`, `step` and `zero_point` are `[layout.channels]`.
#[backend_extension(Cube, Autodiff)]
pub trait QuantSumBackend: Backend {
    /// `round(x · mult)`. Not differentiated.
    fn quant_sum_start(
        x: FloatTensor<Self>,
        mult: FloatTensor<Self>,
        layout: FusedLayout,
    ) -> FloatTensor<Self>;

    /// `acc + round(x · mult)` (in place where `acc` is free to reuse). Not
    /// differentiated.
    fn quant_sum_add(
        acc: FloatTensor<Self>,
        x: FloatTensor<Self>,
        mult: FloatTensor<Self>,
        layout: FusedLayout,
    ) -> FloatTensor<Self>;

    /// `(out, r)`: `r = acc + round(x · mult) + zero_point` and
    /// `out = (clamp(r) − zero_point) · step`; `out` is differentiated as `sum`
    /// (straight through where `r` is in range), `r` is not.
    #[allow(clippy::type_complexity)] // The extension macro reads the outputs from the tuple.
    fn quant_sum_finish(
        sum: FloatTensor<Self>,
        acc: FloatTensor<Self>,
        x: FloatTensor<Self>,
        mult: FloatTensor<Self>,
        step: FloatTensor<Self>,
        zero_point: FloatTensor<Self>,
        layout: FusedLayout,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// [`quant_sum_finish`](Self::quant_sum_finish) of the first `count` (2 to
    /// [`ARITY`](crate::cat::ARITY)) operands `x_t` added in order, without the running sum:
    /// one launch. The slots past `count` are not read.
    #[allow(clippy::too_many_arguments, reason = "a backend extension's tensors are arguments")]
    fn quant_sum_all(
        sum: FloatTensor<Self>,
        x0: FloatTensor<Self>,
        x1: FloatTensor<Self>,
        x2: FloatTensor<Self>,
        x3: FloatTensor<Self>,
        x4: FloatTensor<Self>,
        x5: FloatTensor<Self>,
        x6: FloatTensor<Self>,
        x7: FloatTensor<Self>,
        count: usize,
        mult: FloatTensor<Self>,
        step: FloatTensor<Self>,
        zero_point: FloatTensor<Self>,
        layout: FusedLayout,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// `grad · [qmin ≤ r ≤ qmax]` (in place where `grad` is free to reuse).
    fn quant_sum_backward(
        r: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        layout: FusedLayout,
    ) -> FloatTensor<Self>;
}

/// The straight-through step of [`QuantSumBackend::quant_sum_finish`]'s output, from the
/// unclamped sum.
#[derive(Debug)]
struct SumStep;

impl<B: Backend + QuantSumBackend> Backward<B, 1> for SumStep {
    type State = (FloatTensor<B>, FusedLayout);

    fn backward(
        self,
        ops: Ops<Self::State, 1>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let (r, layout) = ops.state;
        unary::<B, _>(ops.parents, ops.node, grads, |grad| B::quant_sum_backward(r, grad, layout));
    }
}

/// `out`, the quantized sum of the operands of `sum`, as a step whose gradient reaches `sum`
/// where the unclamped sum `r` lies in range ([`SumStep`]).
fn sum_step<B: Backend + QuantSumBackend, C: CheckpointStrategy>(
    sum: FloatTensor<Autodiff<B, C>>,
    out: FloatTensor<B>,
    r: &FloatTensor<B>,
    layout: FusedLayout,
) -> FloatTensor<Autodiff<B, C>> {
    match SumStep.prepare::<C>([sum.node()]).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish((r.clone(), layout), out),
        OpsKind::UnTracked(prep) => prep.finish(out),
    }
}

impl<B: Backend + QuantSumBackend, C: CheckpointStrategy> QuantSumBackend for Autodiff<B, C> {
    fn quant_sum_start(
        x: FloatTensor<Self>,
        mult: FloatTensor<Self>,
        layout: FusedLayout,
    ) -> FloatTensor<Self> {
        Self::from_inner(B::quant_sum_start(x.into_primitive(), mult.into_primitive(), layout))
    }

    fn quant_sum_add(
        acc: FloatTensor<Self>,
        x: FloatTensor<Self>,
        mult: FloatTensor<Self>,
        layout: FusedLayout,
    ) -> FloatTensor<Self> {
        Self::from_inner(B::quant_sum_add(
            acc.into_primitive(),
            x.into_primitive(),
            mult.into_primitive(),
            layout,
        ))
    }

    fn quant_sum_finish(
        sum: FloatTensor<Self>,
        acc: FloatTensor<Self>,
        x: FloatTensor<Self>,
        mult: FloatTensor<Self>,
        step: FloatTensor<Self>,
        zero_point: FloatTensor<Self>,
        layout: FusedLayout,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (acc, x) = (acc.into_primitive(), x.into_primitive());
        let (mult, step, zp) =
            (mult.into_primitive(), step.into_primitive(), zero_point.into_primitive());
        let (out, r) = B::quant_sum_finish(sum.primitive().clone(), acc, x, mult, step, zp, layout);
        (sum_step::<B, C>(sum, out, &r, layout), Self::from_inner(r))
    }

    fn quant_sum_all(
        sum: FloatTensor<Self>,
        x0: FloatTensor<Self>,
        x1: FloatTensor<Self>,
        x2: FloatTensor<Self>,
        x3: FloatTensor<Self>,
        x4: FloatTensor<Self>,
        x5: FloatTensor<Self>,
        x6: FloatTensor<Self>,
        x7: FloatTensor<Self>,
        count: usize,
        mult: FloatTensor<Self>,
        step: FloatTensor<Self>,
        zero_point: FloatTensor<Self>,
        layout: FusedLayout,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let [x0, x1, x2, x3, x4, x5, x6, x7] =
            [x0, x1, x2, x3, x4, x5, x6, x7].map(|x| x.into_primitive());
        let (mult, step, zp) =
            (mult.into_primitive(), step.into_primitive(), zero_point.into_primitive());
        let (out, r) = B::quant_sum_all(
            sum.primitive().clone(),
            x0,
            x1,
            x2,
            x3,
            x4,
            x5,
            x6,
            x7,
            count,
            mult,
            step,
            zp,
            layout,
        );
        (sum_step::<B, C>(sum, out, &r, layout), Self::from_inner(r))
    }

    fn quant_sum_backward(
        r: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        layout: FusedLayout,
    ) -> FloatTensor<Self> {
        Self::from_inner(B::quant_sum_backward(r.into_primitive(), grad.into_primitive(), layout))
    }
}
