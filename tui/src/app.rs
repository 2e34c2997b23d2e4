//! The dashboard's view state (tab, sort, scroll, the quit dialog), its keys, and the layout of
//! a whole screen. Drawing only reads the `DashboardState`.

use ratatui::buffer::Buffer;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::layout::{Constraint, Flex, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Clear, Paragraph, Tabs, Widget, Wrap};

use crate::panels::{
    AlphaPanel, Curve, Curves, GenotypePanel, Header, NanTable, QuantSort, QuantTable,
};
use crate::state::{CellType, DashboardState};
use crate::theme::THEME;

/// The tabs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tab {
    /// Curves, worst quantizers, genotype.
    Overview,
    /// Every quantizer.
    Quant,
    /// Architecture weights.
    Alphas,
    /// Genotype and its history.
    Genotype,
    /// NaN events.
    Nan,
}

impl Tab {
    /// In display order.
    pub const ALL: [Tab; 5] = [Tab::Overview, Tab::Quant, Tab::Alphas, Tab::Genotype, Tab::Nan];

    fn title(self) -> &'static str {
        match self {
            Tab::Overview => "1 overview",
            Tab::Quant => "2 quant error",
            Tab::Alphas => "3 alphas",
            Tab::Genotype => "4 genotype",
            Tab::Nan => "5 NaN events",
        }
    }

    fn index(self) -> usize {
        Tab::ALL.iter().position(|t| *t == self).unwrap_or(0)
    }
}

/// What a key asks of the loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing beyond a redraw.
    None,
    /// Close the dashboard (no search of ours is running).
    Quit,
    /// Close the dashboard and let the search run to completion.
    KeepRunning,
    /// Close the dashboard and stop the search cleanly after its current step.
    StopSearch,
}

/// The view state.
#[derive(Debug, Clone)]
pub struct App {
    /// The tab shown.
    pub tab: Tab,
    /// Sort key of the quantizer table.
    pub sort: QuantSort,
    /// Best first instead of worst first.
    pub reversed: bool,
    /// The cell of the α heat map.
    pub cell: CellType,
    /// Scroll offset per tab.
    pub offsets: [usize; 5],
    /// SQNR threshold (dB) under which a quantizer is highlighted.
    pub threshold: f64,
    /// The quit dialog (only while a search runs in this process).
    pub confirm_quit: bool,
}

impl App {
    /// A view on the overview tab.
    pub fn new(threshold: f64) -> Self {
        App {
            tab: Tab::Overview,
            sort: QuantSort::Sqnr,
            reversed: false,
            cell: CellType::Normal,
            offsets: [0; 5],
            threshold,
            confirm_quit: false,
        }
    }

    /// Handles a key. `search_running`: a search runs in this process, so quitting asks
    /// whether to keep it running or stop it.
    pub fn key(&mut self, key: KeyEvent, search_running: bool) -> Action {
        let ctrl_c =
            key.code == KeyCode::Char('c') && key.modifiers.contains(KeyModifiers::CONTROL);
        if self.confirm_quit {
            return match key.code {
                KeyCode::Char('k') => Action::KeepRunning,
                KeyCode::Char('s') => Action::StopSearch,
                _ if ctrl_c => Action::StopSearch,
                _ => {
                    self.confirm_quit = false;
                    Action::None
                }
            };
        }
        let off = &mut self.offsets[self.tab.index()];
        match key.code {
            KeyCode::Char('q') | KeyCode::Esc => {
                if search_running {
                    self.confirm_quit = true;
                    return Action::None;
                }
                return Action::Quit;
            }
            _ if ctrl_c => {
                if search_running {
                    self.confirm_quit = true;
                    return Action::None;
                }
                return Action::Quit;
            }
            KeyCode::Tab | KeyCode::Right => self.tab = Tab::ALL[(self.tab.index() + 1) % 5],
            KeyCode::BackTab | KeyCode::Left => self.tab = Tab::ALL[(self.tab.index() + 4) % 5],
            KeyCode::Char(c @ '1'..='5') => self.tab = Tab::ALL[usize::from(c as u8 - b'1')],
            KeyCode::Char('s') => self.sort = self.sort.next(),
            KeyCode::Char('r') => self.reversed = !self.reversed,
            KeyCode::Char('c') => {
                self.cell = match self.cell {
                    CellType::Normal => CellType::Reduce,
                    CellType::Reduce => CellType::Normal,
                }
            }
            KeyCode::Down | KeyCode::Char('j') => *off = off.saturating_add(1),
            KeyCode::Up | KeyCode::Char('k') => *off = off.saturating_sub(1),
            KeyCode::PageDown => *off = off.saturating_add(20),
            KeyCode::PageUp => *off = off.saturating_sub(20),
            KeyCode::Home | KeyCode::Char('g') => *off = 0,
            KeyCode::End | KeyCode::Char('G') => *off = usize::MAX / 2,
            _ => {}
        }
        Action::None
    }

