//! Held rounding in one launch per direction on the CubeCL backends: the quantizer outputs
//! and ReLU masks of the finite-difference passes of DARTS' second-order architecture gradient
//! (`qdarts_ops::quant::hold`).
//!
//! A held quantizer returns `x·m + (a − x_w·m)` for its new input `x`, where `x_w` and `a` are
//! its input and output at `w` and `m` is 1 where `x_w` rounds inside the grid's range, else 0:
//! its output at `w` moved by `x − x_w` inside the range, the clipped value outside. As tensor
//! expressions that was the mask and the offset, a dozen launches per quantizer when recording
//! at `w` and three in each pass at `w±`; here nothing is computed at `w` (the quantizer keeps
//! `x_w` and `a`) and each pass is one launch forward and one backward (`∂x = ∂out·m`). A held
//! ReLU returns `x·[k > 0]` for the value `k` it had at `w` ([`gate`]), one launch each way
//! instead of three forward; a held max pool takes each window's element that was its maximum
//! at `w` ([`max_pool2d_at`]), one launch each way instead of Burn's pool with indices, a
//! gather and their copies (six).
//!
//! The values are the expressions' bit for bit: inside the range `x + (a − x_w)` (the products
//! by 1 are the factors themselves), outside `x·0 + (a − x_w·0)` with the 0 from the host (a NaN
//! or an infinity stays NaN, a sign stays on a zero), chosen by a selection. Written as products
//! by one `m` (`x·m + (a − x_w·m)`), the kernel's values differed from the expressions' in the
//! last bits on Mesa's lavapipe: a shader compiler may reassociate such a sum. The mask is
//! [`crate::fake_quant`]'s rounding, the one its straight-through gradient uses.
//! Other backends keep the expressions.

use burn::tensor::{DType, Device, Tensor};

use crate::fake_quant::FusedLayout;

/// Whether [`held_fake_quant`] and [`gate`] run this module's kernels for tensors on `device`
/// with this dtype.
pub fn hold_available(device: &Device, dtype: DType) -> bool {
    crate::support::on_cube(device) && dtype == DType::F32
}

/// `x·m + (at_w − x_w·m)` with `m` = 1 where `x_w` rounds inside `layout`'s range on the grid
/// (`mult`, `zero_point`: `[1]` or `[layout.channels]`), else 0; the gradient `∂x = ∂out·m`
/// (`x_w`, `at_w` and the grid are constants). `x_w` and `at_w` have `x`'s shape.
///
/// # Panics
/// Where [`hold_available`] is false, or if the shapes differ.
pub fn held_fake_quant<const D: usize>(
    x: Tensor<D>,
    x_w: Tensor<D>,
    at_w: Tensor<D>,
    mult: &Tensor<1>,
    zero_point: &Tensor<1>,
    layout: FusedLayout,
) -> Tensor<D> {
    assert!(
        hold_available(&x.device(), x.dtype()),
        "held fake quant: not available on {:?} for {:?}",
        x.device(),
        x.dtype()
    );
    assert!(x.dims() == x_w.dims() && x.dims() == at_w.dims(), "held fake quant: shapes differ");
    #[cfg(feature = "cube")]
    {
        let param = |p: &Tensor<1>| layout.param(p);
        let constant = |t: Tensor<D>| t.detach().into_dispatch();
        let out = <burn::backend::Dispatch as HoldBackend>::held_fake_quant(
            x.into_dispatch(),
            constant(x_w),
            constant(at_w),
            param(mult),
            param(zero_point),
            layout,
        );
        Tensor::from_dispatch(out)
    }
    #[cfg(not(feature = "cube"))]
    unreachable!(
        "hold_available is false without the CubeCL backends: {layout:?} {mult:?} {zero_point:?}"
    )
}

/// `x·[key > 0]` (the factor a float 0 or 1), with the gradient `∂x = ∂out·[key > 0]` (`key`
/// is a constant of `x`'s shape).
///
/// # Panics
/// Where [`hold_available`] is false, or if the shapes differ.
pub fn gate<const D: usize>(x: Tensor<D>, key: Tensor<D>) -> Tensor<D> {
    assert!(
        hold_available(&x.device(), x.dtype()),
        "gate: not available on {:?} for {:?}",
        x.device(),
        x.dtype()
    );
    assert_eq!(x.dims(), key.dims(), "gate: shapes differ");
    #[cfg(feature = "cube")]
    {
        let key = key.detach().into_dispatch();
        Tensor::from_dispatch(<burn::backend::Dispatch as HoldBackend>::gate(
            x.into_dispatch(),
            key,
        ))
    }
    #[cfg(not(feature = "cube"))]
    unreachable!("hold_available is false without the CubeCL backends: {key:?}")
}

/// Max pooling of `x` held at the maxima of `key` (its values at `w`): each window's output is
/// `x` at the element that was the window's first maximum in `key` (the strict `>` scan's
/// pick), and its gradient goes there; one launch each way. `None` where [`hold_available`]
/// is false or the pooling is not one this crate's pools run (see
/// [`max_pool2d`](crate::pool2d::max_pool2d)): the caller picks the maxima itself.
///
/// # Panics
/// If `key`'s shape is not `x`'s.
pub fn max_pool2d_at(
    x: Tensor<4>,
    key: Tensor<4>,
    options: &burn::tensor::ops::MaxPoolOptions<2>,
) -> Option<Tensor<4>> {
    assert_eq!(x.dims(), key.dims(), "held max pool: the key's shape");
    let plain = options.dilation == [1, 1] && !options.ceil_mode;
    let geom = crate::pool2d::plane_geom(&x, options.kernel_size, options.stride, options.padding)
        .filter(|_| plain && hold_available(&x.device(), x.dtype()))?;
    #[cfg(feature = "cube")]
    {
        let key = key.detach().into_dispatch();
        Some(Tensor::from_dispatch(<burn::backend::Dispatch as HoldBackend>::max_pool_at(
            x.into_dispatch(),
            key,
            geom,
        )))
    }
    #[cfg(not(feature = "cube"))]
    unreachable!("hold_available is false without the CubeCL backends: {geom:?} {key:?}")
}

#[cfg(feature = "cube")]
pub use extension::HoldBackend;

#[cfg(feature = "cube")]
mod cube;

#[cfg(feature = "cube")]
mod extension;
