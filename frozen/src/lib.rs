//! qdarts-frozen: the integer-only side of a frozen model, with no Burn dependency so it can be
//! embedded anywhere.
//!
//! - [`fixed`]: the rescale `M = s_in·s_w/s_out` as a fixed-point multiplier `M0·2^-31·2^-n`
//!   and the gemmlowp / TFLite integer rounding primitives that apply it;
//! - [`qdf`]: the `model.qdf` file format (versioned header, genotype, tensors with dtype, shape,
//!   scale and zero point), whose loader validates everything and never panics.

pub mod fixed;
pub mod qdf;
