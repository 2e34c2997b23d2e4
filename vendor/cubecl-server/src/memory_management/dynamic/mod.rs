mod adaptive;
mod arena;
mod base;
mod exclusive;

pub(crate) use adaptive::*;
pub(crate) use arena::*;
pub(crate) use base::*;
pub(crate) use exclusive::*;
