//! The current derived genotype, one line per node, and how it changed from epoch to epoch.

use qdarts_genotypes::{Edge, Genotype, edge_index};
use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Widget, Wrap};

use super::framed;
use crate::state::{CellType, DashboardState};
use crate::theme::THEME;

/// The genotype panel.
#[derive(Debug)]
pub struct GenotypePanel<'a> {
    /// The run.
    pub state: &'a DashboardState,
    /// First history line shown.
    pub offset: usize,
    /// Leave out the history (the overview).
    pub compact: bool,
}

fn edges(e: &[Edge]) -> String {
    e.iter().map(|x| format!("{} ← {}", x.op, x.input)).collect::<Vec<_>>().join(", ")
}

/// A node's edges with the widths of each op (`sep_conv_3x3 w4a8 ← 0`), where `widths` knows
/// them; `node` is the node's index (0: state 2).
fn edges_with(e: &[Edge], node: usize, s: &DashboardState, cell: CellType) -> String {
    e.iter()
        .map(|x| match s.op_widths(cell, edge_index(node, x.input), x.op.name()) {
            Some((w, a)) => format!("{} w{w}a{a} ← {}", x.op, x.input),
            None => format!("{} ← {}", x.op, x.input),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// One line per node of both cells, with each op's widths where a bit-width search recorded
/// them in `s`.
pub fn cell_lines(g: &Genotype, s: &DashboardState) -> Vec<Line<'static>> {
    let mut lines = Vec::new();
    for (name, cell, concat, ct) in [
        ("normal", &g.normal, &g.normal_concat, CellType::Normal),
        ("reduce", &g.reduce, &g.reduce_concat, CellType::Reduce),
    ] {
        let concat = concat.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
        lines.push(Line::styled(
            format!("{name} cell (output: concat of nodes {concat})"),
            THEME.title,
        ));
        for (i, node) in cell.iter().enumerate() {
            lines.push(Line::from(vec![
                Span::styled(format!("  node {}: ", i + 2), THEME.label),
                Span::styled(edges_with(node, i, s, ct), THEME.value),
            ]));
        }
    }
    lines
}

/// What changed between two genotypes, one entry per changed node.
pub fn changes(old: &Genotype, new: &Genotype) -> Vec<String> {
    let mut out = Vec::new();
    for (name, a, b) in [("normal", &old.normal, &new.normal), ("reduce", &old.reduce, &new.reduce)]
    {
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            if x != y {
                out.push(format!("{name} node {}: {} → {}", i + 2, edges(x), edges(y)));
            }
        }
    }
    out
}

impl Widget for &GenotypePanel<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let s = self.state;
        let title = match (&s.final_genotype, s.genotypes.last()) {
            (Some(_), _) => "genotype (final)".to_string(),
            (None, Some((e, _))) => format!("genotype after epoch {}", e + 1),
            (None, None) => "genotype".to_string(),
        };
        let hist_h = if self.compact { 0 } else { 12 };
        let [top, bottom] =
            area.layout(&Layout::vertical([Constraint::Fill(1), Constraint::Length(hist_h)]));
        let inner = framed(title, top, buf);
        let lines = match s.current_genotype() {
            None => vec![Line::styled("no genotype yet (derived at each epoch end)", THEME.dim)],
            Some(text) => match Genotype::from_darts_text(text) {
                Ok(g) => {
                    let mut lines = Vec::new();
                    if let Some(alert) = g.collapse_alert() {
                        lines.push(Line::styled(format!("⚠ {alert}"), THEME.bad));
                    }
                    lines.extend(cell_lines(&g, s));
                    lines
                }
                Err(_) => vec![Line::raw(text.to_string())],
            },
        };
        Paragraph::new(lines).wrap(Wrap { trim: false }).render(inner, buf);
        if bottom.height == 0 {
            return;
        }
        let parsed: Vec<(usize, Option<Genotype>)> =
            s.genotypes.iter().map(|(e, t)| (*e, Genotype::from_darts_text(t).ok())).collect();
        let mut hist = Vec::new();
        for w in parsed.windows(2) {
            let (e, new) = (&w[1].0, &w[1].1);
            match (&w[0].1, new) {
                (Some(a), Some(b)) => {
                    let c = changes(a, b);
                    let head = format!("epoch {}: {} node(s) changed", e + 1, c.len());
                    let style = if c.is_empty() { THEME.dim } else { THEME.warn };
                    hist.push(Line::styled(head, style));
                    hist.extend(c.into_iter().map(|x| Line::styled(format!("  {x}"), THEME.value)));
                }
                _ => hist
                    .push(Line::styled(format!("epoch {}: unreadable genotype", e + 1), THEME.bad)),
            }
        }
        let inner = framed(format!("changes over {} epochs", s.genotypes.len()), bottom, buf);
        let start = self.offset.min(hist.len().saturating_sub(usize::from(inner.height)));
        Paragraph::new(hist.split_off(start.min(hist.len()))).render(inner, buf);
    }
}
