//! Per-layer quantization error: every quantizer at the latest recorded step, sortable, with
//! layers under the SQNR threshold highlighted, and a sparkline of the worst layer's SQNR.

use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Cell, Paragraph, Row, Sparkline, Table, Widget};

use super::{framed, num, tail_chars, window};
use crate::state::{DashboardState, QuantLayer};
use crate::theme::THEME;

/// The sort key of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantSort {
    /// Signal-to-quantization-noise ratio (worst first).
    Sqnr,
    /// Mean squared error (worst first).
    Mse,
    /// Fraction clipped (worst first).
    Clip,
    /// Layer path.
    Layer,
}

impl QuantSort {
    /// The next key (the `s` key cycles).
    pub fn next(self) -> Self {
        match self {
            QuantSort::Sqnr => QuantSort::Mse,
            QuantSort::Mse => QuantSort::Clip,
            QuantSort::Clip => QuantSort::Layer,
            QuantSort::Layer => QuantSort::Sqnr,
        }
    }

    fn name(self) -> &'static str {
        match self {
            QuantSort::Sqnr => "SQNR",
            QuantSort::Mse => "MSE",
            QuantSort::Clip => "clip",
            QuantSort::Layer => "layer",
        }
    }
}

/// The quantization-error table.
#[derive(Debug)]
pub struct QuantTable<'a> {
    /// The run.
    pub state: &'a DashboardState,
    /// Sort key.
    pub sort: QuantSort,
    /// Best first instead of worst first.
    pub reversed: bool,
    /// First row shown.
    pub offset: usize,
    /// Layers under this SQNR (dB) are highlighted.
    pub threshold: f64,
    /// Fewer columns and no sparkline (the overview).
    pub compact: bool,
}

impl QuantTable<'_> {
    /// The rows in display order.
    pub fn rows(&self) -> Vec<&QuantLayer> {
        let mut rows: Vec<&QuantLayer> = self.state.current_quant().collect();
        // Worst first: low SQNR, high MSE, high clip fraction.
        match self.sort {
            QuantSort::Sqnr => rows.sort_by(|a, b| a.error.sqnr_db.total_cmp(&b.error.sqnr_db)),
            QuantSort::Mse => rows.sort_by(|a, b| b.error.mse.total_cmp(&a.error.mse)),
            QuantSort::Clip => rows.sort_by(|a, b| b.error.clip_frac.total_cmp(&a.error.clip_frac)),
            QuantSort::Layer => rows.sort_by(|a, b| a.error.layer.cmp(&b.error.layer)),
        }
        if self.reversed {
            rows.reverse();
        }
        rows
    }
}

impl Widget for &QuantTable<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let rows = self.rows();
        let low = rows.iter().filter(|q| q.error.sqnr_db < self.threshold).count();
        let order = if self.reversed { "best first" } else { "worst first" };
        let title = format!(
            "quantizers at step {}: {} · by {} ({order}) · {low} under {} dB",
            self.state.quant_step,
            rows.len(),
            self.sort.name(),
            self.threshold
        );
        let inner = framed(title, area, buf);
        if rows.is_empty() {
            Paragraph::new(Line::styled("no quant_error.csv rows yet", THEME.dim))
                .render(inner, buf);
            return;
        }
        let spark_h = if self.compact { 0 } else { 4 };
        let [spark, table] =
            inner.layout(&Layout::vertical([Constraint::Length(spark_h), Constraint::Fill(1)]));
        if let Some(worst) = self.state.worst_quant()
            && spark.height > 0
        {
            render_sparkline(worst, spark, buf);
        }
        let body_h = usize::from(table.height.saturating_sub(1));
        let shown = window(rows.len(), body_h, self.offset);
        let layer_w = usize::from(table.width.saturating_sub(if self.compact { 20 } else { 64 }));
        let lines = rows[shown].iter().map(|q| {
            let style = if q.error.sqnr_db < self.threshold { THEME.warn } else { Style::new() };
            let mut cells = vec![Cell::from(tail_chars(&q.error.layer, layer_w.max(8)))];
            if self.compact {
                cells.push(Cell::from(q.error.kind.to_string()));
                cells.push(Cell::from(format!("{:.1}", q.error.sqnr_db)));
            } else {
                cells.extend([
                    Cell::from(q.error.kind.to_string()),
                    Cell::from(q.error.bits.to_string()),
                    Cell::from(num(q.error.scale)),
                    Cell::from(format!("{}", q.error.zero_point)),
                    Cell::from(num(q.error.mse)),
                    Cell::from(format!("{:.2}", q.error.sqnr_db)),
                    Cell::from(format!("{:.2}%", 100.0 * q.error.clip_frac)),
                ]);
            }
            Row::new(cells).style(style)
        });
        let (header, widths): (Vec<&str>, Vec<Constraint>) = if self.compact {
            (
                vec!["layer", "kind", "SQNR dB"],
                vec![Constraint::Fill(1), Constraint::Length(6), Constraint::Length(8)],
            )
        } else {
            (
                vec!["layer", "kind", "bits", "scale", "zp", "MSE", "SQNR dB", "clip"],
                vec![
                    Constraint::Fill(1),
                    Constraint::Length(6),
                    Constraint::Length(4),
                    Constraint::Length(9),
                    Constraint::Length(4),
                    Constraint::Length(9),
                    Constraint::Length(8),
                    Constraint::Length(7),
                ],
            )
        };
        Table::new(lines, widths)
            .header(Row::new(header).style(THEME.title))
            .column_spacing(1)
            .render(table, buf);
    }
}

fn render_sparkline(worst: &QuantLayer, area: Rect, buf: &mut Buffer) {
    let [label, line] =
        area.layout(&Layout::vertical([Constraint::Length(1), Constraint::Fill(1)]));
    let (lo, hi) = worst
        .history
        .iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), p| (a.min(p.1), b.max(p.1)));
    Paragraph::new(Line::from(vec![
        Span::styled("worst SQNR: ", THEME.label),
        Span::styled(worst.error.layer.clone(), THEME.value),
        Span::styled(
            format!(
                "  {:.2} dB now, {lo:.1}..{hi:.1} dB over {} steps",
                worst.error.sqnr_db,
                worst.history.len()
            ),
            THEME.label,
        ),
    ]))
    .render(label, buf);
    // Bars relative to the range seen (dB can be negative).
    let width = usize::from(line.width);
    let tail = &worst.history[worst.history.len().saturating_sub(width)..];
    let data: Vec<u64> = tail
        .iter()
        .map(|p| (1.0 + 99.0 * (p.1 - lo) / (hi - lo).max(1e-6)).round() as u64)
        .collect();
    Sparkline::default()
        .block(Block::default())
        .style(Style::new().fg(THEME.train))
        .max(100)
        .data(&data)
        .render(line, buf);
}
