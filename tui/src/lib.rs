//! qdarts-tui: the terminal dashboard over a run record (`results/<run>/`).
//!
//! The dashboard never talks to the search: it follows the run folder's files, so it works on
//! a live run, a finished one, or a copied folder. `RunReader` follows the run record's tables (through `qdarts-record`) into a
//! `DashboardState` (plain data); the panels in `panels/` draw from it; `term::run` is the
//! terminal loop.

pub mod app;
pub mod panels;
pub mod reader;
pub mod state;
pub mod term;
pub mod theme;

pub use app::{Action, App, Tab};
pub use reader::{DashboardError, RunReader};
pub use state::DashboardState;
pub use term::{Exit, Options, SearchControl, SearchPhase, run};
