//! The concatenation's kernel for the CubeCL backends: one thread per output element, which
//! finds its part and reads it through the part's strides.

use burn::backend::ops::FloatTensorOps;
use burn::tensor::DType;
use burn_cubecl::CubeBackend;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::extension::{ARITY, CatBackend, taken};
use crate::support::cube::{elementwise, empty_shaped, f32_strided, read};

/// `out` = the parts side by side along `dim`: element `(o, c, j)` of `out` viewed as
/// `[outer, total, inner]` is element `(o, c − start, j)` of the part whose columns along
/// `dim` start at `start` and hold `c`.
#[cube(launch)]
fn cat_kernel(
    parts: &Sequence<OwnedTensor<f32>>,
    out: &mut [f32],
    inner: usize,
    total: usize,
    #[comptime] dim: usize,
    #[comptime] strided: bool,
) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        let row = total * inner;
        let o = i / row;
        let c = (i % row) / inner;
        let j = i % inner;
        let count = comptime!(parts.len());
        let mut start = 0usize;
        let mut v = 0.0f32;
        #[unroll]
        for p in 0..count {
            let part = &parts[p];
            let len = part.shape(dim);
            if c >= start && c < start + len {
                v = read(part, (o * len + c - start) * inner + j, strided);
            }
            start += len;
        }
        out[i] = v;
    }
}

/// `out` = `grad`'s parts along `dim` one after another, each laid out contiguously: part
/// `p` (columns `starts[p]..starts[p + 1]` of `grad` viewed as `[outer, total, inner]`) is
/// the block of `out` from `outer·inner·starts[p]`, as `[outer, len, inner]`.
#[cube(launch)]
fn uncat_kernel(
    grad: &Tensor<f32>,
    out: &mut [f32],
    starts: Sequence<usize>,
    outer: usize,
    inner: usize,
    total: usize,
    #[comptime] strided: bool,
) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        let count = comptime!(starts.len() - 1);
        let mut v = 0.0f32;
        #[unroll]
        for p in 0..count {
            let (start, end) = (starts[p], starts[p + 1]);
            let (from, to) = (outer * inner * start, outer * inner * end);
            if i >= from && i < to {
                let local = i - from;
                let len = end - start;
                let o = local / (len * inner);
                let c = (local / inner) % len;
                let j = local % inner;
                v = read(grad, (o * total + start + c) * inner + j, strided);
            }
        }
        out[i] = v;
    }
}

/// The panics' name for this kernel.
const OP: &str = "cat";

impl CatBackend for CubeBackend {
    fn cat_parts(
        p0: CubeTensor,
        p1: CubeTensor,
        p2: CubeTensor,
        p3: CubeTensor,
        p4: CubeTensor,
        p5: CubeTensor,
        p6: CubeTensor,
        p7: CubeTensor,
        count: usize,
        dim: usize,
    ) -> CubeTensor {
        let parts = taken([p0, p1, p2, p3, p4, p5, p6, p7], count);
        assert!((2..=ARITY).contains(&count), "{OP}: {count} parts");
        if parts.iter().any(|p| p.dtype != DType::F32) {
            return Self::float_cat(parts, dim);
        }
        let first = parts[0].meta.shape().to_vec();
        let mut shape = first.clone();
        shape[dim] = 0;
        for p in &parts {
            let dims = p.meta.shape();
            let agree = dims.len() == first.len()
                && dims.iter().zip(&first).enumerate().all(|(d, (a, b))| d == dim || a == b);
            assert!(agree, "{OP}: shapes {dims:?} and {first:?} differ off dimension {dim}");
            shape[dim] += dims[dim];
        }
        let inner: usize = shape[dim + 1..].iter().product();
        let total = shape[dim];
        let out = empty_shaped(&parts[0], shape);
        let client = out.client.clone();
        let (cubes, cube_dim) = elementwise(&client, out.meta.num_elements());
        let strided = parts.iter().any(|p| !p.is_contiguous());
        let mut args = SequenceArg::<OwnedTensor<f32>>::new();
        for p in parts {
            args.push(f32_strided(p, OP).into_tensor_arg());
        }
        cat_kernel::launch(
            &client,
            cubes,
            cube_dim,
            args,
            out.clone().into_buffer_arg(),
            inner,
            total,
            dim,
            strided,
        );
        out
    }

    fn uncat_parts(grad: CubeTensor, dim: usize, sizes: Vec<usize>) -> Vec<CubeTensor> {
        let shape = grad.meta.shape().to_vec();
        let outer: usize = shape[..dim].iter().product();
        let contiguous = grad.is_contiguous();
        if grad.dtype != DType::F32 || sizes.len() < 2 || (outer == 1 && contiguous) {
            // Slices of a contiguous tensor along its first non-unit dimension are contiguous.
            return crate::split::slices::<Self>(grad, dim, &sizes);
        }
        let inner: usize = shape[dim + 1..].iter().product();
        let total = shape[dim];
        assert_eq!(sizes.iter().sum::<usize>(), total, "{OP}: parts {sizes:?} of {total}");
        let n = grad.meta.num_elements();
        let flat = empty_shaped(&grad, vec![n]);
        let client = flat.client.clone();
        let (cubes, cube_dim) = elementwise(&client, n);
        let mut starts = SequenceArg::<usize>::new();
        let mut at = 0;
        starts.push(at);
        for len in &sizes {
            at += len;
            starts.push(at);
        }
        uncat_kernel::launch(
            &client,
            cubes,
            cube_dim,
            f32_strided(grad, OP).into_tensor_arg(),
            flat.clone().into_buffer_arg(),
            starts,
            outer,
            inner,
            total,
            !contiguous,
        );
        let mut from = 0;
        sizes
            .into_iter()
            .map(|len| {
                let mut dims = shape.clone();
                dims[dim] = len;
                let size = outer * len * inner;
                let part = Self::float_slice(flat.clone(), &[(from..from + size).into()]);
                from += size;
                Self::float_reshape(part, dims.into())
            })
            .collect()
    }
}
