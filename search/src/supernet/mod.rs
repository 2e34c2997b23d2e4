//! The DARTS supernet over quantized candidate ops, and its architecture parameters.

mod alphas;
mod batched;
mod cell;
mod network;
pub mod waves;

pub use alphas::{
    AlphaRows, Alphas, ArchWeights, BIT_ALPHA_INIT, BitAlphas, BitWeights, EdgeRows, smooth_row,
};
pub use batched::{
    BankKind, BankStage, BatchError, BatchedCell, CellBits, ConvBank, DwGroup, RowMix, Slot,
    StackedReduce, StageMixes, StageQuant, WaveOps,
};
pub use cell::{CellShape, SearchCell};
pub use network::{NetShape, SearchNetwork};
