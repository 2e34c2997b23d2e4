//! qdarts-genotypes: the DARTS search-space vocabulary, genotypes, their derivation from
//! architecture weights, and their JSON and DARTS text forms. Free of Burn, so that any tool can
//! read a genotype.

mod derive;
mod error;
mod genotype;
mod known;
mod primitive;
mod random;
mod text;

pub use derive::{
    DeriveOptions, derive_cell, derive_cell_limited, edge_count, edge_index, edge_input, softmax,
};
pub use error::GenotypeError;
pub use genotype::{Bits, Edge, Genotype, MAX_EDGES, MAX_NODES};
pub use known::{KNOWN, known};
pub use primitive::{ParsePrimitiveError, Primitive};
pub use random::random_genotype;
