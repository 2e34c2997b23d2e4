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
//! The kernels read the input `[N, C, H, W]` and the weight through their strides (a view is
//! not copied first; a parameter uploaded to cuda has padded rows), the output's gradient
//! contiguous (one that is not is copied once for both gradients), and write contiguous
//! tensors. A ReLU before the convolution may be taken as the kernels read the input
//! ([`conv2d_reading_relu`]): its mask then applies to the input's gradient in the same launch. Only the summation order differs from Burn's convolution
//! (`tests/direct_conv.rs` holds the two together on every CubeCL backend of the build).
//! Other backends and dtypes use Burn's `conv2d` ([`conv2d`] decides). Where the leading
//! filters are smaller ones padded with zeros, the kernels may skip the padding's taps
//! ([`conv2d_reading_inset`]).

use burn::tensor::ops::ConvOptions;
use burn::tensor::{DType, Device, Tensor, module};

use crate::plane::PlaneGeom;

/// A convolution's geometry: the plane's (per axis `[h, w]`) and the number of groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvGeom {
    /// Input plane, kernel, stride, padding (the leading side; the output size is given by
    /// `output`) and dilation.
    pub plane: PlaneGeom,
    /// The output plane `[H', W']` (the trailing padding decides it with the rest).
    pub output: [usize; 2],
    /// Groups: the output channels are split into this many, each output channel seeing the
    /// input channels of its group's input group only.
    pub groups: usize,
    /// The input group each group reads.
    pub inputs: GroupInputs,
    /// The convolution reads `relu(x)`: the ReLU applied as the kernels read `x`, and its
    /// mask to the input's gradient.
    pub relu: bool,
    /// The output channels whose filters are smaller ones padded with zeros.
    pub inset: Inset,
}

/// The leading `channels` output channels of a convolution whose filters are zero within `by`
/// taps of every edge: smaller filters centred and padded to the weight's kernel (the batched
/// cell's sep 3×3 beside sep 5×5). The kernels skip those taps forward and in the input's
/// gradient (a product `0 · x` they would add), and write their weights' gradient as 0
/// without summing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Inset {
    /// Output channels, from the first.
    pub channels: usize,
    /// Taps from each edge of the filter.
    pub by: usize,
}

impl Inset {
    /// No inset filters.
    pub const NONE: Inset = Inset { channels: 0, by: 0 };
}

/// Which input group each group of a convolution reads: group `g` reads input group
/// `((g / (per·inner)) % sources)·inner + g % inner` of the `sources·inner` input groups.
///
/// [`GroupInputs::own`]: group `g` reads group `g`, a grouped convolution as Burn's. The
/// batched cell's depthwise convolutions read the `sources` states of a wave (`inner` channels
/// each) as every one of their edges and kinds reads its copy: `x` `[N, S·C, H, W]` read in
/// place as the `[N, copies·S·per·C, H, W]` of copies after copies, source after source, `per`
/// edges of each; the input's gradient sums over the groups that read each input channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupInputs {
    /// Runs of input groups (the wave's source states).
    pub sources: usize,
    /// Consecutive runs of groups that read one run (a source's edges).
    pub per: usize,
    /// Groups in a run (a state's channels, for a depthwise convolution).
    pub inner: usize,
}

impl GroupInputs {
    /// Each of `groups` groups reads its own input group.
    pub fn own(groups: usize) -> Self {
        GroupInputs { sources: 1, per: 1, inner: groups }
    }

    /// The input groups, `sources·inner`.
    pub fn count(&self) -> usize {
        self.sources * self.inner
    }

    /// The input group that group `g` reads.
    pub fn of(&self, g: usize) -> usize {
        ((g / (self.per * self.inner)) % self.sources) * self.inner + g % self.inner
    }

    /// `x` `[N, sources·inner·C_g, H, W]` as the input each of `groups` groups reads, laid out
    /// `[N, groups·C_g, H, W]` (a copy, where any group reads another's input group).
    pub fn laid_out(&self, x: Tensor<4>, groups: usize) -> Tensor<4> {
        let [n, ci, h, w] = x.dims();
        let run = ci / self.sources;
        let copies = groups / (self.sources * self.per * self.inner);
        if copies * self.per == 1 {
            return x;
        }
        let r = x.reshape([n, 1, self.sources, 1, run, h * w]);
        r.expand([n, copies, self.sources, self.per, run, h * w]).reshape([
            n,
            copies * self.sources * self.per * run,
            h,
            w,
        ])
    }

