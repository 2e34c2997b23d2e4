//! The held max pool (`crate::hold::max_pool2d_at`): the second order's passes at `w±` pool
//! each window's element that was its first maximum at `w`.

use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::{Dims, OP, at, coordinates, first_max, plane_at, shapes};
use crate::plane::PlaneGeom;
use crate::support::cube::{elementwise, empty_shaped, f32_strided};

/// Max pooling of `x` held at `key`'s maxima: each output is `x` at the first maximum of
/// `key`'s window (the element the strict `>` scan picks), NaN where that window holds a NaN.
#[cube(launch)]
fn max_at_kernel(
    x: &Tensor<f32>,
    key: &Tensor<f32>,
    out: &mut [f32],
    d: &Dims,
    nan: f32,
    #[comptime] kh: u32,
    #[comptime] kw: u32,
) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        let (n, c, oh, ow) = coordinates(i as u32, d.channels, d.out_h, d.out_w);
        let tap = first_max(key, plane_at(key, n, c), oh, ow, d, kh, kw);
        let mut v = nan;
        if tap < kh * kw {
            let r = oh * d.stride_h + tap / kw - d.pad_h;
            let col = ow * d.stride_w + tap % kw - d.pad_w;
            v = x[at(x, plane_at(x, n, c), r, col)];
        }
        out[i] = v;
    }
}

/// Max pooling of `x` at `key`'s maxima (`key` of `x`'s shape; see `max_at_kernel`): the
/// held max pool of `crate::hold`, whose gradient is the max pool's backward at `key`.
pub(crate) fn max_at(x: CubeTensor, key: CubeTensor, g: PlaneGeom) -> CubeTensor {
    let (x, key) = (f32_strided(x, OP), f32_strided(key, OP));
    assert_eq!(x.meta.shape(), key.meta.shape(), "{OP}: the key's shape");
    let (_, out_dims, dims, (kh, kw)) = shapes(&x, &g);
    let out = empty_shaped(&x, out_dims.to_vec());
    let client = x.client.clone();
    let (cube_count, cube_dim) = elementwise(&client, out.meta.num_elements());
    max_at_kernel::launch(
        &client,
        cube_count,
        cube_dim,
        x.into_tensor_arg(),
        key.into_tensor_arg(),
        out.clone().into_buffer_arg(),
        dims,
        f32::NAN,
        kh,
        kw,
    );
    out
}
