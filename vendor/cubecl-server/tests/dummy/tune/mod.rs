mod autotune_operations;
mod kernels;
mod operation_sets;

pub use autotune_operations::*;
pub use kernels::*;
#[allow(unused)]
pub use operation_sets::*;
