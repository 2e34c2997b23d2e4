//! qdarts-kernels: the float training kernels qdarts adds to Burn, as backend extensions with
//! hand-written autodiff steps.
//!
//! Each module replaces one Burn operation on the backends where that operation is slow for a
//! DARTS supernet, and falls back to Burn's own operation everywhere else, so callers never
//! branch on the backend:
//!
//! - [`depthwise_conv`], [`pointwise_conv`]: the convolutions of the separable and dilated
//!   candidate ops (flex); [`direct_conv`]: every convolution, forward and backward (the
//!   CubeCL runtimes).
//! - [`pool2d`]: max and average pooling, and the rounded average pool of a fake-quantized
//!   activation (flex and CubeCL).
//! - [`batch_norm`]: a training BatchNorm's per-channel moments and affine map (flex and the
//!   CubeCL runtimes), and the folding of its statistics (the CubeCL runtimes).
//! - [`quant_sum`]: a quantized add of several operands, one launch forward (up to eight
//!   operands) and one backward (the CubeCL runtimes).
//! - [`reduce`]: row max, min and mean in two stages (the CubeCL runtimes).
//! - [`relu`]: ReLU and its gradient, one kernel each (the CubeCL runtimes).
//! - [`fan_out`]: a tensor's several uses, whose gradients are summed in one launch (the
//!   CubeCL runtimes).
//! - [`split`]: a tensor cut into consecutive parts whose backward is one concatenation,
//!   where Burn's narrows each fill, write and add a whole-size gradient (flex and the CubeCL
//!   runtimes).
//! - [`mix`]: coefficients times blocks of columns side by side (a wave's node sums), one
//!   launch forward and two backward, without laying the blocks side by side (the CubeCL
//!   runtimes).
//! - [`scale`]: a mixed op's `w_i · op_i(x)` and its running sum `acc + w_i · op_i(x)` in one
//!   launch, with the gradient of `w_i` summed by whole cubes (the CubeCL runtimes).
//! - [`optim`]: the SGD update and a gradient's squared sum, one kernel each (the CubeCL
//!   runtimes).
//! - [`fake_quant`]: quantize → dequantize in one pass, with the straight-through backward
//!   (flex and the CubeCL runtimes).
//! - [`hold`]: the held rounding and ReLU masks of the second-order step's finite-difference
//!   passes, one launch each way (the CubeCL runtimes).
//! - [`observe`]: a quantizer's observer (extrema, state update, grid) in one or two launches,
//!   alone or with the fake quantization on its grid in the same launches;
//!   [`bias`]: a bias's int32 rounding at its derived scale in one (the CubeCL runtimes; the
//!   quantizers keep their tensor expressions elsewhere, so these have no fallback of their
//!   own).
//!
//! [`devices`] lists the backends compiled into a build; [`launches`] counts the kernels a
//! piece of work launches on the CubeCL runtimes; [`memory`] picks the runtimes' memory pools;
//! `cuda_source` (feature `cuda`) writes the kernels a run compiles out as CUDA C++ and
//! compiles them with NVRTC, without a GPU. Each kernel's test file holds it
//! against the Burn operation it replaces (`observe` and `bias`: `qdarts-ops`'s
//! `tests/quant_kernels.rs`, against the quantizers' expressions).

// Built without a backend feature (a dependent crate checked on its own), the kernels have no
// backend to run on and only the fallbacks to Burn's operations are live.
#![cfg_attr(not(any(feature = "flex", feature = "cube")), allow(dead_code, unused_variables))]

pub mod batch_norm;
pub mod bias;
pub mod cat;
#[cfg(feature = "cuda")]
pub mod cuda_source;
pub mod depthwise_conv;
pub mod devices;
pub mod direct_conv;
pub mod fake_quant;
pub mod fan_out;
pub mod grad_mask;
pub mod hold;
pub mod launches;
pub mod memory;
pub mod mix;
pub mod observe;
pub mod optim;
pub mod pick;
pub mod plane;
pub mod pointwise_conv;
pub mod pool2d;
pub mod quant_sum;
pub mod reduce;
pub mod relu;
pub mod scale;
pub mod split;
mod support;
