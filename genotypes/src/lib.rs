//! qdarts-genotypes: the DARTS search space vocabulary, free of Burn so that any tool can read
//! a genotype.

mod primitive;

pub use primitive::{ParsePrimitiveError, Primitive};
