//! The server contract, re-exported from `cubecl-runtime`.

pub use cubecl_runtime::server::*;
