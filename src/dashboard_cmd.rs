//! `qdarts dashboard <run>`: watch a run folder (live, finished or copied) in the terminal.

use std::io::IsTerminal;
use std::path::Path;

use anyhow::{Result, bail};

/// Runs `qdarts dashboard`.
pub fn run(dir: &Path, opts: &qdarts_tui::Options) -> Result<()> {
    // Check the folder first, so a typo is an error before the screen is taken over.
    qdarts_tui::RunReader::open(dir)?;
    if !std::io::stdout().is_terminal() {
        bail!("the dashboard needs a terminal on stdout");
    }
    qdarts_tui::run(dir, opts, None)?;
    Ok(())
}
