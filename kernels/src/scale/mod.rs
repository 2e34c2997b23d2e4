//! `y · w[i]` for one value `w[i]` of a weight vector (a mixed op's `w_i · op_i(x)`, a
//! per-tensor LSQ step's gradient term), and `acc + y · w[i]` (a mixed op's running sum), with a
//! gradient of `w` that keeps a GPU busy, on the CubeCL backends.
//!
//! As Burn's broadcast product, the gradient of `w` is `Σ ∂out ⊙ y` over the whole activation,
//! and Burn's CubeCL backends, built without CubeCL's autotune, reduce it with one thread, one
//! such sum per candidate op of every edge: most of a GPU step's kernel time
//! (`docs/results/2026-11-27-gpu-h200-reductions.md`). Here the
//! forward is one launch, and the backward two: the first writes `∂y = ∂out · w[i]` and sums
//! `∂out ⊙ y` per chunk of 4 096 values (one cube of 256 threads per chunk, each thread a fixed
//! stride of it, then a tree in shared memory), the second sums the chunks' partial sums in the
//! same way into `∂w` (zero but at `i`); the result does not depend on thread timing.
//!
//! A mixed op's `Σ_i w_i · op_i(x)` as Burn expressions is a slice of `w`, a product and an add
//! per candidate forward, and a zero fill and a slice assignment per candidate backward (the
//! slice's gradient): [`add_scaled`] reads `w[i]` in place and adds in the same launch, so a
//! candidate costs one launch forward and two backward instead of three and four. On CUDA the
//! kernel's `acc + y·w` may be contracted into one fused multiply-add: its last bit may differ
//! from the expressions'. Other backends and dtypes keep Burn's expressions ([`scale_available`]
//! decides).

use burn::tensor::{DType, Device, Tensor};

/// Values each cube of the backward's first pass sums.
#[cfg(feature = "cube")]
const CHUNK: usize = 4096;

/// Threads of a cube that sums (a power of two: the tree halves it).
#[cfg(feature = "cube")]
const UNITS: u32 = 256;

/// Whether [`scale`] and [`add_scaled`] run this module's kernels for tensors on `device` with
/// this dtype.
pub fn scale_available(device: &Device, dtype: DType) -> bool {
    crate::support::on_cube(device) && dtype == DType::F32
}

/// `y · w` with `w` `[1]` broadcast over `y` (any rank): `y.mul(w.reshape([1; D]))`, as this
/// module's kernels where [`scale_available`].
pub fn scale<const D: usize>(y: Tensor<D>, w: Tensor<1>) -> Tensor<D> {
    assert_eq!(w.dims(), [1], "scale: the weight must hold one value");
    scale_at(y, w, 0)
}

/// `y · w[i]` broadcast over `y`: `y.mul(w.slice(i..i + 1).reshape([1; D]))`, as this module's
/// kernels where [`scale_available`] (the gradient of `w` zero but at `i`).
pub fn scale_at<const D: usize>(y: Tensor<D>, w: Tensor<1>, i: usize) -> Tensor<D> {
    let index = weight_index(&w, i);
    if !scale_available(&y.device(), y.dtype()) {
        return y.mul(slice_one(w, i));
    }
    #[cfg(feature = "cube")]
    {
        let out = <burn::backend::Dispatch as ScaleBackend>::scale_by(
            y.into_dispatch(),
            w.into_dispatch(),
            index,
        );
        Tensor::from_dispatch(out)
    }
    #[cfg(not(feature = "cube"))]
    unreachable!("scale_available is false without the CubeCL backends: {index}")
}

/// `acc + y · w[i]` (`y · w[i]` without `acc`): `acc.add(y.mul(w.slice(i..i + 1)…))`, as one
/// launch of this module's kernels where [`scale_available`]. `acc`'s buffer is reused when it
/// is contiguous and not shared.
///
/// # Panics
/// If `acc` and `y` differ in shape, or `i` is outside `w`.
pub fn add_scaled<const D: usize>(
    acc: Option<Tensor<D>>,
    y: Tensor<D>,
    w: Tensor<1>,
    i: usize,
) -> Tensor<D> {
    let Some(acc) = acc else { return scale_at(y, w, i) };
    assert_eq!(acc.dims(), y.dims(), "add_scaled: the sum and the term differ in shape");
    let index = weight_index(&w, i);
    if !scale_available(&y.device(), y.dtype()) || acc.dtype() != y.dtype() {
        return acc.add(y.mul(slice_one(w, i)));
    }
    #[cfg(feature = "cube")]
    {
        let out = <burn::backend::Dispatch as ScaleBackend>::add_scaled(
            acc.into_dispatch(),
            y.into_dispatch(),
            w.into_dispatch(),
            index,
        );
        Tensor::from_dispatch(out)
    }
    #[cfg(not(feature = "cube"))]
    unreachable!("scale_available is false without the CubeCL backends: {index}")
}

/// `i` as the kernels' index, checked against `w`'s length.
fn weight_index(w: &Tensor<1>, i: usize) -> u32 {
    let [len] = w.dims();
    assert!(i < len, "scale: weight {i} of a vector of {len}");
    u32::try_from(i).unwrap_or(u32::MAX)
}

/// `w[i]` as a `[1; D]` tensor that broadcasts over a rank-`D` one.
fn slice_one<const D: usize>(w: Tensor<1>, i: usize) -> Tensor<D> {
    w.slice(i..i + 1).reshape([1; D])
}

#[cfg(feature = "cube")]
pub use extension::ScaleBackend;

#[cfg(feature = "cube")]
mod cube;
#[cfg(feature = "cube")]
mod extension;
