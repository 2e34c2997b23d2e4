//! Element loops shared by the flex kernels (`depthwise_conv`, `batch_norm`, `pool2d`), written so that LLVM
//! vectorizes them (independent lanes, no reassociation needed), and the per-plane parallel
//! loop they run under; and the two device tests that decide which of this crate's kernels
//! run (flex's, or the CubeCL runtimes').

use burn::tensor::{DType, Device};

/// Whether the flex kernels of this crate run for tensors on `device` with this dtype: f32 on
/// the flex device (autodiff or not), with the `flex` feature.
pub(crate) fn on_flex_f32(device: &Device, dtype: DType) -> bool {
    #[cfg(feature = "flex")]
    {
        dtype == DType::F32 && *device == Device::flex()
    }
    #[cfg(not(feature = "flex"))]
    {
        let _ = (device, dtype);
        false
    }
}

/// Whether `device` is one of Burn's CubeCL runtimes (wgpu, cuda), with the `cube` feature.
pub(crate) fn on_cube(device: &Device) -> bool {
    #[cfg(feature = "cube")]
    {
        matches!(device.clone().inner().as_dispatch(), burn::backend::DispatchDevice::Cube(_))
    }
    #[cfg(not(feature = "cube"))]
    {
        let _ = device;
        false
    }
}

/// `dst[i] += a · src[i]`.
#[inline(always)]
pub(crate) fn axpy(dst: &mut [f32], a: f32, src: &[f32]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d += a * s;
    }
}

/// `Σ a[i] · b[i]` in eight interleaved partial sums (so the loop vectorizes), combined in a
/// fixed order.
#[inline(always)]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for k in 0..8 {
            acc[k] += x[k] * y[k];
        }
    }
    let mut tail = 0.0;
    for (x, y) in ar.iter().zip(br) {
        tail += x * y;
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// `Σ a[i]` in eight interleaved partial sums, combined in a fixed order.
#[inline(always)]
pub(crate) fn sum(a: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let chunks = a.chunks_exact(8);
    let rest = chunks.remainder();
    for x in chunks {
        for k in 0..8 {
            acc[k] += x[k];
        }
    }
    let tail: f32 = rest.iter().sum();
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// `Σ (a[i] − m)²` in eight interleaved partial sums, combined in a fixed order.
#[inline(always)]
pub(crate) fn centered_squares(a: &[f32], m: f32) -> f32 {
    let mut acc = [0.0f32; 8];
    let chunks = a.chunks_exact(8);
    let rest = chunks.remainder();
    for x in chunks {
        for k in 0..8 {
            let d = x[k] - m;
            acc[k] += d * d;
        }
    }
    let tail: f32 = rest.iter().map(|&v| (v - m) * (v - m)).sum();
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// Runs `plane(p, dst, scratch)` for every plane `p`, each writing its `dst` chunk of `out`, in
/// parallel. `scratch` holds one buffer per entry of `sizes`, per rayon task, reused across
/// its planes (each plane must overwrite what it reads).
pub(crate) fn planes<const K: usize>(
    out: &mut [f32],
    chunk: usize,
    sizes: [usize; K],
    plane: impl Fn(usize, &mut [f32], &mut [Vec<f32>; K]) + Sync,
) {
    if chunk == 0 {
        return;
    }
    use rayon::prelude::*;
    out.par_chunks_mut(chunk).enumerate().for_each_init(
        || sizes.map(|n| vec![0.0f32; n]),
        |scratch, (p, dst)| plane(p, dst, scratch),
    );
}

/// Reading and making the f32 tensors of the flex kernels.
#[cfg(feature = "flex")]
pub(crate) mod flex {
    use burn::backend::flex::FlexTensor;
    use burn::tensor::{DType, Shape, TensorData};

    /// The dims and a contiguous copy (or view) of an f32 tensor.
    ///
    /// # Panics
    /// If it is not f32: the public wrappers only call the kernels for f32 (`what` names the
    /// kernel).
    pub(crate) fn f32s(t: &FlexTensor, what: &str) -> (Vec<usize>, FlexTensor) {
        assert_eq!(t.dtype(), DType::F32, "{what}: expected f32, got {:?}", t.dtype());
        (t.layout().shape().to_vec(), t.to_contiguous())
    }

    /// The values of a contiguous f32 tensor.
    pub(crate) fn slice(t: &FlexTensor) -> &[f32] {
        t.as_slice::<f32>().expect("a contiguous f32 tensor has a slice")
    }

    /// A tensor of `values` with `dims`.
    pub(crate) fn tensor(values: Vec<f32>, dims: Vec<usize>) -> FlexTensor {
        FlexTensor::from_data(TensorData::new(values, Shape::from(dims)))
    }
}
