//! `y · w` for a one-value weight `w` `[1]` (a mixed op's `w_i · op_i(x)`, a per-tensor LSQ
//! step's gradient term), with a gradient of `w` that keeps a GPU busy, on the CubeCL backends.
//!
//! As Burn's broadcast product, the gradient of `w` is `Σ ∂out ⊙ y` over the whole activation,
//! and Burn's CubeCL backends, built without CubeCL's autotune, reduce it with one thread: on an
//! H200 a DARTS-shape first-order step spent 5.8 s of its 7.7 s of kernel time in these sums
//! (935 launches of 6.2 ms each, 896 of them one per candidate op of every edge). Here the
//! forward is one launch, and the backward two: the first writes `∂y = ∂out · w` and sums
//! `∂out ⊙ y` per chunk of 4 096 values (one cube of 256 threads per chunk, each thread a fixed
//! stride of it, then a tree in shared memory), the second sums the chunks' partial sums in the
//! same way; the result does not depend on thread timing. Other backends and dtypes keep Burn's
//! product ([`scale`] decides).

use burn::tensor::{DType, Device, Tensor};

/// Values each cube of the backward's first pass sums.
#[cfg(feature = "cube")]
const CHUNK: usize = 4096;

/// Threads of a cube that sums (a power of two: the tree halves it).
#[cfg(feature = "cube")]
const UNITS: u32 = 256;

/// Whether [`scale`] runs this module's kernels for tensors on `device` with this dtype.
pub fn scale_available(device: &Device, dtype: DType) -> bool {
    crate::lanes::on_cube(device) && dtype == DType::F32
}

/// `y · w` with `w` `[1]` broadcast over `y` (any rank): `y.mul(w.reshape([1; D]))`, as this
/// module's kernels where [`scale_available`].
pub fn scale<const D: usize>(y: Tensor<D>, w: Tensor<1>) -> Tensor<D> {
    assert_eq!(w.dims(), [1], "scale: the weight must hold one value");
    if !scale_available(&y.device(), y.dtype()) {
        return y.mul(w.reshape([1; D]));
    }
    #[cfg(feature = "cube")]
    {
        let out = <burn::backend::Dispatch as ScaleBackend>::scale_by(
            y.into_dispatch(),
            w.into_dispatch(),
        );
        Tensor::from_dispatch(out)
    }
    #[cfg(not(feature = "cube"))]
    unreachable!("scale_available is false without the CubeCL backends")
}

#[cfg(feature = "cube")]
pub use extension::ScaleBackend;

#[cfg(feature = "cube")]
mod extension {
    use burn::backend::autodiff::Autodiff;
    use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
    use burn::backend::autodiff::grads::Gradients;
    use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, binary};
    use burn::backend::{AutodiffBackend, Backend, backend_extension, tensor::FloatTensor};

    /// The scaling kernels (see [`scale_available`](super::scale_available)).
    #[backend_extension(Cube, Autodiff)]
    pub trait ScaleBackend: Backend {
        /// `y · w[0]`.
        fn scale_by(y: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self>;

        /// `(∂y, ∂w) = (∂out · w[0], [Σ ∂out ⊙ y])`.
        fn scale_by_backward(
            y: FloatTensor<Self>,
            w: FloatTensor<Self>,
            grad: FloatTensor<Self>,
        ) -> (FloatTensor<Self>, FloatTensor<Self>);

        /// `∂w = [Σ ∂out ⊙ y]` alone.
        fn scale_by_weight_grad(y: FloatTensor<Self>, grad: FloatTensor<Self>)
        -> FloatTensor<Self>;
    }

    impl<B: Backend + ScaleBackend, C: CheckpointStrategy> ScaleBackend for Autodiff<B, C> {
        fn scale_by(y: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
            #[derive(Debug)]
            struct ScaleStep;

            impl<B: Backend + ScaleBackend> Backward<B, 2> for ScaleStep {
                type State = (FloatTensor<B>, FloatTensor<B>);

                fn backward(
                    self,
                    ops: Ops<Self::State, 2>,
                    grads: &mut Gradients,
                    _checkpointer: &mut Checkpointer,
                ) {
                    let (y, w) = ops.state;
                    if let [Some(node_y), Some(node_w)] = &ops.parents {
                        let grad = grads.consume::<B>(&ops.node);
                        let (dy, dw) = B::scale_by_backward(y, w, grad);
                        grads.register::<B>(node_y.id, dy);
                        grads.register::<B>(node_w.id, dw);
                        return;
                    }
                    binary::<B, _, _>(
                        ops.parents,
                        ops.node,
                        grads,
                        |grad| B::scale_by(grad, w),
                        |grad| B::scale_by_weight_grad(y, grad),
                    );
                }
            }

            match ScaleStep.prepare::<C>([y.node(), w.node()]).compute_bound().stateful() {
                OpsKind::Tracked(prep) => {
                    let (yp, wp) = (y.primitive().clone(), w.primitive().clone());
                    let out = B::scale_by(yp.clone(), wp.clone());
                    prep.finish((yp, wp), out)
                }
                OpsKind::UnTracked(prep) => {
                    prep.finish(B::scale_by(y.into_primitive(), w.into_primitive()))
                }
            }
        }

        fn scale_by_backward(
            y: FloatTensor<Self>,
            w: FloatTensor<Self>,
            grad: FloatTensor<Self>,
        ) -> (FloatTensor<Self>, FloatTensor<Self>) {
            let (dy, dw) =
                B::scale_by_backward(y.into_primitive(), w.into_primitive(), grad.into_primitive());
            (Self::from_inner(dy), Self::from_inner(dw))
        }

        fn scale_by_weight_grad(
            y: FloatTensor<Self>,
            grad: FloatTensor<Self>,
        ) -> FloatTensor<Self> {
            Self::from_inner(B::scale_by_weight_grad(y.into_primitive(), grad.into_primitive()))
        }
    }
}

