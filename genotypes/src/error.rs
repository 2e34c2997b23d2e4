//! Errors of genotype reading and derivation.

use thiserror::Error;

/// A genotype that cannot be read or derived.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum GenotypeError {
    /// DARTS text that does not parse.
    #[error("line {line}, column {column}: {message}")]
    Syntax {
        /// 1-based line.
        line: usize,
        /// 1-based column (characters).
        column: usize,
        /// What was wrong.
        message: String,
    },
    /// JSON that does not describe a genotype.
    #[error("not a genotype: {0}")]
    Json(String),
    /// A well-formed genotype that is not a valid cell.
    #[error("invalid genotype: {0}")]
    Invalid(String),
    /// Architecture weights of the wrong shape.
    #[error("architecture weights: {0}")]
    Weights(String),
    /// A name that is not a known genotype.
    #[error("unknown genotype `{0}`: known ones are {1}")]
    Unknown(String, String),
}
