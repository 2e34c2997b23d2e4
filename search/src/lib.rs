//! qdarts-search: the DARTS supernet over quantized candidate ops, the architect, the search
//! loop, the run record, and the discrete network with its QAT and freeze.
//!
//! The crate re-exports the pieces it builds on; the search itself is not implemented yet and
//! the `qdarts search` command says so.

pub use qdarts_genotypes as genotypes;
pub use qdarts_ops as ops;
