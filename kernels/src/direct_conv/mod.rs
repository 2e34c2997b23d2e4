//! Convolutions on the CubeCL backends (`wgpu`, `cuda`) with kernels of their own, forward and
//! backward, for any groups, stride, padding and dilation (no bias).
//!
//! Built without CubeCL's autotune, as qdarts builds them, Burn's CubeCL backends differentiate
//! a convolution's weight as a direct convolution of the input by the output's gradient: one
//! thread per weight, each summing the `N·H'·W'` products of that weight in sequence. A
//! DARTS-shape supernet (batch 64, 32×32) has a few hundred weights per convolution and 65 536
//! products per weight: a launch of a few warps that runs for milliseconds, for each of the
//! step's hundreds of convolutions. Here:
//!
//! - forward: one thread per output, `y[n, o, p] = Σ_c Σ_t w[o, c, t] · x[n, g·C_g + c, p·s + t·d − pad]`
//!   over the input channels `c` of the output's group `g` and the taps `t` (row-major);
//! - input gradient: one thread per input, gathering `w[o, c, t] · ∂y[n, o, q]` over the
//!   outputs `q` of each tap that read it and the group's output channels `o` (no atomics);
//! - weight gradient: one cube of 256 threads per weight, each thread summing a fixed
//!   stride of the `N·H'·W'` products, then a tree in shared memory, so the result does not
//!   depend on thread timing.
//!
//! The kernels read contiguous `[N, C, H, W]` activations and gradients (one that is not is
//! copied first), the weight through its strides (a parameter uploaded to cuda has padded
//! rows), and write contiguous tensors. Only the summation order differs from Burn's convolution
//! (`tests/direct_conv.rs` holds the two together on every CubeCL backend of the build).
//! Other backends and dtypes use Burn's `conv2d` ([`conv2d`] decides).

use burn::tensor::ops::ConvOptions;
use burn::tensor::{DType, Device, Tensor, module};

use crate::plane::PlaneGeom;

/// Threads of the cube that sums one weight's gradient (a power of two: the tree halves it).
#[cfg(feature = "cube")]
const UNITS: u32 = 256;

/// A convolution's geometry: the plane's (per axis `[h, w]`) and the number of groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvGeom {
    /// Input plane, kernel, stride, padding (the leading side; the output size is given by
    /// `output`) and dilation.
    pub plane: PlaneGeom,
    /// The output plane `[H', W']` (the trailing padding decides it with the rest).
    pub output: [usize; 2],
    /// Groups: input and output channels are split into this many, each output channel
    /// seeing its group's inputs only.
    pub groups: usize,
}

/// Whether [`conv2d`] runs this module's kernels for tensors on `device` with this dtype.
pub fn direct_available(device: &Device, dtype: DType) -> bool {
    crate::support::on_cube(device) && dtype == DType::F32
}

/// Burn's `conv2d` without bias, as this module's kernels where [`direct_available`].
pub fn conv2d(x: Tensor<4>, weight: Tensor<4>, options: ConvOptions<2>) -> Tensor<4> {
    if !direct_available(&x.device(), x.dtype()) {
        return module::conv2d(x, weight, None, options);
    }
    #[cfg(feature = "cube")]
    {
        let [_, _, h, w] = x.dims();
        let [_, _, kh, kw] = weight.dims();
        let (begin, end) = (options.padding_begin(), options.padding_end());
        let out = |a: usize, size: usize, k: usize| {
            let span = options.dilation[a] * (k - 1) + 1;
            (size + begin[a] + end[a]).saturating_sub(span) / options.stride[a] + 1
        };
        let geom = ConvGeom {
            plane: PlaneGeom {
                input: [h, w],
                kernel: [kh, kw],
                stride: options.stride,
                padding: begin,
                dilation: options.dilation,
            },
            output: [out(0, h, kh), out(1, w, kw)],
            groups: options.groups,
        };
        let out = <burn::backend::Dispatch as DirectConvBackend>::direct_conv2d(
            x.into_dispatch(),
            weight.into_dispatch(),
            geom,
        );
        Tensor::from_dispatch(out)
    }
    #[cfg(not(feature = "cube"))]
    unreachable!("direct_available is false without the CubeCL backends")
}

#[cfg(feature = "cube")]
pub use extension::DirectConvBackend;

#[cfg(feature = "cube")]
mod cube;
#[cfg(feature = "cube")]
mod extension;
