//! `y · w[i]` for one value `w[i]` of a weight vector (a mixed op's `w_i · op_i(x)`, a
//! per-tensor LSQ step's gradient term), and `acc + y · w[i]` (a mixed op's running sum), with a
//! gradient of `w` that keeps a GPU busy, on the CubeCL backends.
//!
//! As Burn's broadcast product, the gradient of `w` is `Σ ∂out ⊙ y` over the whole activation,
//! and Burn's CubeCL backends, built without CubeCL's autotune, reduce it with one thread: on an
//! H200 a DARTS-shape first-order step spent 5.8 s of its 7.7 s of kernel time in these sums
//! (935 launches of 6.2 ms each, 896 of them one per candidate op of every edge). Here the
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
    crate::lanes::on_cube(device) && dtype == DType::F32
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
mod extension {
    use burn::backend::autodiff::Autodiff;
    use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
    use burn::backend::autodiff::grads::Gradients;
    use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, binary};
    use burn::backend::{
        AutodiffBackend, Backend, TensorMetadata, backend_extension, tensor::FloatTensor,
    };

    /// The scaling kernels (see [`scale_available`](super::scale_available)).
    #[backend_extension(Cube, Autodiff)]
    pub trait ScaleBackend: Backend {
        /// `y · w[index]`.
        fn scale_by(y: FloatTensor<Self>, w: FloatTensor<Self>, index: u32) -> FloatTensor<Self>;

        /// `acc + y · w[index]` (`acc`'s shape).
        fn add_scaled(
            acc: FloatTensor<Self>,
            y: FloatTensor<Self>,
            w: FloatTensor<Self>,
            index: u32,
        ) -> FloatTensor<Self>;

        /// `(∂y, ∂w) = (∂out · w[index], Σ ∂out ⊙ y at index and 0 elsewhere)`.
        fn scale_by_backward(
            y: FloatTensor<Self>,
            w: FloatTensor<Self>,
            grad: FloatTensor<Self>,
            index: u32,
        ) -> (FloatTensor<Self>, FloatTensor<Self>);

        /// `∂w` alone: `Σ ∂out ⊙ y` at `index` of `len` values, 0 elsewhere.
        fn scale_by_weight_grad(
            y: FloatTensor<Self>,
            grad: FloatTensor<Self>,
            index: u32,
            len: u32,
        ) -> FloatTensor<Self>;
    }

    /// The length of a rank-1 weight vector, as the kernels' index type.
    fn len_of<B: Backend>(w: &FloatTensor<B>) -> u32 {
        u32::try_from(w.shape().num_elements()).unwrap_or(u32::MAX)
    }

    impl<B: Backend + ScaleBackend, C: CheckpointStrategy> ScaleBackend for Autodiff<B, C> {
        fn scale_by(y: FloatTensor<Self>, w: FloatTensor<Self>, index: u32) -> FloatTensor<Self> {
            #[derive(Debug)]
            struct ScaleStep(u32);

            impl<B: Backend + ScaleBackend> Backward<B, 2> for ScaleStep {
                type State = (FloatTensor<B>, FloatTensor<B>);

                fn backward(
                    self,
                    ops: Ops<Self::State, 2>,
                    grads: &mut Gradients,
                    _checkpointer: &mut Checkpointer,
                ) {
                    let (y, w) = ops.state;
                    let index = self.0;
                    if let [Some(node_y), Some(node_w)] = &ops.parents {
                        let grad = grads.consume::<B>(&ops.node);
                        let (dy, dw) = B::scale_by_backward(y, w, grad, index);
                        grads.register::<B>(node_y.id, dy);
                        grads.register::<B>(node_w.id, dw);
                        return;
                    }
                    let len = len_of::<B>(&w);
                    binary::<B, _, _>(
                        ops.parents,
                        ops.node,
                        grads,
                        |grad| B::scale_by(grad, w, index),
                        |grad| B::scale_by_weight_grad(y, grad, index, len),
                    );
                }
            }

            match ScaleStep(index).prepare::<C>([y.node(), w.node()]).compute_bound().stateful() {
                OpsKind::Tracked(prep) => {
                    let (yp, wp) = (y.primitive().clone(), w.primitive().clone());
                    let out = B::scale_by(yp.clone(), wp.clone(), index);
                    prep.finish((yp, wp), out)
                }
                OpsKind::UnTracked(prep) => {
                    prep.finish(B::scale_by(y.into_primitive(), w.into_primitive(), index))
                }
            }
        }

        fn add_scaled(
            acc: FloatTensor<Self>,
            y: FloatTensor<Self>,
            w: FloatTensor<Self>,
            index: u32,
        ) -> FloatTensor<Self> {
            #[derive(Debug)]
            struct AddScaledStep(u32);

            impl<B: Backend + ScaleBackend> Backward<B, 3> for AddScaledStep {
                type State = (FloatTensor<B>, FloatTensor<B>);

                fn backward(
                    self,
                    ops: Ops<Self::State, 3>,
                    grads: &mut Gradients,
                    _checkpointer: &mut Checkpointer,
                ) {
                    let [node_acc, node_y, node_w] = ops.parents;
                    let grad = grads.consume::<B>(&ops.node);
                    let (y, w) = ops.state;
                    let index = self.0;
                    // `∂acc` is `∂out` itself; while it is held here the kernels see the buffer
                    // shared and write `∂y` into one of its own.
                    match (node_y, node_w) {
                        (Some(node_y), Some(node_w)) => {
                            let (dy, dw) = B::scale_by_backward(y, w, grad.clone(), index);
                            grads.register::<B>(node_y.id, dy);
                            grads.register::<B>(node_w.id, dw);
                        }
                        (Some(node_y), None) => {
                            grads.register::<B>(node_y.id, B::scale_by(grad.clone(), w, index));
                        }
                        (None, Some(node_w)) => {
                            let len = len_of::<B>(&w);
                            let dw = B::scale_by_weight_grad(y, grad.clone(), index, len);
                            grads.register::<B>(node_w.id, dw);
                        }
                        (None, None) => {}
                    }
                    if let Some(node_acc) = node_acc {
                        grads.register::<B>(node_acc.id, grad);
                    }
                }
            }

            let nodes = [acc.node(), y.node(), w.node()];
            match AddScaledStep(index).prepare::<C>(nodes).compute_bound().stateful() {
                OpsKind::Tracked(prep) => {
                    let (yp, wp) = (y.primitive().clone(), w.primitive().clone());
                    let out = B::add_scaled(acc.into_primitive(), yp.clone(), wp.clone(), index);
                    prep.finish((yp, wp), out)
                }
                OpsKind::UnTracked(prep) => prep.finish(B::add_scaled(
                    acc.into_primitive(),
                    y.into_primitive(),
                    w.into_primitive(),
                    index,
                )),
            }
        }

        fn scale_by_backward(
            y: FloatTensor<Self>,
            w: FloatTensor<Self>,
            grad: FloatTensor<Self>,
            index: u32,
        ) -> (FloatTensor<Self>, FloatTensor<Self>) {
            let (dy, dw) = B::scale_by_backward(
                y.into_primitive(),
                w.into_primitive(),
                grad.into_primitive(),
                index,
            );
            (Self::from_inner(dy), Self::from_inner(dw))
        }

        fn scale_by_weight_grad(
            y: FloatTensor<Self>,
            grad: FloatTensor<Self>,
            index: u32,
            len: u32,
        ) -> FloatTensor<Self> {
            Self::from_inner(B::scale_by_weight_grad(
                y.into_primitive(),
                grad.into_primitive(),
                index,
                len,
            ))
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

    /// `out = y · w[index]` (`out` contiguous).
    #[cube(launch)]
    fn scale_kernel(
        y: &Tensor<f32>,
        w: &[f32],
        out: &mut [f32],
        n: u32,
        index: u32,
        #[comptime] strided: bool,
    ) {
        let i = ABSOLUTE_POS;
        if i < n as usize {
            out[i] = read(y, i, strided) * w[index as usize];
        }
    }

    /// `out = acc + y · w[index]` (`out` contiguous).
    #[cube(launch)]
    #[allow(clippy::too_many_arguments)]
    fn add_scaled_kernel(
        acc: &Tensor<f32>,
        y: &Tensor<f32>,
        w: &[f32],
        out: &mut [f32],
        n: u32,
        index: u32,
        #[comptime] acc_strided: bool,
        #[comptime] y_strided: bool,
    ) {
        let i = ABSOLUTE_POS;
        if i < n as usize {
            out[i] = read(acc, i, acc_strided) + read(y, i, y_strided) * w[index as usize];
        }
    }

    /// `acc += y · w[index]` over a contiguous `acc` that is ours to overwrite.
    #[cube(launch)]
    fn add_scaled_in_place_kernel(
        acc: &mut [f32],
        y: &Tensor<f32>,
        w: &[f32],
        n: u32,
        index: u32,
        #[comptime] y_strided: bool,
    ) {
        let i = ABSOLUTE_POS;
        if i < n as usize {
            acc[i] += read(y, i, y_strided) * w[index as usize];
        }
    }

    /// Per chunk of `chunk` values (cube `c`: values `c·chunk ..`): `partials[c] = Σ ∂out ⊙ y`,
    /// and with `write_dy` also `dy = ∂out · w[index]` there.
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
        index: u32,
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
            scale = w[index as usize];
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
        index: u32,
        #[comptime] units: usize,
        #[comptime] y_strided: bool,
    ) {
        let mut shared = Shared::<[f32]>::new_slice(units);
        let start = CUBE_POS_X * chunk;
        let end = select(start + chunk < n, start + chunk, n);
        let scale = w[index as usize];
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

    /// `out[index] = Σ partials[..count]` and `out[j] = 0` for the other `j < len`, one cube.
    #[cube(launch)]
    fn total_kernel(
        partials: &[f32],
        out: &mut [f32],
        count: u32,
        index: u32,
        len: u32,
        #[comptime] units: usize,
    ) {
        let mut shared = Shared::<[f32]>::new_slice(units);
        let mut acc = 0.0f32;
        let mut j = UNIT_POS_X;
        while j < count {
            acc += partials[j as usize];
            j += CUBE_DIM_X;
        }
        let total = cube_sum(&mut shared, acc);
        let mut k = UNIT_POS_X;
        while k < len {
            if k == index {
                out[k as usize] = total;
            } else {
                out[k as usize] = 0.0f32;
            }
            k += CUBE_DIM_X;
        }
    }

    /// The panics' name for these kernels.
    const OP: &str = "scale";

    /// `∂w`, `len` values zero but `Σ ∂out ⊙ y` at `index`, and `∂out · w[index]` when `w` is
    /// given.
    fn backward(
        y: CubeTensor,
        grad: CubeTensor,
        w: Option<CubeTensor>,
        index: u32,
        len: u32,
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
                    index,
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
                    index,
                    UNITS as usize,
                    y_strided,
                    grad_strided,
                    write_dy,
                );
                write_dy.then_some(dy)
            }
        };
        let dw = empty_shaped(&partials, vec![len as usize]);
        total_kernel::launch(
            &client,
            CubeCount::new_1d(1),
            CubeDim::new_1d(UNITS),
            partials.into_buffer_arg(),
            dw.clone().into_buffer_arg(),
            chunks as u32,
            index,
            len,
            UNITS as usize,
        );
        (dy, dw)
    }

    /// `w`, contiguous f32, with `index` inside it.
    fn weight(w: CubeTensor, index: u32) -> CubeTensor {
        let w = f32_contiguous(w, OP);
        let len = w.meta.num_elements();
        assert!((index as usize) < len, "{OP}: weight {index} of a vector of {len}");
        w
    }

    impl ScaleBackend for CubeBackend {
        fn scale_by(y: CubeTensor, w: CubeTensor, index: u32) -> CubeTensor {
            let (y, w) = (f32_strided(y, OP), weight(w, index));
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
                index,
                strided,
            );
            out
        }

        fn add_scaled(acc: CubeTensor, y: CubeTensor, w: CubeTensor, index: u32) -> CubeTensor {
            let (acc, y, w) = (f32_strided(acc, OP), f32_strided(y, OP), weight(w, index));
            assert_eq!(acc.meta.shape(), y.meta.shape(), "{OP}: the sum and the term differ");
            let n = y.meta.num_elements();
            let client = y.client.clone();
            let (cubes, dim) = elementwise(&client, n);
            let y_strided = !y.is_contiguous();
            if acc.is_contiguous() && acc.can_mut() {
                add_scaled_in_place_kernel::launch(
                    &client,
                    cubes,
                    dim,
                    acc.clone().into_buffer_arg(),
                    y.into_tensor_arg(),
                    w.into_buffer_arg(),
                    n as u32,
                    index,
                    y_strided,
                );
                return acc;
            }
            let out = empty_like(&y);
            let acc_strided = !acc.is_contiguous();
            add_scaled_kernel::launch(
                &client,
                cubes,
                dim,
                acc.into_tensor_arg(),
                y.into_tensor_arg(),
                w.into_buffer_arg(),
                out.clone().into_buffer_arg(),
                n as u32,
                index,
                acc_strided,
                y_strided,
            );
            out
        }

        fn scale_by_backward(
            y: CubeTensor,
            w: CubeTensor,
            grad: CubeTensor,
            index: u32,
        ) -> (CubeTensor, CubeTensor) {
            let w = weight(w, index);
            let len = w.meta.num_elements() as u32;
            let (dy, dw) = backward(y, grad, Some(w), index, len);
            (dy.expect("scale: ∂y was asked for"), dw)
        }

        fn scale_by_weight_grad(
            y: CubeTensor,
            grad: CubeTensor,
            index: u32,
            len: u32,
        ) -> CubeTensor {
            assert!(index < len, "{OP}: weight {index} of a vector of {len}");
            backward(y, grad, None, index, len).1
        }
    }
}
