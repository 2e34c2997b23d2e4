//! A tensor whose value passes unchanged and whose gradient is masked: `y = x`,
//! `∂x = ∂y ⊙ mask`.
//!
//! The batched cell pads the depthwise filters of a smaller kernel with zeros to the larger
//! kernel of its dilation group and keeps the padding at zero by masking it; multiplying the
//! filters by the mask in the forward costs a launch per filter tensor and pass on a GPU, and
//! since the padding is zero its values are the filters' own. Here the forward is the input
//! itself (no launch) and only the backward multiplies: the same values and the same gradient
//! (`∂(x ⊙ m)/∂x = m`) as the product, bit for bit, wherever `x` is already zero where `m` is.
//!
//! It runs where this crate's extensions are dispatched (flex and the CubeCL runtimes);
//! elsewhere (LibTorch) [`masked_gradient`] is the product `x ⊙ mask`.

use burn::backend::{Backend, backend_extension, tensor::FloatTensor};
use burn::tensor::Tensor;

mod autodiff;

/// The step (see [`masked_gradient`]).
#[backend_extension(Flex: cfg(feature = "flex"), Cube: cfg(feature = "cube"), Autodiff)]
pub trait GradMaskBackend: Backend {
    /// `x` itself; under autodiff its gradient is the output's times `mask`.
    fn grad_masked(x: FloatTensor<Self>, mask: FloatTensor<Self>) -> FloatTensor<Self>;
}

/// `x`, with the gradient `∂y ⊙ mask` (see the module's notes); `mask` is not differentiated.
/// Where `x` is not zero at `mask`'s zeros the value differs from the product `x ⊙ mask`:
/// callers keep `x` zero there (the masked gradient does, from zero).
///
/// # Panics
/// If the shapes differ.
pub fn masked_gradient<const D: usize>(x: Tensor<D>, mask: Tensor<D>) -> Tensor<D> {
    assert_eq!(x.dims(), mask.dims(), "masked_gradient: shapes differ");
    if !crate::split::split_available(&x.device()) {
        return x.mul(mask);
    }
    #[cfg(any(feature = "flex", feature = "cube"))]
    {
        let out = <burn::backend::Dispatch as GradMaskBackend>::grad_masked(
            x.into_dispatch(),
            mask.into_dispatch(),
        );
        Tensor::from_dispatch(out)
    }
    #[cfg(not(any(feature = "flex", feature = "cube")))]
    unreachable!("split_available is false without a backend of this crate")
}

#[cfg(feature = "flex")]
impl GradMaskBackend for burn::backend::flex::Flex {
    fn grad_masked(x: FloatTensor<Self>, _mask: FloatTensor<Self>) -> FloatTensor<Self> {
        x
    }
}

#[cfg(feature = "cube")]
impl GradMaskBackend for burn_cubecl::CubeBackend {
    fn grad_masked(x: FloatTensor<Self>, _mask: FloatTensor<Self>) -> FloatTensor<Self> {
        x
    }
}
