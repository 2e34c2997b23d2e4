//! The fan-out under autodiff: a gathering step over the tensor, whose output (the tensor
//! itself) each use reads through a step of its own. The uses' steps run first (each is one
//! deeper in the graph) and keep their gradients; the gathering step sums them into the
//! tensor's (as the split's, `crate::split`).

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::{AutodiffBackend, Backend, tensor::FloatTensor};

use super::FanOutBackend;
use crate::cat::{ARITY, slots};
use crate::support::autodiff::{Kept, kept_outputs};

/// `((g₀ + g₁) + …)` over `grads`, [`ARITY`] a launch.
fn sum<B: FanOutBackend>(grads: Vec<FloatTensor<B>>) -> Option<FloatTensor<B>> {
    let mut grads = grads.into_iter();
    let mut total = grads.next()?;
    loop {
        let more: Vec<FloatTensor<B>> = grads.by_ref().take(ARITY - 1).collect();
        if more.is_empty() {
            return Some(total);
        }
        let count = more.len() + 1;
        let [g0, g1, g2, g3, g4, g5, g6, g7] = slots(std::iter::once(total).chain(more).collect());
        total = B::sum_parts(g0, g1, g2, g3, g4, g5, g6, g7, count);
    }
}

/// The gathering step: the tensor's gradient is the uses' sum.
#[derive(Debug)]
struct Gather;

impl<B: Backend + FanOutBackend> Backward<B, 1> for Gather {
    type State = Kept<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        // One use's gradient stands registered here for all of them (see `KeepOutput`).
        let _ = grads.consume::<B>(&ops.node);
        let [Some(parent)] = ops.parents else { return };
        let reached: Vec<FloatTensor<B>> =
            std::mem::take(&mut *ops.state.lock()).into_iter().flatten().collect();
        if let Some(total) = sum::<B>(reached) {
            grads.register::<B>(parent.id, total);
        }
    }
}

impl<B: Backend + FanOutBackend, C: CheckpointStrategy> FanOutBackend for Autodiff<B, C> {
    fn fan_out(x: FloatTensor<Self>, uses: usize) -> Vec<FloatTensor<Self>> {
        let kept = Kept::<B>::new(uses);
        let gathered = match Gather.prepare::<C>([x.node()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish(kept.clone(), x.into_primitive()),
            OpsKind::UnTracked(prep) => prep.finish(x.into_primitive()),
        };
        let values = vec![gathered.primitive().clone(); uses];
        kept_outputs::<B, C>(&gathered, &kept, values)
    }

    #[allow(clippy::too_many_arguments)]
    fn sum_parts(
        g0: FloatTensor<Self>,
        g1: FloatTensor<Self>,
        g2: FloatTensor<Self>,
        g3: FloatTensor<Self>,
        g4: FloatTensor<Self>,
        g5: FloatTensor<Self>,
        g6: FloatTensor<Self>,
        g7: FloatTensor<Self>,
        count: usize,
    ) -> FloatTensor<Self> {
        let [g0, g1, g2, g3, g4, g5, g6, g7] =
            [g0, g1, g2, g3, g4, g5, g6, g7].map(|g| g.into_primitive());
        Self::from_inner(B::sum_parts(g0, g1, g2, g3, g4, g5, g6, g7, count))
    }
}
