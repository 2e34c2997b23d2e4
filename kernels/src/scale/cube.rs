//! The scaling kernels for the CubeCL backends: `y · w[i]`, `acc + y · w[i]` and the gradient of
//! `w` in chunks.

use burn_cubecl::CubeBackend;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::{CHUNK, ScaleBackend, UNITS};
use crate::support::cube::{
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

    fn scale_by_weight_grad(y: CubeTensor, grad: CubeTensor, index: u32, len: u32) -> CubeTensor {
        assert!(index < len, "{OP}: weight {index} of a vector of {len}");
        backward(y, grad, None, index, len).1
    }
}