#[cfg(feature = "cube")]
mod cube {
    use burn_cubecl::CubeBackend;
    use burn_cubecl::tensor::CubeTensor;
    use cubecl::prelude::*;

    use super::{CHUNK, ScaleBackend, UNITS};
    use crate::lanes::cube::{
        cube_sum, elementwise, empty_like, empty_shaped, f32_contiguous, f32_strided, read,
    };

    /// `out = y · w[0]` (`out` contiguous).
    #[cube(launch)]
    fn scale_kernel(
        y: &Tensor<f32>,
        w: &[f32],
        out: &mut [f32],
        n: u32,
        #[comptime] strided: bool,
    ) {
        let i = ABSOLUTE_POS;
        if i < n as usize {
            out[i] = read(y, i, strided) * w[0];
        }
    }

    /// Per chunk of `chunk` values (cube `c`: values `c·chunk ..`): `partials[c] = Σ ∂out ⊙ y`,
    /// and with `write_dy` also `dy = ∂out · w[0]` there.
    #[cube(launch)]
    #[allow(clippy::too_many_arguments)]
    fn partials_kernel(
        y: &Tensor<f32>,
        grad: &Tensor<f32>,
        w: &[f32],
        dy: &mut [f32],
        partials: &mut [f32],
        n: u32,
        chunk: u32,
        #[comptime] units: usize,
        #[comptime] y_strided: bool,
        #[comptime] grad_strided: bool,
        #[comptime] write_dy: bool,
    ) {
        let mut shared = Shared::<[f32]>::new_slice(units);
        let start = CUBE_POS_X * chunk;
        let end = select(start + chunk < n, start + chunk, n);
        let mut scale = 0.0f32;
        if write_dy {
            scale = w[0];
        }
        let mut acc = 0.0f32;
        let mut j = start + UNIT_POS_X;
        while j < end {
            let g = read(grad, j as usize, grad_strided);
            acc += g * read(y, j as usize, y_strided);
            if write_dy {
                dy[j as usize] = g * scale;
            }
            j += CUBE_DIM_X;
        }
        let total = cube_sum(&mut shared, acc);
        if UNIT_POS_X == 0 {
            partials[CUBE_POS_X as usize] = total;
        }
    }

    /// [`partials_kernel`] with `write_dy`, `∂y` written over a contiguous `∂out` that is ours
    /// to overwrite (each value read, then replaced, by the same thread).
    #[cube(launch)]
    #[allow(clippy::too_many_arguments)]
    fn partials_in_place_kernel(
        y: &Tensor<f32>,
        grad: &mut [f32],
        w: &[f32],
        partials: &mut [f32],
        n: u32,
        chunk: u32,
        #[comptime] units: usize,
        #[comptime] y_strided: bool,
    ) {
        let mut shared = Shared::<[f32]>::new_slice(units);
        let start = CUBE_POS_X * chunk;
        let end = select(start + chunk < n, start + chunk, n);
        let scale = w[0];
        let mut acc = 0.0f32;
        let mut j = start + UNIT_POS_X;
        while j < end {
            let g = grad[j as usize];
            acc += g * read(y, j as usize, y_strided);
            grad[j as usize] = g * scale;
            j += CUBE_DIM_X;
        }
        let total = cube_sum(&mut shared, acc);
        if UNIT_POS_X == 0 {
            partials[CUBE_POS_X as usize] = total;
        }
    }

