//! A tensor cut into consecutive parts along one dimension, with one backward for all of them.
//!
//! Burn's `narrow` differentiates each cut on its own: its backward allocates a zero tensor of
//! the whole input, writes the part's gradient into it, and the input's gradient is then the
//! sum of those whole tensors. Cutting a tensor into `k` parts so costs `k` whole-size zero
//! fills, writes and adds (about `3k` launches on a GPU) where the gradient is just the parts'
//! gradients side by side. Here the parts are the outputs of one step: each part's backward
//! keeps its gradient, and the input's gradient is their concatenation (zeros for a part the
//! loss does not reach), computed once. The values are Burn's slices, the gradients the same
//! numbers as `narrow`'s (each element of the input's gradient is one part's, or 0).
//!
//! It runs where this crate's extensions are dispatched (flex and the CubeCL runtimes, any
//! float dtype); elsewhere (LibTorch) [`split`] is Burn's `narrow`, part by part.

use burn::backend::{Backend, backend_extension, tensor::FloatTensor};
use burn::tensor::{Device, Tensor};

mod autodiff;

/// The cut itself: `x`'s consecutive parts of `sizes` along `dim` (Burn's slices).
#[backend_extension(Flex: cfg(feature = "flex"), Cube: cfg(feature = "cube"), Autodiff)]
pub trait SplitBackend: Backend {
    /// `x`'s parts of `sizes` along `dim`, in order (`sizes` add up to `x`'s size there).
    fn split_parts(x: FloatTensor<Self>, dim: usize, sizes: Vec<usize>) -> Vec<FloatTensor<Self>>;
}

/// Whether [`split`] runs this module's step for tensors on `device` (flex or a CubeCL
/// runtime, where this crate's extensions are dispatched).
pub fn split_available(device: &Device) -> bool {
    #[cfg(feature = "flex")]
    if *device == Device::flex() {
        return true;
    }
    crate::support::on_cube(device)
}

/// `x` cut along `dim` into consecutive parts of `sizes`, as `narrow` would cut them, with
/// one backward step for all of them (see the module's notes).
///
/// # Panics
/// If `sizes` do not add up to `x`'s size along `dim`, or `dim` is not below `D`.
pub fn split<const D: usize>(x: Tensor<D>, dim: usize, sizes: &[usize]) -> Vec<Tensor<D>> {
    assert!(dim < D, "split: dimension {dim} of a rank-{D} tensor");
    let total = x.dims()[dim];
    assert_eq!(
        sizes.iter().sum::<usize>(),
        total,
        "split: parts {sizes:?} of a dimension of size {total}"
    );
    if sizes.len() == 1 {
        return vec![x];
    }
    if !split_available(&x.device()) {
        let mut at = 0;
        return sizes
            .iter()
            .map(|&len| {
                let part = x.clone().narrow(dim, at, len);
                at += len;
                part
            })
            .collect();
    }
    #[cfg(any(feature = "flex", feature = "cube"))]
    {
        let parts = <burn::backend::Dispatch as SplitBackend>::split_parts(
            x.into_dispatch(),
            dim,
            sizes.to_vec(),
        );
        parts.into_iter().map(Tensor::from_dispatch).collect()
    }
    #[cfg(not(any(feature = "flex", feature = "cube")))]
    unreachable!("split_available is false without a backend of this crate")
}

/// `x`'s parts of `sizes` along `dim` on a backend without autodiff: Burn's slices.
pub(crate) fn slices<B: Backend>(
    x: FloatTensor<B>,
    dim: usize,
    sizes: &[usize],
) -> Vec<FloatTensor<B>> {
    use burn::backend::TensorMetadata;

    let shape = x.shape();
    let mut at = 0;
    sizes
        .iter()
        .map(|&len| {
            let ranges: Vec<burn::tensor::Slice> = (0..shape.num_dims())
                .map(|d| if d == dim { (at..at + len).into() } else { (0..shape[d]).into() })
                .collect();
            at += len;
            B::float_slice(x.clone(), &ranges)
        })
        .collect()
}

#[cfg(feature = "flex")]
impl SplitBackend for burn::backend::flex::Flex {
    fn split_parts(x: FloatTensor<Self>, dim: usize, sizes: Vec<usize>) -> Vec<FloatTensor<Self>> {
        slices::<Self>(x, dim, &sizes)
    }
}

#[cfg(feature = "cube")]
impl SplitBackend for burn_cubecl::CubeBackend {
    fn split_parts(x: FloatTensor<Self>, dim: usize, sizes: Vec<usize>) -> Vec<FloatTensor<Self>> {
        slices::<Self>(x, dim, &sizes)
    }
}
