//! qdarts-search: data, the DARTS supernet over quantized candidate ops, the architect, the
//! search loop and its run record.

pub mod architect;
pub mod augment;
pub mod config;
pub mod data;
pub mod freeze;
pub mod record;
pub mod rng;
pub mod search;
pub mod supernet;
pub mod train;
