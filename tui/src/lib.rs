//! qdarts-tui: the terminal dashboard over a run record (`results/<run>/`).
//!
//! Not implemented yet: `qdarts dashboard` reports that it is not available.