    /// Whether `groups` groups read `input_channels` channels so: `groups` a multiple of
    /// `sources·per·inner`, the channels of `sources·inner`.
    pub fn fits(&self, groups: usize, input_channels: usize) -> bool {
        let run = self.sources * self.per * self.inner;
        run > 0 && groups.is_multiple_of(run) && input_channels.is_multiple_of(self.count())
    }
}

/// Whether [`conv2d`] runs this module's kernels for tensors on `device` with this dtype.
pub fn direct_available(device: &Device, dtype: DType) -> bool {
    crate::support::on_cube(device) && dtype == DType::F32
}

/// Burn's `conv2d` without bias, as this module's kernels where [`direct_available`].
pub fn conv2d(x: Tensor<4>, weight: Tensor<4>, options: ConvOptions<2>) -> Tensor<4> {
    let inputs = GroupInputs::own(options.groups);
    conv2d_reading(x, weight, options, inputs)
}

/// [`conv2d`] whose groups read the input groups `inputs` gives (`x` has
/// `inputs.count()·C_g` channels): as Burn's `conv2d` of [`GroupInputs::laid_out`], without
/// that copy where [`direct_available`].
///
/// # Panics
/// Where `inputs` does not [fit](GroupInputs::fits) the groups and `x`'s channels.
pub fn conv2d_reading(
    x: Tensor<4>,
    weight: Tensor<4>,
    options: ConvOptions<2>,
    inputs: GroupInputs,
) -> Tensor<4> {
    conv2d_reading_inset(x, weight, options, inputs, false, Inset::NONE)
}

/// [`conv2d_reading`] of `relu(x)` (the ReLU of [`crate::relu`]): where [`direct_available`]
/// the kernels take the ReLU as they read `x` and apply its mask to the input's gradient, the
/// same values as the ReLU then the convolution without the ReLU's launch forward and
/// backward; elsewhere the ReLU, then the convolution.
///
/// # Panics
/// As [`conv2d_reading`].
pub fn conv2d_reading_relu(
    x: Tensor<4>,
    weight: Tensor<4>,
    options: ConvOptions<2>,
    inputs: GroupInputs,
) -> Tensor<4> {
    conv2d_reading_inset(x, weight, options, inputs, true, Inset::NONE)
}

/// [`conv2d_reading`] (of `relu(x)` with `relu`) whose weight's first `inset.channels`
/// filters are zero within `inset.by` taps of every edge ([`Inset`]): where
/// [`direct_available`] the kernels skip those taps, so the values are the padded filters'
/// (a skipped tap would add `0 · x`; with `x` infinite or NaN it would add a NaN) and those
/// taps' gradient is 0; elsewhere exactly [`conv2d_reading`], the padding's gradient summed.
///
/// # Panics
/// As [`conv2d_reading`]; where the inset channels exceed the weight's, or the inset leaves no
/// tap.
// Only the kernels read `inset`: Burn's convolution adds the padding's zero taps.
#[cfg_attr(not(feature = "cube"), allow(unused_variables))]
pub fn conv2d_reading_inset(
    x: Tensor<4>,
    weight: Tensor<4>,
    options: ConvOptions<2>,
    inputs: GroupInputs,
    relu: bool,
    inset: Inset,
) -> Tensor<4> {
    let [co, _, kh, kw] = weight.dims();
    let fits = inset.channels <= co && 2 * inset.by < kh.min(kw);
    assert!(fits, "conv: {inset:?} does not fit a weight of {:?}", weight.dims());
    assert!(
        inputs.fits(options.groups, x.dims()[1]),
        "conv: {inputs:?} does not fit {} groups over {} input channels",
        options.groups,
        x.dims()[1]
    );
    if !direct_available(&x.device(), x.dtype()) {
        let x = if relu { crate::relu::relu(x) } else { x };
        return module::conv2d(inputs.laid_out(x, options.groups), weight, None, options);
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
            inputs,
            relu,
            inset,
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
