//! The non-finite events of the run, newest last, scrollable.

use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Rect};
use ratatui::text::Line;
use ratatui::widgets::{Paragraph, Row, Table, Widget};

use super::{framed, tail_chars, window};
use qdarts_record::NanAction;

use crate::state::DashboardState;
use crate::theme::THEME;

/// The NaN-event table.
#[derive(Debug)]
pub struct NanTable<'a> {
    /// The run.
    pub state: &'a DashboardState,
    /// First row shown.
    pub offset: usize,
}

impl Widget for &NanTable<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let events = &self.state.nan;
        let n = self.state.nan_count();
        let title = format!("NaN events: {n}");
        let inner = framed(title, area, buf);
        if events.is_empty() {
            Paragraph::new(Line::styled("no non-finite values so far", THEME.good))
                .render(inner, buf);
            return;
        }
        let shown = window(events.len(), usize::from(inner.height.saturating_sub(1)), self.offset);
        let layer_w = usize::from(inner.width.saturating_sub(44)).max(8);
        let rows = events[shown].iter().map(|e| {
            let style = if e.action == NanAction::LrHalved { THEME.warn } else { THEME.bad };
            Row::new(vec![
                e.epoch.to_string(),
                e.step.to_string(),
                e.site.to_string(),
                tail_chars(&e.layer, layer_w),
                e.value.to_string(),
                e.action.to_string(),
            ])
            .style(style)
        });
        Table::new(
            rows,
            [
                Constraint::Length(5),
                Constraint::Length(7),
                Constraint::Length(6),
                Constraint::Fill(1),
                Constraint::Length(9),
                Constraint::Length(11),
            ],
        )
        .header(Row::new(["epoch", "step", "site", "layer", "value", "action"]).style(THEME.title))
        .column_spacing(1)
        .render(inner, buf);
    }
}
