//! The autodiff step of a kernel with one differentiated input, written once: the forward on
//! the inner backend, and where the graph tracks the input, the state its backward keeps and
//! the function that maps the output's gradient to the input's.

use core::fmt;
use core::marker::PhantomData;

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn::backend::{Backend, tensor::FloatTensor};

/// The backward of a [`unary_step`]: the input's gradient from the kept state and the output's
/// gradient.
pub(crate) struct UnaryBackward<B: Backend, S>(
    fn(S, FloatTensor<B>) -> FloatTensor<B>,
    PhantomData<S>,
);

impl<B: Backend, S> fmt::Debug for UnaryBackward<B, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("UnaryBackward")
    }
}

impl<B: Backend, S: Clone + Send + fmt::Debug + 'static> Backward<B, 1> for UnaryBackward<B, S> {
    type State = S;

    fn backward(self, ops: Ops<S, 1>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let state = ops.state;
        unary::<B, _>(ops.parents, ops.node, grads, |grad| (self.0)(state, grad));
    }
}

/// `forward` of `x` on the inner backend, differentiated by `backward`: `forward` gives the
/// output and the state `backward` keeps (dropped where the graph does not track `x`),
/// `backward` the input's gradient from that state and the output's gradient.
pub(crate) fn unary_step<B, C, S>(
    x: FloatTensor<Autodiff<B, C>>,
    forward: impl FnOnce(FloatTensor<B>) -> (FloatTensor<B>, S),
    backward: fn(S, FloatTensor<B>) -> FloatTensor<B>,
) -> FloatTensor<Autodiff<B, C>>
where
    B: Backend,
    C: CheckpointStrategy,
    S: Clone + Send + fmt::Debug + 'static,
{
    let step = UnaryBackward(backward, PhantomData);
    match step.prepare::<C>([x.node()]).compute_bound().stateful() {
        OpsKind::Tracked(prep) => {
            let (out, state) = forward(x.into_primitive());
            prep.finish(state, out)
        }
        OpsKind::UnTracked(prep) => prep.finish(forward(x.into_primitive()).0),
    }
}
