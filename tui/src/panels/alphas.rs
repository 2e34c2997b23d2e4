//! Architecture weights: the softmax of α per edge of one cell type as a heat map (latest
//! epoch), and the mean normalized entropy of both cell types over the epochs.

use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::symbols::Marker;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Axis, Chart, Dataset, GraphType, LegendPosition, Paragraph, Widget};

use super::{block, framed};
use crate::state::{CellType, DashboardState};
use crate::theme::{THEME, heat};

/// The α panel.
#[derive(Debug)]
pub struct AlphaPanel<'a> {
    /// The run.
    pub state: &'a DashboardState,
    /// Which cell's heat map.
    pub cell: CellType,
}

/// Short column names: `sep_conv_3x3` → `sep3`, `skip_connect` → `skip`.
pub fn short_op(op: &str) -> String {
    let size = op.rsplit('_').next().and_then(|k| k.split('x').next()).unwrap_or("");
    let kind = match op.split('_').next().unwrap_or(op) {
        "max" => "max",
        "avg" => "avg",
        "skip" => return "skip".into(),
        "none" => return "none".into(),
        "sep" => "sep",
        "dil" => "dil",
        "conv" if op.contains("7x1") => return "c7x1".into(),
        "conv" => "conv",
        other => return other.chars().take(5).collect(),
    };
    format!("{kind}{size}")
}

/// The label of edge `e`: `node←input`, nodes numbered from 2 as in DARTS (0 and 1 are the
/// cell's inputs).
pub fn edge_label(e: usize) -> String {
    let (mut node, mut first) = (0, 0);
    while e >= first + node + 2 {
        first += node + 2;
        node += 1;
    }
    format!("{}←{}", node + 2, e - first)
}

impl Widget for &AlphaPanel<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let s = self.state;
        let cell_name = match self.cell {
            CellType::Normal => "normal",
            CellType::Reduce => "reduce",
        };
        let Some(latest) = s.alphas.last() else {
            let inner = framed("architecture weights", area, buf);
            Paragraph::new(Line::styled("no alphas.csv rows yet (written per epoch)", THEME.dim))
                .render(inner, buf);
            return;
        };
        let edges = latest.cell(self.cell);
        let heat_h = u16::try_from(edges.len() + 3).unwrap_or(u16::MAX);
        let [top, bottom] =
            area.layout(&Layout::vertical([Constraint::Length(heat_h), Constraint::Fill(1)]));
        let inner = framed(
            format!(
                "softmax(α), {cell_name} cell, epoch {} (c: other cell) · bold: strongest non-none op",
                latest.epoch + 1
            ),
            top,
            buf,
        );
        let col_w = 7;
        let mut lines = vec![Line::from(
            std::iter::once(Span::styled(format!("{:<6}", "edge"), THEME.title))
                .chain(
                    s.ops
                        .iter()
                        .map(|o| Span::styled(format!("{:>col_w$}", short_op(o)), THEME.title)),
                )
                .collect::<Vec<_>>(),
        )];
        for (e, w) in edges.iter().enumerate() {
            let finite = w.iter().copied().filter(|v| v.is_finite());
            let (lo, hi) =
                finite.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| (a.min(v), b.max(v)));
            let best = w
                .iter()
                .enumerate()
                .filter(|(k, v)| s.ops.get(*k).is_some_and(|o| o != "none") && v.is_finite())
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map(|(k, _)| k);
            let mut spans = vec![Span::styled(format!("{:<6}", edge_label(e)), THEME.label)];
            for (k, v) in w.iter().enumerate() {
                let frac = (v - lo) / (hi - lo).max(1e-12);
                let mut style = Style::new().bg(heat(frac)).fg(Color::White);
                if best == Some(k) {
                    style = style.add_modifier(Modifier::BOLD | Modifier::UNDERLINED);
                }
                spans.push(Span::styled(format!("{:>col_w$.3}", v), style));
            }
            lines.push(Line::from(spans));
        }
        Paragraph::new(lines).render(inner, buf);

        // Entropy over epochs, both cells; epochs counted from 1 as the header counts them (the
        // record's rows count from 0).
        let series = |c: CellType| -> Vec<(f64, f64)> {
            s.alphas.iter().filter_map(|a| Some(((a.epoch + 1) as f64, a.entropy(c)?))).collect()
        };
        let (n, r) = (series(CellType::Normal), series(CellType::Reduce));
        let now = |v: &[(f64, f64)]| v.last().map_or("-".into(), |p| format!("{:.3}", p.1));
        let x_max = ((latest.epoch + 1) as f64).max(2.0);
        // Entropy falls slowly: zoom the axis onto the range seen (never below 0).
        let lowest = n.iter().chain(&r).map(|p| p.1).fold(1.0_f64, f64::min);
        let y_lo = (lowest - 0.25 * (1.0 - lowest) - 0.005).max(0.0);
        Chart::new(vec![
            Dataset::default()
                .name(format!("normal {}", now(&n)))
                .marker(Marker::Braille)
                .graph_type(GraphType::Line)
                .style(Style::new().fg(THEME.train))
                .data(&n),
            Dataset::default()
                .name(format!("reduce {}", now(&r)))
                .marker(Marker::Braille)
                .graph_type(GraphType::Line)
                .style(Style::new().fg(THEME.val))
                .data(&r),
        ])
        .block(block("mean edge entropy / ln(ops) per epoch (1 = uniform)"))
        .legend_position(Some(LegendPosition::TopRight))
        .x_axis(
            Axis::default()
                .title("epoch")
                .style(THEME.dim)
                .bounds([1.0, x_max])
                .labels(["1".to_string(), format!("{x_max:.0}")]),
        )
        .y_axis(Axis::default().style(THEME.dim).bounds([y_lo, 1.0]).labels([
            format!("{y_lo:.2}"),
            format!("{:.2}", 0.5 * (y_lo + 1.0)),
            "1".into(),
        ]))
        .render(bottom, buf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edges_are_labelled_node_from_input_as_darts_numbers_them() {
        // Node 2 has inputs 0,1; node 3 has 0,1,2; node 4 has 0..3.
        let labels: Vec<String> = (0..9).map(edge_label).collect();
        assert_eq!(labels, ["2←0", "2←1", "3←0", "3←1", "3←2", "4←0", "4←1", "4←2", "4←3"]);
        assert_eq!(short_op("sep_conv_3x3"), "sep3");
        assert_eq!(short_op("dil_conv_5x5"), "dil5");
        assert_eq!(short_op("max_pool_3x3"), "max3");
        assert_eq!(short_op("skip_connect"), "skip");
        assert_eq!(short_op("conv_7x1_1x7"), "c7x1");
    }
}
