//! The autodiff step of a kernel, written once: the forward on the inner backend, and where
//! the graph tracks an input, the state its backward keeps and the function that maps the
//! output's gradient to the inputs' ([`unary_step`] for one differentiated input, [`step`] for
//! several, [`conv_step`] for a convolution's input and weight).

use core::fmt;
use core::marker::PhantomData;
use std::sync::{Arc, Mutex, MutexGuard};

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn::backend::{Backend, tensor::FloatTensor};

/// The gradients of a step's several outputs, kept by each output's step for the step that
/// gathers them into the input's (`None`: an output the loss does not reach): the split's
/// parts, the fan-out's uses.
pub(crate) struct Kept<B: Backend>(Arc<Mutex<Vec<Option<FloatTensor<B>>>>>);

impl<B: Backend> Kept<B> {
    /// Room for `outputs` gradients.
    pub(crate) fn new(outputs: usize) -> Self {
        Kept(Arc::new(Mutex::new(vec![None; outputs])))
    }

    /// The gradients kept so far.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Vec<Option<FloatTensor<B>>>> {
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

/// One output's step of a step with several outputs: it keeps its gradient at its index of
/// [`Kept`] for the gathering step, and the first output to run registers its gradient on the
/// gathering step's node too, so that the graph runs that step (its value is not read).
#[derive(Debug)]
pub(crate) struct KeepOutput;

impl<B: Backend> Backward<B, 1> for KeepOutput {
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

/// `parts`, the values of a multi-output step's outputs, each as a step of its own over
/// `gathered` (the step that gathers their gradients) that keeps its gradient at its index
/// of `kept` ([`KeepOutput`]); untracked where `gathered` is.
pub(crate) fn kept_outputs<B: Backend, C: CheckpointStrategy>(
    gathered: &FloatTensor<Autodiff<B, C>>,
    kept: &Kept<B>,
    parts: Vec<FloatTensor<B>>,
) -> Vec<FloatTensor<Autodiff<B, C>>> {
    parts
        .into_iter()
        .enumerate()
        .map(|(i, part)| {
            match KeepOutput.prepare::<C>([gathered.node()]).compute_bound().stateful() {
                OpsKind::Tracked(prep) => prep.finish((kept.clone(), i), part),
                OpsKind::UnTracked(prep) => prep.finish(part),
            }
        })
        .collect()
}

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

/// The inputs' gradients of a [`step`] from the state it kept, the output's gradient and which
/// inputs the graph tracks (`None` for the others).
pub(crate) type Grads<B, S, const N: usize> =
    fn(S, FloatTensor<B>, [bool; N]) -> [Option<FloatTensor<B>>; N];

/// The backward of a [`step`].
pub(crate) struct StepBackward<B: Backend, S, const N: usize>(Grads<B, S, N>, PhantomData<S>);

impl<B: Backend, S, const N: usize> fmt::Debug for StepBackward<B, S, N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StepBackward<{N}>")
    }
}

impl<B: Backend, S: Clone + Send + fmt::Debug + 'static, const N: usize> Backward<B, N>
    for StepBackward<B, S, N>
{
    type State = S;

    fn backward(self, ops: Ops<S, N>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let tracked = ops.parents.each_ref().map(Option::is_some);
        let inputs = (self.0)(ops.state, grad, tracked);
        for (parent, input) in ops.parents.into_iter().zip(inputs) {
            if let (Some(node), Some(input)) = (parent, input) {
                grads.register::<B>(node.id, input);
            }
        }
    }
}

/// `forward` of `N` inputs on the inner backend, differentiated by `backward`: where the graph
/// tracks an input, `keep` first takes what `backward` needs from the inputs (so that an
/// untracked step holds no second reference to them and its kernels may write in place), and
/// `backward` gives each tracked input's gradient from that and the output's gradient.
pub(crate) fn step<B, C, S, const N: usize>(
    inputs: [FloatTensor<Autodiff<B, C>>; N],
    keep: impl FnOnce(&[FloatTensor<B>; N]) -> S,
    forward: impl FnOnce([FloatTensor<B>; N]) -> FloatTensor<B>,
    backward: Grads<B, S, N>,
) -> FloatTensor<Autodiff<B, C>>
where
    B: Backend,
    C: CheckpointStrategy,
    S: Clone + Send + fmt::Debug + 'static,
{
    let nodes = inputs.each_ref().map(|x| x.node());
    let prep = StepBackward(backward, PhantomData).prepare::<C>(nodes);
    let inner = inputs.map(|x| x.into_primitive());
    match prep.compute_bound().stateful() {
        OpsKind::Tracked(prep) => {
            let state = keep(&inner);
            prep.finish(state, forward(inner))
        }
        OpsKind::UnTracked(prep) => prep.finish(forward(inner)),
    }
}

/// A convolution's kernels on `B` with geometry `G`, as [`conv_step`] calls them: the forward
/// `(x, w)`, both gradients `(x, ∂y, w)`, the input's `(x, ∂y, w)` and the weight's `(x, ∂y)`.
pub(crate) struct ConvKernels<B: Backend, G> {
    pub(crate) forward: PairKernel<B, G>,
    pub(crate) both: BothGrads<B, G>,
    pub(crate) x: InputGrad<B, G>,
    pub(crate) w: PairKernel<B, G>,
}

/// A convolution's input gradient from `(x, ∂y, w)` (`x` for a mask applied on read).
pub(crate) type InputGrad<B, G> =
    fn(FloatTensor<B>, FloatTensor<B>, FloatTensor<B>, G) -> FloatTensor<B>;

/// A kernel of two tensors and a geometry.
pub(crate) type PairKernel<B, G> = fn(FloatTensor<B>, FloatTensor<B>, G) -> FloatTensor<B>;

/// A convolution's two gradients `(∂x, ∂w)` from `(x, ∂y, w)`.
pub(crate) type BothGrads<B, G> =
    fn(FloatTensor<B>, FloatTensor<B>, FloatTensor<B>, G) -> [FloatTensor<B>; 2];

impl<B: Backend, G> Clone for ConvKernels<B, G> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B: Backend, G> Copy for ConvKernels<B, G> {}

impl<B: Backend, G> fmt::Debug for ConvKernels<B, G> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ConvKernels")
    }
}

/// The autodiff step of a convolution of `x` by `w`: where both are tracked, both gradients
/// in one call; where one is, its own kernel.
pub(crate) fn conv_step<B, C, G>(
    x: FloatTensor<Autodiff<B, C>>,
    w: FloatTensor<Autodiff<B, C>>,
    geom: G,
    kernels: ConvKernels<B, G>,
) -> FloatTensor<Autodiff<B, C>>
where
    B: Backend,
    C: CheckpointStrategy,
    G: Copy + Send + fmt::Debug + 'static,
{
    let keep = |[x, w]: &[FloatTensor<B>; 2]| (x.clone(), w.clone(), geom, kernels);
    let forward = |[x, w]: [FloatTensor<B>; 2]| (kernels.forward)(x, w, geom);
    step::<B, C, _, 2>([x, w], keep, forward, |(x, w, geom, k), grad, tracked| match tracked {
        [true, true] => (k.both)(x, grad, w, geom).map(Some),
        [dx, dw] => {
            [dx.then(|| (k.x)(x.clone(), grad.clone(), w, geom)), dw.then(|| (k.w)(x, grad, geom))]
        }
    })
}