    /// Draws a whole screen. `search`: the in-process search's status and whether it failed.
    pub fn render(
        &self,
        state: &DashboardState,
        search: Option<(&str, bool)>,
        area: Rect,
        buf: &mut Buffer,
    ) {
        let [tabs, header, body, help] = area.layout(&Layout::vertical([
            Constraint::Length(1),
            Constraint::Length(2),
            Constraint::Fill(1),
            Constraint::Length(1),
        ]));
        Tabs::new(Tab::ALL.iter().map(|t| t.title()))
            .select(self.tab.index())
            .style(THEME.label)
            .highlight_style(THEME.selected)
            .render(tabs, buf);
        (&Header { state, search }).render(header, buf);
        let off = self.offsets[self.tab.index()];
        let quant = |compact| QuantTable {
            state,
            sort: self.sort,
            reversed: self.reversed,
            offset: if compact { 0 } else { off },
            threshold: self.threshold,
            compact,
        };
        match self.tab {
            Tab::Overview => {
                let [left, right] = body.layout(&Layout::horizontal([
                    Constraint::Percentage(55),
                    Constraint::Percentage(45),
                ]));
                let [loss, top1] = left.layout(&Layout::vertical([Constraint::Fill(1); 2]));
                (&Curves { state, curve: Curve::Loss }).render(loss, buf);
                (&Curves { state, curve: Curve::Top1 }).render(top1, buf);
                let nodes = state.alphas.last().map_or(4, |a| node_count(a.normal.len()));
                let g_h = u16::try_from(2 * nodes + 4).unwrap_or(12);
                let [q, g] =
                    right.layout(&Layout::vertical([Constraint::Fill(1), Constraint::Length(g_h)]));
                (&quant(true)).render(q, buf);
                (&GenotypePanel { state, offset: 0, compact: true }).render(g, buf);
            }
            Tab::Quant => (&quant(false)).render(body, buf),
            Tab::Alphas => (&AlphaPanel { state, cell: self.cell }).render(body, buf),
            Tab::Genotype => {
                (&GenotypePanel { state, offset: off, compact: false }).render(body, buf)
            }
            Tab::Nan => (&NanTable { state, offset: off }).render(body, buf),
        }
        let keys: &[(&str, &str)] = match self.tab {
            Tab::Quant => &[("s", "sort"), ("r", "reverse"), ("↑↓ PgUp PgDn", "scroll")],
            Tab::Alphas => &[("c", "normal/reduce cell")],
            Tab::Genotype | Tab::Nan => &[("↑↓ PgUp PgDn", "scroll")],
            Tab::Overview => &[("s", "sort quantizers")],
        };
        let mut spans = vec![key_span("q"), Span::styled(" quit  ", THEME.label)];
        spans.extend([key_span("tab/1-5"), Span::styled(" switch  ", THEME.label)]);
        for (k, what) in keys {
            spans.push(key_span(k));
            spans.push(Span::styled(format!(" {what}  "), THEME.label));
        }
        Paragraph::new(Line::from(spans)).render(help, buf);
        if self.confirm_quit {
            render_quit_dialog(area, buf);
        }
    }
}

fn key_span(k: &str) -> Span<'static> {
    Span::styled(format!(" {k} "), THEME.key)
}

/// Intermediate nodes of a cell with `edges` edges (edges = n(n+3)/2).
fn node_count(edges: usize) -> usize {
    (1..16).find(|n| n * (n + 3) / 2 >= edges).unwrap_or(4)
}

fn render_quit_dialog(area: Rect, buf: &mut Buffer) {
    let [row] = area.layout(&Layout::vertical([Constraint::Length(7)]).flex(Flex::Center));
    let [dialog] = row.layout(&Layout::horizontal([Constraint::Max(64)]).flex(Flex::Center));
    Clear.render(dialog, buf);
    let text = vec![
        Line::styled("The search is still running.", THEME.value),
        Line::from(vec![
            key_span("k"),
            Span::raw(" keep it running to the end without the dashboard"),
        ]),
        Line::from(vec![
            key_span("s"),
            Span::raw(" stop it cleanly after this step (checkpoint; resume later)"),
        ]),
        Line::from(vec![key_span("any other key"), Span::raw(" back to the dashboard")]),
    ];
    Paragraph::new(text)
        .wrap(Wrap { trim: true })
        .block(ratatui::widgets::Block::bordered().title(Line::styled(" quit? ", THEME.title)))
        .render(dialog, buf);
}
