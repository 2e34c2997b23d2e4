//! The terminal loop: draw, read keys, poll the run folder. Draws on the terminal only; it
//! prints nothing else, so logs must go to a file.

use std::path::Path;
use std::time::{Duration, Instant};

use ratatui::DefaultTerminal;
use ratatui::crossterm::event::{self, Event, KeyEventKind};

use crate::app::{Action, App};
use crate::reader::{DashboardError, RunReader};

/// How a search running in the same process is doing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SearchPhase {
    /// Still stepping.
    Running,
    /// Returned (finished or stopped).
    Done,
    /// Returned an error.
    Failed,
}

/// A search running in this process, seen from the dashboard.
pub trait SearchControl {
    /// A short status line and the phase.
    fn status(&self) -> (String, SearchPhase);
}

/// Dashboard settings.
#[derive(Debug, Clone)]
pub struct Options {
    /// How often the run folder is read.
    pub refresh: Duration,
    /// Quantizers under this SQNR (dB) are highlighted.
    pub sqnr_threshold: f64,
}

impl Default for Options {
    fn default() -> Self {
        Options { refresh: Duration::from_millis(500), sqnr_threshold: 20.0 }
    }
}

/// How the dashboard was closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Closed; no search of ours was running.
    Closed,
    /// Closed; the user wants the search to run to the end.
    KeepRunning,
    /// Closed; the user wants the search stopped cleanly.
    StopSearch,
}

/// Shows the run folder `dir` until the user quits.
pub fn run(
    dir: &Path,
    opts: &Options,
    search: Option<&dyn SearchControl>,
) -> Result<Exit, DashboardError> {
    let mut reader = RunReader::open(dir)?;
    reader.poll()?;
    let mut terminal = ratatui::try_init().map_err(DashboardError::Terminal)?;
    let result = event_loop(&mut terminal, &mut reader, opts, search);
    ratatui::try_restore().map_err(DashboardError::Terminal)?;
    result
}

fn event_loop(
    terminal: &mut DefaultTerminal,
    reader: &mut RunReader,
    opts: &Options,
    search: Option<&dyn SearchControl>,
) -> Result<Exit, DashboardError> {
    let mut app = App::new(opts.sqnr_threshold);
    let mut last_poll = Instant::now();
    let mut dirty = true;
    let mut last_status = None;
    loop {
        let status = search.map(SearchControl::status);
        dirty |= status != last_status;
        last_status.clone_from(&status);
        if dirty {
            let line = status.as_ref().map(|(s, p)| (s.as_str(), *p == SearchPhase::Failed));
            terminal
                .draw(|f| app.render(reader.state(), line, f.area(), f.buffer_mut()))
                .map_err(DashboardError::Terminal)?;
            dirty = false;
        }
        let wait = opts.refresh.saturating_sub(last_poll.elapsed()).min(Duration::from_millis(100));
        if event::poll(wait).map_err(DashboardError::Terminal)? {
            match event::read().map_err(DashboardError::Terminal)? {
                Event::Key(k) if k.kind == KeyEventKind::Press => {
                    let running = status.as_ref().is_some_and(|s| s.1 == SearchPhase::Running);
                    match app.key(k, running) {
                        Action::None => {}
                        Action::Quit => return Ok(Exit::Closed),
                        Action::KeepRunning => return Ok(Exit::KeepRunning),
                        Action::StopSearch => return Ok(Exit::StopSearch),
                    }
                    dirty = true;
                }
                Event::Resize(..) => dirty = true,
                _ => {}
            }
        }
        if last_poll.elapsed() >= opts.refresh {
            dirty |= reader.poll()?;
            last_poll = Instant::now();
        }
    }
}
