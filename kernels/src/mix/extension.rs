//! The mix as a CubeCL backend extension, with its autodiff step.

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::{
    AutodiffBackend, Backend, TensorMetadata, backend_extension, tensor::FloatTensor,
};

use crate::cat::{ARITY, slots};
use crate::support::autodiff::step;

/// The mix's kernels (see [`mix`](super::mix)); the slots past `count` repeat the first block
/// and are not read.
#[backend_extension(Cube, Autodiff)]
pub trait MixBackend: Backend {
    /// `coefficients` `[1, R, C]` times the first `count` blocks `[N, c_p, L]` side by side:
    /// `[N, R, L]`.
    #[allow(clippy::too_many_arguments, reason = "a backend extension's tensors are arguments")]
    fn mix_blocks(
        coefficients: FloatTensor<Self>,
        p0: FloatTensor<Self>,
        p1: FloatTensor<Self>,
        p2: FloatTensor<Self>,
        p3: FloatTensor<Self>,
        p4: FloatTensor<Self>,
        p5: FloatTensor<Self>,
        p6: FloatTensor<Self>,
        p7: FloatTensor<Self>,
        count: usize,
    ) -> FloatTensor<Self>;

    /// Each block's gradient `[N, c_p, L]` (`columns` the blocks' `c_p`) from the output's
    /// `grad` `[N, R, L]`: `Σ_r coefficients[r, c] · grad[n, r, l]`, views of one buffer.
    /// Not differentiated.
    fn mix_block_grads(
        coefficients: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        columns: Vec<usize>,
    ) -> Vec<FloatTensor<Self>>;

    /// The coefficients' gradient `[1, R, C]` from the output's `grad` and the first `count`
    /// blocks: `Σ_{n, l} grad[n, r, l] · x[n, c, l]`. Not differentiated.
    #[allow(clippy::too_many_arguments, reason = "a backend extension's tensors are arguments")]
    fn mix_coefficient_grad(
        grad: FloatTensor<Self>,
        p0: FloatTensor<Self>,
        p1: FloatTensor<Self>,
        p2: FloatTensor<Self>,
        p3: FloatTensor<Self>,
        p4: FloatTensor<Self>,
        p5: FloatTensor<Self>,
        p6: FloatTensor<Self>,
        p7: FloatTensor<Self>,
        count: usize,
    ) -> FloatTensor<Self>;
}

/// What the mix's backward keeps: the coefficients and the blocks, each read by the other's
/// gradient.
type Kept<B> = (FloatTensor<B>, Vec<FloatTensor<B>>);

/// The gradients of the coefficients (slot 0) and of each tracked block (slots 1 to `count`;
/// the slots past them repeat the first block and take none).
fn backward<B: MixBackend>(
    (coefficients, blocks): Kept<B>,
    grad: FloatTensor<B>,
    tracked: [bool; ARITY + 1],
) -> [Option<FloatTensor<B>>; ARITY + 1] {
    let count = blocks.len();
    let mut out: [Option<FloatTensor<B>>; ARITY + 1] = Default::default();
    if tracked[1..=count].iter().any(|&t| t) {
        let columns = blocks.iter().map(|b| b.shape()[1]).collect();
        let grads = B::mix_block_grads(coefficients, grad.clone(), columns);
        for (i, g) in grads.into_iter().enumerate() {
            out[i + 1] = tracked[i + 1].then_some(g);
        }
    }
    if tracked[0] {
        let [p0, p1, p2, p3, p4, p5, p6, p7] = slots(blocks);
        out[0] = Some(B::mix_coefficient_grad(grad, p0, p1, p2, p3, p4, p5, p6, p7, count));
    }
    out
}

impl<B: Backend + MixBackend, C: CheckpointStrategy> MixBackend for Autodiff<B, C> {
    fn mix_blocks(
        coefficients: FloatTensor<Self>,
        p0: FloatTensor<Self>,
        p1: FloatTensor<Self>,
        p2: FloatTensor<Self>,
        p3: FloatTensor<Self>,
        p4: FloatTensor<Self>,
        p5: FloatTensor<Self>,
        p6: FloatTensor<Self>,
        p7: FloatTensor<Self>,
        count: usize,
    ) -> FloatTensor<Self> {
        let keep =
            |inputs: &[FloatTensor<B>; ARITY + 1]| (inputs[0].clone(), inputs[1..=count].to_vec());
        let forward = |[w, a, b, c, d, e, f, g, h]: [FloatTensor<B>; ARITY + 1]| {
            B::mix_blocks(w, a, b, c, d, e, f, g, h, count)
        };
        step::<B, C, _, { ARITY + 1 }>(
            [coefficients, p0, p1, p2, p3, p4, p5, p6, p7],
            keep,
            forward,
            backward::<B>,
        )
    }

    fn mix_block_grads(
        coefficients: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        columns: Vec<usize>,
    ) -> Vec<FloatTensor<Self>> {
        let (w, g) = (coefficients.into_primitive(), grad.into_primitive());
        B::mix_block_grads(w, g, columns).into_iter().map(Self::from_inner).collect()
    }

    fn mix_coefficient_grad(
        grad: FloatTensor<Self>,
        p0: FloatTensor<Self>,
        p1: FloatTensor<Self>,
        p2: FloatTensor<Self>,
        p3: FloatTensor<Self>,
        p4: FloatTensor<Self>,
        p5: FloatTensor<Self>,
        p6: FloatTensor<Self>,
        p7: FloatTensor<Self>,
        count: usize,
    ) -> FloatTensor<Self> {
        let [p0, p1, p2, p3, p4, p5, p6, p7] =
            [p0, p1, p2, p3, p4, p5, p6, p7].map(|p| p.into_primitive());
        let g = grad.into_primitive();
        Self::from_inner(B::mix_coefficient_grad(g, p0, p1, p2, p3, p4, p5, p6, p7, count))
    }
}
