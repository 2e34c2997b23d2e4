//! Tensors laid side by side along one dimension in one launch.
//!
//! Burn's concatenation on the CubeCL runtimes allocates the output and writes each part into
//! it with a launch of its own, so `k` parts cost `k` launches; a batched cell concatenates the
//! columns of every wave, the parts of its cuts' gradients and its nodes, some ten parts a
//! time. Here one kernel reads every part through its strides and writes the output once. The
//! values are the parts' (a copy, bit for bit); the gradient of each part is its slice of the
//! output's gradient, as Burn's `cat` gives it.
//!
//! It runs where this crate's extensions are dispatched (flex, where it is Burn's `cat`, and
//! the CubeCL runtimes, where f32 parts take the kernel and others Burn's `cat`); elsewhere
//! (LibTorch) [`cat`] is Burn's.

use burn::backend::tensor::FloatTensor;
use burn::tensor::{Device, Tensor};

mod extension;

#[cfg(feature = "cube")]
mod cube;

pub(crate) use extension::slots;
#[cfg(feature = "cube")]
pub(crate) use extension::taken;
pub use extension::{ARITY, CatBackend};

/// Whether [`cat`] runs this module's step for tensors on `device` (flex or a CubeCL runtime,
/// where this crate's extensions are dispatched).
pub fn cat_available(device: &Device) -> bool {
    crate::split::split_available(device)
}

/// `parts` side by side along `dim`, as `Tensor::cat` lays them, in one launch per
/// [`ARITY`] parts on the CubeCL runtimes (see the module's notes).
///
/// # Panics
/// If `parts` is empty, or the parts differ in rank-`D` shape other than along `dim`.
pub fn cat<const D: usize>(parts: Vec<Tensor<D>>, dim: usize) -> Tensor<D> {
    assert!(!parts.is_empty(), "cat: no parts");
    assert!(dim < D, "cat: dimension {dim} of a rank-{D} tensor");
    let device = parts[0].device();
    // A part of no extent adds nothing; the kernel takes no empty buffers.
    let mut parts: Vec<Tensor<D>> = parts.into_iter().filter(|p| p.dims()[dim] > 0).collect();
    if parts.len() <= 1 || !cat_available(&device) {
        return match parts.len() {
            0 => Tensor::empty(empty_shape::<D>(dim), &device),
            1 => parts.pop().expect("one part"),
            _ => Tensor::cat(parts, dim),
        };
    }
    #[cfg(any(feature = "flex", feature = "cube"))]
    {
        let parts = parts.into_iter().map(Tensor::into_dispatch).collect();
        Tensor::from_dispatch(cat_primitives::<burn::backend::Dispatch>(parts, dim))
    }
    #[cfg(not(any(feature = "flex", feature = "cube")))]
    unreachable!("cat_available is false without a backend of this crate")
}

/// A shape of no elements (every part was empty along `dim`; the parts' other sizes are lost
/// with them, which only Burn's own `cat` of empty tensors would keep).
fn empty_shape<const D: usize>(dim: usize) -> [usize; D] {
    let mut shape = [1; D];
    shape[dim] = 0;
    shape
}

/// `parts` (at least one) side by side along `dim` on `B`: [`ARITY`] at a time, then those
/// results side by side.
pub(crate) fn cat_primitives<B: CatBackend>(
    mut parts: Vec<FloatTensor<B>>,
    dim: usize,
) -> FloatTensor<B> {
    while parts.len() > ARITY {
        let mut rest = parts.into_iter();
        let mut joined = Vec::new();
        loop {
            let chunk: Vec<_> = rest.by_ref().take(ARITY).collect();
            if chunk.is_empty() {
                break;
            }
            joined.push(cat_chunk::<B>(chunk, dim));
        }
        parts = joined;
    }
    cat_chunk::<B>(parts, dim)
}

/// At most [`ARITY`] parts in one call: the slots past the parts hold the first part again,
/// which the step does not read.
fn cat_chunk<B: CatBackend>(parts: Vec<FloatTensor<B>>, dim: usize) -> FloatTensor<B> {
    let count = parts.len();
    if count == 1 {
        return parts.into_iter().next().expect("one part");
    }
    let [a, b, c, d, e, f, g, h] = slots(parts);
    B::cat_parts(a, b, c, d, e, f, g, h, count, dim)
}
