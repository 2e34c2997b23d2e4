//! The launches of the convolution kernels: the backend impls for `CubeBackend`.

use burn_cubecl::CubeBackend;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::super::{ConvGeom, DirectConvBackend};
use super::{OP, Sizes, forward_kernel, weight_kernel, x_backward_kernel};
use crate::support::cube::{elementwise, empty_shaped, f32_contiguous, f32_strided, reduce_units};

fn dims4(t: &CubeTensor, what: &str) -> [usize; 4] {
    let d = t.meta.shape();
    assert_eq!(d.len(), 4, "{OP}: {what} must be [N, C, H, W], got {d:?}");
    [d[0], d[1], d[2], d[3]]
}

/// The kernel window `(kh, kw)` as the comptime arguments of the unrolled tap loops.
fn window(g: &ConvGeom) -> (u32, u32) {
    let [kh, kw] = g.plane.kernel;
    let u = |v: usize| u32::try_from(v).expect("conv: kernel size");
    (u(kh), u(kw))
}

impl DirectConvBackend for CubeBackend {
    fn direct_conv2d(x: CubeTensor, weight: CubeTensor, geom: ConvGeom) -> CubeTensor {
        let (x, wt) = (f32_strided(x, OP), f32_strided(weight, OP));
        let strided = !x.is_contiguous();
        let [n, ci, _, _] = dims4(&x, "x");
        let co = dims4(&wt, "the weight")[0];
        let s = Sizes::launch(n, ci, co, &geom);
        let out = empty_shaped(&x, vec![n, co, geom.output[0], geom.output[1]]);
        let total = out.meta.num_elements();
        let (cubes, dim) = elementwise(&x.client, total);
        let (kh, kw) = window(&geom);
        forward_kernel::launch(
            &x.client,
            cubes,
            dim,
            x.clone().into_tensor_arg(),
            wt.into_tensor_arg(),
            out.clone().into_buffer_arg(),
            total as u32,
            s,
            kh,
            kw,
            geom.inset.by as u32,
            geom.relu,
            strided,
        );
        out
    }

    fn direct_conv2d_backward(
        x: CubeTensor,
        grad: CubeTensor,
        weight: CubeTensor,
        geom: ConvGeom,
    ) -> (CubeTensor, CubeTensor) {
        let grad = f32_contiguous(grad, OP);
        let dx = Self::direct_conv2d_x_backward(x.clone(), grad.clone(), weight, geom);
        (dx, Self::direct_conv2d_weight_backward(x, grad, geom))
    }

    fn direct_conv2d_x_backward(
        x: CubeTensor,
        grad: CubeTensor,
        weight: CubeTensor,
        geom: ConvGeom,
    ) -> CubeTensor {
        let (grad, wt) = (f32_contiguous(grad, OP), f32_strided(weight, OP));
        // Read only with `relu` (its mask), through its strides.
        let x = f32_strided(x, OP);
        let strided = !x.is_contiguous();
        let [n, co, _, _] = dims4(&grad, "∂y");
        let [_, cig, _, _] = dims4(&wt, "the weight");
        let ci = cig * geom.inputs.count();
        let s = Sizes::launch(n, ci, co, &geom);
        let [h, w] = geom.plane.input;
        let out = empty_shaped(&grad, vec![n, ci, h, w]);
        let total = out.meta.num_elements();
        let (cubes, dim) = elementwise(&grad.client, total);
        let (kh, kw) = window(&geom);
        x_backward_kernel::launch(
            &grad.client,
            cubes,
            dim,
            grad.clone().into_buffer_arg(),
            x.into_tensor_arg(),
            wt.into_tensor_arg(),
            out.clone().into_buffer_arg(),
            total as u32,
            s,
            kh,
            kw,
            geom.plane.stride[0] as u32,
            geom.plane.stride[1] as u32,
            geom.inset.by as u32,
            geom.relu,
            strided,
        );
        out
    }

    fn direct_conv2d_weight_backward(
        x: CubeTensor,
        grad: CubeTensor,
        geom: ConvGeom,
    ) -> CubeTensor {
        let (x, grad) = (f32_strided(x, OP), f32_contiguous(grad, OP));
        let strided = !x.is_contiguous();
        let [n, ci, _, _] = dims4(&x, "x");
        let [_, co, _, _] = dims4(&grad, "∂y");
        let s = Sizes::launch(n, ci, co, &geom);
        let [kh, kw] = geom.plane.kernel;
        let shape = vec![co, ci / geom.inputs.count(), kh, kw];
        let weights: usize = shape.iter().product();
        let out = empty_shaped(&x, shape);
        // One cube per weight, on a 2-D grid: a 1-D grid stops at 65 535 cubes on some APIs.
        let across = weights.clamp(1, 65_535);
        let cubes = CubeCount::new_2d(across as u32, weights.div_ceil(across).max(1) as u32);
        let units = reduce_units(n * geom.output[0] * geom.output[1]);
        weight_kernel::launch(
            &x.client,
            cubes,
            CubeDim::new_1d(units),
            x.clone().into_tensor_arg(),
            grad.into_buffer_arg(),
            out.clone().into_buffer_arg(),
            weights as u32,
            s,
            kh as u32,
            kw as u32,
            units as usize,
            geom.relu,
            strided,
        );
        out
    }
}
