//! qdarts-search: the DARTS search over quantized candidate ops. The experiment config
//! ([`config`]), the supernet and its architecture parameters ([`supernet`]), the architect
//! (first- and second-order α gradients: [`architect`]), the hardware cost of a bit-width or
//! hardware-aware search ([`cost`]), one search step ([`step`]), and the
//! search as a step of the shared epoch loop ([`run`]).

pub mod architect;
pub mod config;
pub mod cost;
pub mod memory;
pub mod parity;
pub mod run;
pub mod selection;
pub mod step;
pub mod supernet;

pub use run::{
    PreparedSearch, SearchOutcome, derive_genotype, net_shape, prepare_search, run_prepared,
    run_search,
};
