//! qdarts-frozen: the integer-only side of a frozen model, with no Burn dependency so it can be
//! embedded anywhere.
//!
//! - [`fixed`]: the rescale `M = s_in·s_w/s_out` as a fixed-point multiplier `M0·2^-31·2^-n`
//!   and the gemmlowp / TFLite integer rounding primitives that apply it;
//! - [`qdf`]: the `model.qdf` file format (versioned header, genotype, tensors with dtype, shape,
//!   scale and zero point), whose loader validates everything and never panics;
//! - [`model`]: the frozen model as a graph of integer nodes, stored in a `.qdf` file;
//! - [`runtime`]: integer-only inference of that graph (i8 activations, i32 accumulators);
//! - [`onnx`]: export of the graph as an ONNX model in QDQ form.

pub mod fixed;
pub mod model;
pub mod onnx;
pub mod qdf;
pub mod runtime;
pub(crate) mod validate;

pub use model::{ActGrid, ConvNode, FrozenModel, Graph, ModelError, Node, PoolKind};
pub use runtime::Runtime;
