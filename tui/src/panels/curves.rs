//! Loss and top-1 curves over global steps: a train line per step and a val point per epoch.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::symbols::Marker;
use ratatui::widgets::{Axis, Chart, Dataset, GraphType, LegendPosition, Widget};

use super::block;
use crate::state::DashboardState;
use crate::theme::THEME;

/// Chart points `(step, value)`.
pub type Points = Vec<(f64, f64)>;

/// Which curve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Curve {
    /// Cross-entropy loss.
    Loss,
    /// Top-1 accuracy, percent.
    Top1,
}

/// A chart of one metric, train and val.
#[derive(Debug)]
pub struct Curves<'a> {
    /// The run.
    pub state: &'a DashboardState,
    /// Which metric.
    pub curve: Curve,
}

impl Curves<'_> {
    /// (train, val) points; non-finite losses are left out (the NaN panel lists them).
    pub fn points(&self) -> (Points, Points) {
        let pick = |loss: f64, top1: f64| match self.curve {
            Curve::Loss => loss,
            Curve::Top1 => 100.0 * top1,
        };
        let train = self
            .state
            .train
            .iter()
            .map(|t| (t.step as f64, pick(t.loss, t.top1)))
            .filter(|p| p.1.is_finite())
            .collect();
        let val = self
            .state
            .val
            .iter()
            .map(|v| (v.step as f64, pick(v.loss, v.top1)))
            .filter(|p| p.1.is_finite())
            .collect();
        (train, val)
    }
}

fn labels(lo: f64, hi: f64, digits: usize) -> Vec<String> {
    [lo, 0.5 * (lo + hi), hi].iter().map(|v| format!("{v:.digits$}")).collect()
}

impl Widget for &Curves<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let (train, val) = self.points();
        let (title, name) = match self.curve {
            Curve::Loss => ("loss", "loss"),
            Curve::Top1 => ("top-1 accuracy (%)", "top1"),
        };
        let x_max = self
            .state
            .total_steps()
            .map(|n| n as f64)
            .into_iter()
            .chain(train.last().map(|p| p.0))
            .fold(1.0_f64, f64::max);
        let (mut y_lo, mut y_hi) = train
            .iter()
            .chain(&val)
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| (a.min(p.1), b.max(p.1)));
        if self.curve == Curve::Top1 {
            (y_lo, y_hi) = (0.0, 100.0);
        } else if !(y_lo.is_finite() && y_hi.is_finite()) {
            (y_lo, y_hi) = (0.0, 1.0);
        } else {
            let pad = ((y_hi - y_lo) * 0.05).max(1e-3);
            (y_lo, y_hi) = ((y_lo - pad).max(0.0), y_hi + pad);
        }
        let datasets = vec![
            Dataset::default()
                .name(format!("train {name}"))
                .marker(Marker::Braille)
                .graph_type(GraphType::Line)
                .style(Style::new().fg(THEME.train))
                .data(&train),
            Dataset::default()
                .name(format!("val {name}"))
                .marker(Marker::Dot)
                .graph_type(GraphType::Scatter)
                .style(Style::new().fg(THEME.val))
                .data(&val),
        ];
        let digits = if self.curve == Curve::Top1 { 0 } else { 2 };
        Chart::new(datasets)
            .block(block(title))
            .legend_position(Some(LegendPosition::TopRight))
            .x_axis(
                Axis::default()
                    .title("step")
                    .style(THEME.dim)
                    .bounds([0.0, x_max])
                    .labels(labels(0.0, x_max, 0)),
            )
            .y_axis(
                Axis::default()
                    .style(THEME.dim)
                    .bounds([y_lo, y_hi])
                    .labels(labels(y_lo, y_hi, digits)),
            )
            .render(area, buf);
    }
}