    /// `out[0] = Σ partials[..count]`, one cube.
    #[cube(launch)]
    fn total_kernel(partials: &[f32], out: &mut [f32], count: u32, #[comptime] units: usize) {
        let mut shared = Shared::<[f32]>::new_slice(units);
        let mut acc = 0.0f32;
        let mut j = UNIT_POS_X;
        while j < count {
            acc += partials[j as usize];
            j += CUBE_DIM_X;
        }
        let total = cube_sum(&mut shared, acc);
        if UNIT_POS_X == 0 {
            out[0] = total;
        }
    }

    /// The panics' name for these kernels.
    const OP: &str = "scale";

    /// `[Σ ∂out ⊙ y]`, and `∂out · w[0]` when `w` is given.
    fn backward(
        y: CubeTensor,
        grad: CubeTensor,
        w: Option<CubeTensor>,
    ) -> (Option<CubeTensor>, CubeTensor) {
        let (y, grad) = (f32_strided(y, OP), f32_strided(grad, OP));
        assert_eq!(y.meta.shape(), grad.meta.shape(), "{OP}: y and ∂out differ in shape");
        let n = y.meta.num_elements();
        let chunks = n.div_ceil(CHUNK).max(1);
        let partials = empty_shaped(&y, vec![chunks]);
        let write_dy = w.is_some();
        let w = w.map(|w| f32_contiguous(w, OP));
        let client = y.client.clone();
        let (y_strided, grad_strided) = (!y.is_contiguous(), !grad.is_contiguous());
        let (cubes, dim) = (CubeCount::new_1d(chunks as u32), CubeDim::new_1d(UNITS));
        // The upstream gradient is usually contiguous and owned here: scale it in place.
        let dy = match w {
            Some(w) if !grad_strided && grad.can_mut() => {
                partials_in_place_kernel::launch(
                    &client,
                    cubes,
                    dim,
                    y.into_tensor_arg(),
                    grad.clone().into_buffer_arg(),
                    w.into_buffer_arg(),
                    partials.clone().into_buffer_arg(),
                    n as u32,
                    CHUNK as u32,
                    UNITS as usize,
                    y_strided,
                );
                Some(grad)
            }
            w => {
                let dy = if write_dy { empty_like(&grad) } else { empty_shaped(&y, vec![1]) };
                // Without `w` the kernel reads none: a buffer of its own stands in (one bound
                // twice in a launch is refused by some APIs when either binding is written).
                let w_arg = w.unwrap_or_else(|| empty_shaped(&y, vec![1]));
                partials_kernel::launch(
                    &client,
                    cubes,
                    dim,
                    y.into_tensor_arg(),
                    grad.into_tensor_arg(),
                    w_arg.into_buffer_arg(),
                    dy.clone().into_buffer_arg(),
                    partials.clone().into_buffer_arg(),
                    n as u32,
                    CHUNK as u32,
                    UNITS as usize,
                    y_strided,
                    grad_strided,
                    write_dy,
                );
                write_dy.then_some(dy)
            }
        };
        let dw = empty_shaped(&partials, vec![1]);
        total_kernel::launch(
            &client,
            CubeCount::new_1d(1),
            CubeDim::new_1d(UNITS),
            partials.into_buffer_arg(),
            dw.clone().into_buffer_arg(),
            chunks as u32,
            UNITS as usize,
        );
        (dy, dw)
    }

    impl ScaleBackend for CubeBackend {
        fn scale_by(y: CubeTensor, w: CubeTensor) -> CubeTensor {
            let (y, w) = (f32_strided(y, OP), f32_contiguous(w, OP));
            assert_eq!(w.meta.num_elements(), 1, "{OP}: the weight must hold one value");
            let n = y.meta.num_elements();
            let out = empty_like(&y);
            let client = y.client.clone();
            let (cubes, dim) = elementwise(&client, n);
            let strided = !y.is_contiguous();
            scale_kernel::launch(
                &client,
                cubes,
                dim,
                y.into_tensor_arg(),
                w.into_buffer_arg(),
                out.clone().into_buffer_arg(),
                n as u32,
                strided,
            );
            out
        }

        fn scale_by_backward(
            y: CubeTensor,
            w: CubeTensor,
            grad: CubeTensor,
        ) -> (CubeTensor, CubeTensor) {
            let (dy, dw) = backward(y, grad, Some(w));
            (dy.expect("scale: ∂y was asked for"), dw)
        }

        fn scale_by_weight_grad(y: CubeTensor, grad: CubeTensor) -> CubeTensor {
            backward(y, grad, None).1
        }
    }
}
