//! Fused fake quantization: quantize → dequantize in one pass over the tensor, and the
//! straight-through backward in one pass over (input, upstream gradient).
//!
//! It is a Burn backend extension ([`FakeQuantBackend`]) with a hand-written autodiff step, so
//! a fake-quantized activation costs one read and one write instead of the dozen temporaries of
//! the composite version (`qdarts_ops::quant::fake_quant`). Both compute the same f32 operations
//! in the same order, so their outputs and gradients are bit-identical; the golden tests run both.
//!
//! Per element, with the grid's per-channel `mult`, `step`, `zero_point` (`z`):
//!
//! - forward: `r = round(x · mult) + z`, `out = (clamp(r, qmin, qmax) − z) · step`;
//! - backward: `∂x = ∂out` where `qmin ≤ r ≤ qmax`, else 0 (recomputed from `x`; after a
//!   per-tensor observer kernel on the CubeCL backends, read from a clip mask of one bit per
//!   element that the forward wrote, so that the backward does not keep `x`: see
//!   [`crate::observe`]).
//!
//! Backends: `flex` runs a tight loop split across the rayon pool; the CubeCL backends (`wgpu`,
//! `cuda`) run one kernel thread per element ([`cube`](self) submodule). Other backends use the composite
//! version ([`fused_available`] says which applies to a tensor).

use burn::backend::AutodiffBackend;
use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn::backend::{Backend, backend_extension, tensor::FloatTensor};
use burn::tensor::{DType, Device, Tensor};

/// The host-side part of a fused call: integer range, rounding and how the `[C]` grid
/// parameters broadcast over the contiguous tensor (element `i` uses channel
/// `(i / inner) % channels`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FusedLayout {
    /// Smallest integer.
    pub qmin: i32,
    /// Largest integer.
    pub qmax: i32,
    /// Ties away from zero (else ties to even).
    pub ties_away: bool,
    /// Length of the grid parameters (1 per tensor).
    pub channels: usize,
    /// Elements per channel run: the product of the dimensions after the channel axis.
    pub inner: usize,
}

impl FusedLayout {
    /// The layout over a tensor of shape `dims` of a grid on the integers `qmin..=qmax`, per
    /// channel along `axis` (`None`: per tensor), rounding ties away from zero or to even.
    pub fn new(dims: &[usize], axis: Option<usize>, qmin: i32, qmax: i32, ties_away: bool) -> Self {
        let (channels, inner) = match axis {
            Some(a) => (dims[a], dims[a + 1..].iter().product()),
            None => (1, dims.iter().product::<usize>().max(1)),
        };
        FusedLayout { qmin, qmax, ties_away, channels, inner: inner.max(1) }
    }

    /// A grid parameter (`[1]` or `[channels]`) as the kernels take it: detached, one value per
    /// channel (a `[1]` parameter of a per-channel grid broadcast), as a dispatch tensor.
    pub(crate) fn param(&self, p: &Tensor<1>) -> burn::tensor::DispatchTensor {
        let p = p.clone().detach();
        let p = if p.dims()[0] == self.channels { p } else { p.expand([self.channels]) };
        p.into_dispatch()
    }
}

/// The fused fake-quant primitive. `mult`, `step` and `zero_point` are `[channels]`.
#[backend_extension(Flex: cfg(feature = "flex"), Cube: cfg(feature = "cube"), Autodiff)]
pub trait FakeQuantBackend: Backend {
    /// Fake-quantizes `x` (see the module docs).
    fn fake_quant_fused(
        x: FloatTensor<Self>,
        mult: FloatTensor<Self>,
        step: FloatTensor<Self>,
        zero_point: FloatTensor<Self>,
        layout: FusedLayout,
    ) -> FloatTensor<Self>;

    /// The straight-through gradient: `grad` where `x` quantizes inside the range, else 0.
    fn fake_quant_fused_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        mult: FloatTensor<Self>,
        zero_point: FloatTensor<Self>,
        layout: FusedLayout,
    ) -> FloatTensor<Self>;
}

/// Whether [`fake_quant_fused`] runs natively for tensors on `device` with this dtype.
pub fn fused_available(device: &Device, dtype: DType) -> bool {
    if dtype != DType::F32 {
        return false;
    }
    #[allow(unused_mut)]
    let mut native = false;
    #[cfg(feature = "flex")]
    {
        native |= *device == Device::flex();
    }
    native || crate::support::on_cube(device)
}

/// Fused fake quantization of `x` on the grid (`mult`, `step`, `zero_point`, each `[1]` or
/// `[layout.channels]`) with the straight-through gradient. The grid parameters are treated as
/// constants (detached), as in the composite version.
///
/// # Panics
/// If [`fused_available`] is false for `x`.
pub fn fake_quant_fused<const D: usize>(
    x: Tensor<D>,
    mult: &Tensor<1>,
    step: &Tensor<1>,
    zero_point: &Tensor<1>,
    layout: FusedLayout,
) -> Tensor<D> {
    assert!(
        fused_available(&x.device(), x.dtype()),
        "fused fake quant is not available on {:?} for {:?}",
        x.device(),
        x.dtype()
    );
    let param = |p: &Tensor<1>| layout.param(p);
    let out = <burn::backend::Dispatch as FakeQuantBackend>::fake_quant_fused(
        x.into_dispatch(),
        param(mult),
        param(step),
        param(zero_point),
        layout,
    );
    Tensor::from_dispatch(out)
}

#[cfg(feature = "cube")]
pub(crate) mod cube;

mod autodiff;
#[cfg(feature = "cube")]
pub(crate) use autodiff::FakeQuantStep;
mod cpu;
#[cfg(feature = "flex")]
mod flex;
