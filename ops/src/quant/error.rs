//! Errors of the quantization core.

use thiserror::Error;

/// An invalid quantization spec, or a spec that does not fit the tensor it is applied to.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum SpecError {
    /// Bit width outside 2..=16.
    #[error("bits = {0} is not supported: use a bit width from 2 to 16")]
    Bits(u32),
    /// Empty integer range.
    #[error("quant_min ({quant_min}) must be below quant_max ({quant_max})")]
    EmptyRange {
        /// Lower bound.
        quant_min: i32,
        /// Upper bound.
        quant_max: i32,
    },
    /// The integer range does not fit the bit width.
    #[error(
        "[{quant_min}, {quant_max}] does not fit in {bits} {} bits: narrow quant_min/quant_max or \
         raise bits",
        if *signed { "signed" } else { "unsigned" }
    )]
    RangeExceedsBits {
        /// Lower bound.
        quant_min: i32,
        /// Upper bound.
        quant_max: i32,
        /// Bit width.
        bits: u32,
        /// Signedness.
        signed: bool,
    },
    /// Per-channel axis not in the tensor.
    #[error("per-channel axis {axis} is out of range for a tensor of rank {rank}")]
    Axis {
        /// The axis asked for.
        axis: usize,
        /// The tensor's rank.
        rank: usize,
    },
    /// Abs-max observers are symmetric by construction.
    #[error("observer {0} is symmetric by construction: set symmetric = true or use min_max")]
    AbsMaxNeedsSymmetric(&'static str),
    /// Abs-max observers use Paddle's fixed grid.
    #[error(
        "abs-max observers use Paddle's grid (bin_cnt = 2^(bits-1)-1): quant_min/quant_max \
         cannot be set for them"
    )]
    AbsMaxFixedGrid,
    /// Channel-wise abs-max without an axis.
    #[error("channel_wise_abs_max needs granularity = {{ per_channel = {{ axis = N }} }}")]
    ChannelWiseNeedsAxis,
    /// A per-channel quantizer applied to a tensor with another channel count.
    #[error("per-channel quantizer built for {expected} channels got {got} along axis {axis}")]
    Channels {
        /// Channels at construction.
        expected: usize,
        /// Channels of the tensor.
        got: usize,
        /// The axis.
        axis: usize,
    },
    /// A fixed range that is empty or not finite.
    #[error("fixed range [{min}, {max}] must be finite with min < max")]
    FixedRange {
        /// Lower end.
        min: f32,
        /// Upper end.
        max: f32,
    },
    /// Zero window.
    #[error("range_abs_max needs window >= 1")]
    Window,
    /// A moving rate outside (0, 1).
    #[error("{name} = {value} is out of range: use a value in {range}")]
    Rate {
        /// Field name.
        name: &'static str,
        /// Value given.
        value: f32,
        /// The allowed interval.
        range: &'static str,
    },
    /// A partial-channel factor that does not divide the channels of an edge.
    #[error(
        "partial_channels = {k} must be at least 1 and divide the {channels} channels of every edge"
    )]
    PartialChannels {
        /// The factor `K`.
        k: usize,
        /// Channels of the edge.
        channels: usize,
    },
    /// A value could not be read back from the device.
    #[error("reading {0} back from the device failed")]
    ReadBack(String),
    /// Quantizers that cannot stand as rows of one ([`super::FakeQuantizer::stacked`]).
    #[error("cannot stack quantizers: {0}")]
    Stacked(String),
    /// A set of candidate bit widths that is empty or repeats one.
    #[error("{0}")]
    BitChoices(String),
}
