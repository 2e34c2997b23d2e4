//! The concatenation as a backend extension, with its autodiff step.
//!
//! A backend extension takes a fixed number of tensors, so the step takes [`ARITY`] slots and
//! a count of the parts in them (the slots past the count repeat the first part and are not
//! read); [`cat`](super::cat) cuts longer lists into chunks.

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::{
    AutodiffBackend, Backend, TensorMetadata, backend_extension, tensor::FloatTensor,
};

use crate::support::autodiff::step;

/// How many parts one call of [`CatBackend::cat_parts`] takes.
pub const ARITY: usize = 8;

/// The concatenation (see [`cat`](super::cat)).
#[backend_extension(Flex: cfg(feature = "flex"), Cube: cfg(feature = "cube"), Autodiff)]
pub trait CatBackend: Backend {
    /// The first `count` (2 to [`ARITY`]) of the slots side by side along `dim`; the parts
    /// agree in shape but along `dim`.
    #[allow(clippy::too_many_arguments, reason = "a backend extension's tensors are arguments")]
    fn cat_parts(
        p0: FloatTensor<Self>,
        p1: FloatTensor<Self>,
        p2: FloatTensor<Self>,
        p3: FloatTensor<Self>,
        p4: FloatTensor<Self>,
        p5: FloatTensor<Self>,
        p6: FloatTensor<Self>,
        p7: FloatTensor<Self>,
        count: usize,
        dim: usize,
    ) -> FloatTensor<Self>;

    /// `grad`'s consecutive parts of `sizes` along `dim` (the concatenation's backward): each
    /// laid out contiguously where a slice of `grad` would not be.
    fn uncat_parts(
        grad: FloatTensor<Self>,
        dim: usize,
        sizes: Vec<usize>,
    ) -> Vec<FloatTensor<Self>>;
}

/// `parts` (1 to [`ARITY`]) in the slots of a call, the slots past them filled with the first
/// part again (not read): the inverse of [`taken`].
pub(crate) fn slots<T: Clone>(parts: Vec<T>) -> [T; ARITY] {
    assert!((1..=ARITY).contains(&parts.len()), "{} parts for {ARITY} slots", parts.len());
    let first = parts[0].clone();
    let mut all = parts.into_iter().chain(std::iter::repeat(first));
    [(); ARITY].map(|()| all.next().expect("slots repeat the first part"))
}

/// The first `count` slots.
pub(crate) fn taken<T>(slots: [T; ARITY], count: usize) -> Vec<T> {
    slots.into_iter().take(count).collect()
}

#[cfg(feature = "flex")]
impl CatBackend for burn::backend::flex::Flex {
    fn cat_parts(
        p0: FloatTensor<Self>,
        p1: FloatTensor<Self>,
        p2: FloatTensor<Self>,
        p3: FloatTensor<Self>,
        p4: FloatTensor<Self>,
        p5: FloatTensor<Self>,
        p6: FloatTensor<Self>,
        p7: FloatTensor<Self>,
        count: usize,
        dim: usize,
    ) -> FloatTensor<Self> {
        // A launch costs flex nothing: Burn's own.
        use burn::backend::ops::FloatTensorOps;
        Self::float_cat(taken([p0, p1, p2, p3, p4, p5, p6, p7], count), dim)
    }

    fn uncat_parts(
        grad: FloatTensor<Self>,
        dim: usize,
        sizes: Vec<usize>,
    ) -> Vec<FloatTensor<Self>> {
        crate::split::slices::<Self>(grad, dim, &sizes)
    }
}

impl<B: Backend + CatBackend, C: CheckpointStrategy> CatBackend for Autodiff<B, C> {
    fn cat_parts(
        p0: FloatTensor<Self>,
        p1: FloatTensor<Self>,
        p2: FloatTensor<Self>,
        p3: FloatTensor<Self>,
        p4: FloatTensor<Self>,
        p5: FloatTensor<Self>,
        p6: FloatTensor<Self>,
        p7: FloatTensor<Self>,
        count: usize,
        dim: usize,
    ) -> FloatTensor<Self> {
        let keep = |slots: &[FloatTensor<B>; ARITY]| {
            let sizes: Vec<usize> = slots[..count].iter().map(|p| p.shape()[dim]).collect();
            (dim, sizes)
        };
        let forward = |[a, b, c, d, e, f, g, h]: [FloatTensor<B>; ARITY]| {
            B::cat_parts(a, b, c, d, e, f, g, h, count, dim)
        };
        step::<B, C, _, ARITY>(
            [p0, p1, p2, p3, p4, p5, p6, p7],
            keep,
            forward,
            |state, grad, tracked| {
                let (dim, sizes) = state;
                let mut parts = B::uncat_parts(grad, dim, sizes.clone()).into_iter();
                let mut at = 0;
                tracked.map(|t| {
                    // Past the parts the slots are the first part again: no gradient of their own.
                    let part = (at < sizes.len()).then(|| parts.next()).flatten();
                    at += 1;
                    part.filter(|_| t)
                })
            },
        )
    }

    fn uncat_parts(
        grad: FloatTensor<Self>,
        dim: usize,
        sizes: Vec<usize>,
    ) -> Vec<FloatTensor<Self>> {
        // Not differentiated: only the concatenation's backward calls it.
        let parts = B::uncat_parts(grad.into_primitive(), dim, sizes);
        parts.into_iter().map(Self::from_inner).collect()
    }
}
