//! The sum of the fan-out's gradients for the CubeCL backends: one thread per element.

use burn_cubecl::CubeBackend;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::FanOutBackend;
use crate::cat::taken;
use crate::support::cube::{elementwise, empty_like, f32_strided, read};

/// `out = ((g₀ + g₁) + g₂) + …` over `gs`, each read through its strides.
#[cube(launch)]
fn sum_kernel(gs: &Sequence<OwnedTensor<f32>>, out: &mut [f32], #[comptime] strided: bool) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        let mut v = read(&gs[0], i, strided);
        #[unroll]
        for t in 1..comptime!(gs.len()) {
            v += read(&gs[t], i, strided);
        }
        out[i] = v;
    }
}

impl FanOutBackend for CubeBackend {
    fn fan_out(x: CubeTensor, uses: usize) -> Vec<CubeTensor> {
        vec![x; uses]
    }

    fn sum_parts(
        g0: CubeTensor,
        g1: CubeTensor,
        g2: CubeTensor,
        g3: CubeTensor,
        g4: CubeTensor,
        g5: CubeTensor,
        g6: CubeTensor,
        g7: CubeTensor,
        count: usize,
    ) -> CubeTensor {
        let gs: Vec<CubeTensor> = taken([g0, g1, g2, g3, g4, g5, g6, g7], count)
            .into_iter()
            .map(|g| f32_strided(g, "fan-out"))
            .collect();
        for g in &gs[1..] {
            assert_eq!(g.meta.shape(), gs[0].meta.shape(), "fan-out: gradients of two shapes");
        }
        let out = empty_like(&gs[0]);
        let (cubes, dim) = elementwise(&out.client, out.meta.num_elements());
        let strided = gs.iter().any(|g| !g.is_contiguous());
        let mut args = SequenceArg::<OwnedTensor<f32>>::new();
        for g in gs {
            args.push(g.into_tensor_arg());
        }
        sum_kernel::launch(&out.client, cubes, dim, args, out.clone().into_buffer_arg(), strided);
        out
    }
}
