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
//! instead of three forward.
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
    crate::lanes::on_cube(device) && dtype == DType::F32
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

#[cfg(feature = "cube")]
pub use extension::HoldBackend;

#[cfg(feature = "cube")]
mod extension {
    use burn::backend::autodiff::Autodiff;
    use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
    use burn::backend::autodiff::grads::Gradients;
    use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, unary};
    use burn::backend::{AutodiffBackend, Backend, backend_extension, tensor::FloatTensor};

    use crate::fake_quant::FusedLayout;

    /// The held-rounding kernels (see [`hold_available`](super::hold_available)).
    #[backend_extension(Cube, Autodiff)]
    pub trait HoldBackend: Backend {
        /// `x·m + (at_w − x_w·m)` (see [`held_fake_quant`](super::held_fake_quant)).
        fn held_fake_quant(
            x: FloatTensor<Self>,
            x_w: FloatTensor<Self>,
            at_w: FloatTensor<Self>,
            mult: FloatTensor<Self>,
            zero_point: FloatTensor<Self>,
            layout: FusedLayout,
        ) -> FloatTensor<Self>;

        /// `∂out·m`, `m` as in [`held_fake_quant`](Self::held_fake_quant).
        fn held_fake_quant_backward(
            x_w: FloatTensor<Self>,
            grad: FloatTensor<Self>,
            mult: FloatTensor<Self>,
            zero_point: FloatTensor<Self>,
            layout: FusedLayout,
        ) -> FloatTensor<Self>;

        /// `x·[key > 0]`; its own backward (of the gradient, with the same key).
        fn gate(x: FloatTensor<Self>, key: FloatTensor<Self>) -> FloatTensor<Self>;
    }

    impl<B: Backend + HoldBackend, C: CheckpointStrategy> HoldBackend for Autodiff<B, C> {
        fn held_fake_quant(
            x: FloatTensor<Self>,
            x_w: FloatTensor<Self>,
            at_w: FloatTensor<Self>,
            mult: FloatTensor<Self>,
            zero_point: FloatTensor<Self>,
            layout: FusedLayout,
        ) -> FloatTensor<Self> {
            #[derive(Debug)]
            struct HeldStep;

            impl<B: Backend + HoldBackend> Backward<B, 1> for HeldStep {
                type State = (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>, FusedLayout);

                fn backward(
                    self,
                    ops: Ops<Self::State, 1>,
                    grads: &mut Gradients,
                    _checkpointer: &mut Checkpointer,
                ) {
                    let (x_w, mult, zp, layout) = ops.state;
                    unary::<B, _>(ops.parents, ops.node, grads, |grad| {
                        B::held_fake_quant_backward(x_w, grad, mult, zp, layout)
                    });
                }
            }

            let (x_w, at_w) = (x_w.into_primitive(), at_w.into_primitive());
            let (mult, zp) = (mult.into_primitive(), zero_point.into_primitive());
            match HeldStep.prepare::<C>([x.node()]).compute_bound().stateful() {
                OpsKind::Tracked(prep) => {
                    let out = B::held_fake_quant(
                        x.into_primitive(),
                        x_w.clone(),
                        at_w,
                        mult.clone(),
                        zp.clone(),
                        layout,
                    );
                    prep.finish((x_w, mult, zp, layout), out)
                }
                OpsKind::UnTracked(prep) => {
                    prep.finish(B::held_fake_quant(x.into_primitive(), x_w, at_w, mult, zp, layout))
                }
            }
        }

        fn held_fake_quant_backward(
            x_w: FloatTensor<Self>,
            grad: FloatTensor<Self>,
            mult: FloatTensor<Self>,
            zero_point: FloatTensor<Self>,
            layout: FusedLayout,
        ) -> FloatTensor<Self> {
            Self::from_inner(B::held_fake_quant_backward(
                x_w.into_primitive(),
                grad.into_primitive(),
                mult.into_primitive(),
                zero_point.into_primitive(),
                layout,
            ))
        }

        fn gate(x: FloatTensor<Self>, key: FloatTensor<Self>) -> FloatTensor<Self> {
            #[derive(Debug)]
            struct GateStep;

            impl<B: Backend + HoldBackend> Backward<B, 1> for GateStep {
                type State = FloatTensor<B>;

                fn backward(
                    self,
                    ops: Ops<Self::State, 1>,
                    grads: &mut Gradients,
                    _checkpointer: &mut Checkpointer,
                ) {
                    let key = ops.state;
                    unary::<B, _>(ops.parents, ops.node, grads, |grad| B::gate(grad, key));
                }
            }

            let key = key.into_primitive();
            match GateStep.prepare::<C>([x.node()]).compute_bound().stateful() {
                OpsKind::Tracked(prep) => {
                    let out = B::gate(x.into_primitive(), key.clone());
                    prep.finish(key, out)
                }
                OpsKind::UnTracked(prep) => prep.finish(B::gate(x.into_primitive(), key)),
            }
        }
    }
}

#[cfg(feature = "cube")]
mod cube;
