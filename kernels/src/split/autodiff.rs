//! The split under autodiff: a gathering step over the input, whose output (the input itself)
//! the parts are cut from, one step each. The parts' steps run first (each is one deeper in the
//! graph) and keep their gradients; the gathering step concatenates them into the input's.

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::{Backend, TensorMetadata, tensor::Device, tensor::FloatTensor};
use burn::tensor::Shape;

use super::{SplitBackend, slices};
use crate::cat::{CatBackend, cat_primitives};
use crate::support::autodiff::{Kept, kept_outputs};

/// The gathering step: the input's gradient is the parts' side by side.
#[derive(Debug)]
struct Gather;

/// What [`Gather`] needs: the parts' gradients, the dimension, the parts' sizes, the input's
/// shape and device (for the zeros of a part no gradient reached).
type GatherState<B> = (Kept<B>, usize, Vec<usize>, Shape, Device<B>);

impl<B: Backend + CatBackend> Backward<B, 1> for Gather {
    type State = GatherState<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (kept, dim, sizes, shape, device) = ops.state;
        // One part's gradient stands registered here for all of them (see `KeepOutput`).
        let _ = grads.consume::<B>(&ops.node);
        let [Some(parent)] = ops.parents else { return };
        let reached = std::mem::take(&mut *kept.lock());
        let dtype = reached.iter().flatten().next().map(|g| g.dtype());
        let Some(dtype) = dtype else { return };
        let parts = reached
            .into_iter()
            .zip(sizes)
            .map(|(grad, len)| {
                grad.unwrap_or_else(|| {
                    let mut dims = shape.clone();
                    dims[dim] = len;
                    B::float_zeros(dims, &device, dtype.into())
                })
            })
            .collect();
        grads.register::<B>(parent.id, cat_primitives::<B>(parts, dim));
    }
}

impl<B: Backend + SplitBackend + CatBackend, C: CheckpointStrategy> SplitBackend
    for Autodiff<B, C>
{
    fn split_parts(x: FloatTensor<Self>, dim: usize, sizes: Vec<usize>) -> Vec<FloatTensor<Self>> {
        let kept = Kept::<B>::new(sizes.len());
        let gathered = match Gather.prepare::<C>([x.node()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let (shape, device) = (x.primitive().shape(), x.primitive().device());
                let state = (kept.clone(), dim, sizes.clone(), shape, device);
                prep.finish(state, x.into_primitive())
            }
            OpsKind::UnTracked(prep) => prep.finish(x.into_primitive()),
        };
        let parts = slices::<B>(gathered.primitive().clone(), dim, &sizes);
        kept_outputs::<B, C>(&gathered, &kept, parts)
    }
}
