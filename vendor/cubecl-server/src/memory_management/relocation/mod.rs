mod analysis;
mod base;
mod copy_queue;
mod streams;
mod trigger;

pub(crate) use analysis::*;
pub use base::*;
pub use copy_queue::*;
pub use streams::*;
pub use trigger::*;
