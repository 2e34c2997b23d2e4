pub(crate) use cubecl_runtime::memory_management::*;

mod base;
mod direct_pool;
mod exclusive_pool;
mod memory_page;
mod persistent_pool;
mod sliced_pool;

pub(crate) use base::*;
pub(crate) use direct_pool::*;
pub(crate) use exclusive_pool::*;
pub(crate) use memory_page::*;
pub(crate) use persistent_pool::*;
pub(crate) use sliced_pool::*;
