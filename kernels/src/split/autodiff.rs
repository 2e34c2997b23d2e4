//! The split under autodiff: a gathering step over the input, whose output (the input itself)
//! the parts are cut from, one step each. The parts' steps run first (each is one deeper in the
//! graph) and keep their gradients; the gathering step concatenates them into the input's.

use core::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::{Backend, TensorMetadata, tensor::Device, tensor::FloatTensor};
use burn::tensor::Shape;

use super::{SplitBackend, slices};
use crate::cat::{CatBackend, cat_primitives};

/// The parts' gradients, kept by their steps for the gathering step (`None`: not reached).
struct Kept<B: Backend>(Arc<Mutex<Vec<Option<FloatTensor<B>>>>>);

impl<B: Backend> Kept<B> {
    fn lock(&self) -> MutexGuard<'_, Vec<Option<FloatTensor<B>>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<B: Backend> Clone for Kept<B> {
    fn clone(&self) -> Self {
        Kept(self.0.clone())
    }
}

impl<B: Backend> fmt::Debug for Kept<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Kept")
    }
}

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
        // One part's gradient stands registered here for all of them (see `Part`).
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

/// A part's step: it keeps its gradient for [`Gather`], and the first part to run registers
/// its gradient on the gathering step's node too, so that the graph runs that step (its value
/// is not read).
#[derive(Debug)]
struct Part;

impl<B: Backend> Backward<B, 1> for Part {
    type State = (Kept<B>, usize);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (kept, i) = ops.state;
        let grad = grads.consume::<B>(&ops.node);
        let [Some(parent)] = ops.parents else { return };
        let mut kept = kept.lock();
        if kept.iter().all(Option::is_none) {
            grads.register::<B>(parent.id, grad.clone());
        }
        kept[i] = Some(grad);
    }
}

impl<B: Backend + SplitBackend + CatBackend, C: CheckpointStrategy> SplitBackend
    for Autodiff<B, C>
{
    fn split_parts(x: FloatTensor<Self>, dim: usize, sizes: Vec<usize>) -> Vec<FloatTensor<Self>> {
        let kept = Kept::<B>(Arc::new(Mutex::new(vec![None; sizes.len()])));
        let gathered = match Gather.prepare::<C>([x.node()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let (shape, device) = (x.primitive().shape(), x.primitive().device());
                let state = (kept.clone(), dim, sizes.clone(), shape, device);
                prep.finish(state, x.into_primitive())
            }
            OpsKind::UnTracked(prep) => prep.finish(x.into_primitive()),
        };
        let parts = slices::<B>(gathered.primitive().clone(), dim, &sizes);
        parts
            .into_iter()
            .enumerate()
            .map(|(i, part)| {
                match Part.prepare::<C>([gathered.node()]).compute_bound().stateful() {
                    OpsKind::Tracked(prep) => prep.finish((kept.clone(), i), part),
                    OpsKind::UnTracked(prep) => prep.finish(part),
                }
            })
            .collect()
    }
}
