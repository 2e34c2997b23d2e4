//! The DARTS supernet over quantized candidate ops, and its architecture parameters.

mod alphas;
mod cell;
mod network;

pub use alphas::{
    AlphaRows, Alphas, ArchWeights, BIT_ALPHA_INIT, BitAlphas, BitWeights, EdgeRows, smooth_row,
};
pub use cell::{CellShape, SearchCell};
pub use network::{NetShape, SearchNetwork};
