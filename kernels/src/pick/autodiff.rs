//! The pick under autodiff: a gathering step over the input, whose output (the input itself)
//! each part is picked from by a step of its own. The parts' steps run first and keep their
//! gradients; the gathering step sums them onto the input's positions in one launch (as the
//! split's and the fan-out's, `crate::split`).

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::{AutodiffBackend, Backend, TensorMetadata, tensor::FloatTensor};

use super::PickBackend;
use crate::cat::slots;
use crate::support::autodiff::{Kept, kept_outputs};

/// The gathering step: the input's gradient from the parts'.
#[derive(Debug)]
struct Gather;

/// What [`Gather`] needs: the parts' gradients, their positions, the input's length.
type GatherState<B> = (Kept<B>, Vec<Vec<usize>>, usize);

impl<B: Backend + PickBackend> Backward<B, 1> for Gather {
    type State = GatherState<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        // One part's gradient stands registered here for all of them (see `KeepOutput`).
        let _ = grads.consume::<B>(&ops.node);
        let [Some(parent)] = ops.parents else { return };
        let (kept, index, n) = ops.state;
        let reached: Vec<(FloatTensor<B>, Vec<usize>)> = std::mem::take(&mut *kept.lock())
            .into_iter()
            .zip(index)
            .filter_map(|(g, at)| g.map(|g| (g, at)))
            .collect();
        if reached.is_empty() {
            return;
        }
        let count = reached.len();
        let (gs, index): (Vec<_>, Vec<_>) = reached.into_iter().unzip();
        let [g0, g1, g2, g3, g4, g5, g6, g7] = slots(gs);
        let grad = B::pick_grad(g0, g1, g2, g3, g4, g5, g6, g7, count, index, n);
        grads.register::<B>(parent.id, grad);
    }
}

impl<B: Backend + PickBackend, C: CheckpointStrategy> PickBackend for Autodiff<B, C> {
    fn pick_parts(x: FloatTensor<Self>, index: Vec<Vec<usize>>) -> Vec<FloatTensor<Self>> {
        let kept = Kept::<B>::new(index.len());
        let n = x.primitive().shape()[0];
        let gathered = match Gather.prepare::<C>([x.node()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                prep.finish((kept.clone(), index.clone(), n), x.into_primitive())
            }
            OpsKind::UnTracked(prep) => prep.finish(x.into_primitive()),
        };
        let parts = B::pick_parts(gathered.primitive().clone(), index);
        kept_outputs::<B, C>(&gathered, &kept, parts)
    }

    #[allow(clippy::too_many_arguments)]
    fn pick_grad(
        g0: FloatTensor<Self>,
        g1: FloatTensor<Self>,
        g2: FloatTensor<Self>,
        g3: FloatTensor<Self>,
        g4: FloatTensor<Self>,
        g5: FloatTensor<Self>,
        g6: FloatTensor<Self>,
        g7: FloatTensor<Self>,
        count: usize,
        index: Vec<Vec<usize>>,
        n: usize,
    ) -> FloatTensor<Self> {
        let [g0, g1, g2, g3, g4, g5, g6, g7] =
            [g0, g1, g2, g3, g4, g5, g6, g7].map(|g| g.into_primitive());
        Self::from_inner(B::pick_grad(g0, g1, g2, g3, g4, g5, g6, g7, count, index, n))
    }
}
