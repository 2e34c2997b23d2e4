//! The pick's kernels for the CubeCL backends: one thread per picked element forward, one per
//! element of the input backward; the positions are written to the device from the host.

use burn::tensor::DType;
use burn_cubecl::CubeBackend;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::PickBackend;
use crate::cat::taken;
use crate::support::cube::{elementwise, empty_shaped, f32_strided, packed, strided_at};

/// `out[i] = x[src[i]]` (the gaps between the parts point at element 0: written, never read).
#[cube(launch)]
fn pick_kernel(x: &Tensor<f32>, src: &[u32], out: &mut [f32]) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        out[i] = x[strided_at(x, src[i] as usize)];
    }
}

/// `out[j] = Σ_t Σ_{i: index[starts[t] + i] = j} g_t[i]`, part after part, 0 where none.
#[cube(launch)]
fn pick_grad_kernel(
    gs: &Sequence<OwnedTensor<f32>>,
    index: &[u32],
    starts: Sequence<usize>,
    out: &mut [f32],
) {
    let j = ABSOLUTE_POS;
    if j < out.len() {
        let mut acc = 0.0f32;
        #[unroll]
        for t in 0..comptime!(gs.len()) {
            let g = &gs[t];
            let start = starts[t];
            for i in 0..g.shape(0) {
                if index[start + i] as usize == j {
                    acc += g[strided_at(g, i)];
                }
            }
        }
        out[j] = acc;
    }
}

/// The panics' name for these kernels.
const OP: &str = "pick";

/// `values` as a u32 buffer on `like`'s device.
fn positions(like: &CubeTensor, values: &[u32]) -> CubeTensor {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let handle = like.client.create_from_slice(&bytes);
    let (client, device) = (like.client.clone(), like.device.clone());
    CubeTensor::new_contiguous(client, device, [values.len()].into(), handle, DType::U32)
}

/// A position as the kernels' u32 index.
fn at(i: usize) -> u32 {
    u32::try_from(i).unwrap_or_else(|_| panic!("{OP}: position {i} past the kernels' u32"))
}

impl PickBackend for CubeBackend {
    fn pick_parts(x: CubeTensor, index: Vec<Vec<usize>>) -> Vec<CubeTensor> {
        let x = f32_strided(x, OP);
        let out = packed(&x, index.iter().map(|part| vec![part.len()]).collect());
        let mut src = vec![0u32; out.flat.meta.num_elements()];
        for (part, &start) in index.iter().zip(&out.starts) {
            for (k, &i) in part.iter().enumerate() {
                src[start + k] = at(i);
            }
        }
        let src = positions(&x, &src);
        let client = x.client.clone();
        let (cubes, dim) = elementwise(&client, out.flat.meta.num_elements());
        pick_kernel::launch(
            &client,
            cubes,
            dim,
            x.into_tensor_arg(),
            src.into_buffer_arg(),
            out.flat.clone().into_buffer_arg(),
        );
        out.parts()
    }

    fn pick_grad(
        g0: CubeTensor,
        g1: CubeTensor,
        g2: CubeTensor,
        g3: CubeTensor,
        g4: CubeTensor,
        g5: CubeTensor,
        g6: CubeTensor,
        g7: CubeTensor,
        count: usize,
        index: Vec<Vec<usize>>,
        n: usize,
    ) -> CubeTensor {
        let gs = taken([g0, g1, g2, g3, g4, g5, g6, g7], count);
        let (mut flat, mut starts, mut args) =
            (Vec::new(), SequenceArg::new(), SequenceArg::<OwnedTensor<f32>>::new());
        for (g, part) in gs.iter().zip(&index) {
            assert_eq!(g.meta.shape().to_vec(), vec![part.len()], "{OP}: a part's gradient");
            starts.push(flat.len());
            flat.extend(part.iter().map(|&i| at(i)));
            args.push(f32_strided(g.clone(), OP).into_tensor_arg());
        }
        let index = positions(&gs[0], &flat);
        let out = empty_shaped(&gs[0], vec![n]);
        let (cubes, dim) = elementwise(&out.client, n);
        pick_grad_kernel::launch(
            &out.client,
            cubes,
            dim,
            args,
            index.into_buffer_arg(),
            starts,
            out.clone().into_buffer_arg(),
        );
        out
    }
}
