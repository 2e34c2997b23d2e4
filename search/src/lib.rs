//! qdarts-search: data, the DARTS supernet over quantized candidate ops, the architect, the
//! search loop and its run record; the discrete network with its QAT and freeze.

pub mod data;
pub mod rng;
