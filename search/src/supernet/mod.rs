//! The DARTS supernet over quantized candidate ops.

mod cell;
mod network;

pub use cell::{CellShape, Preprocess, SearchCell};
pub use network::{Alphas, NetShape, QLinear, SearchNetwork, is_reduction};
