//! The header: run, status, epoch and step, learning rates, speed, ETA and the NaN count.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Widget};

use super::{duration, num};
use crate::state::{DashboardState, RunStatus, Verdict};
use crate::theme::THEME;

/// The two header lines.
#[derive(Debug)]
pub struct Header<'a> {
    /// The run.
    pub state: &'a DashboardState,
    /// The in-process search's status line, when the dashboard runs with the search.
    pub search: Option<(&'a str, bool)>,
}

impl Widget for &Header<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let s = self.state;
        let status = match &s.status {
            RunStatus::Running(pid) => Span::styled(format!("running (pid {pid})"), THEME.good),
            RunStatus::Finished => Span::styled("finished", THEME.good),
            RunStatus::Stopped => Span::styled("stopped (resumable)", THEME.warn),
        };
        let mut first = vec![
            Span::styled(s.run_name.clone(), THEME.title),
            Span::styled("  ", THEME.label),
            status,
        ];
        if let Some(t) = s.last() {
            let (epochs, spe) = s.plan.map_or(("?".into(), "?".into()), |p| {
                (p.epochs.to_string(), p.steps_per_epoch.to_string())
            });
            let in_epoch = s.plan.map_or(t.step, |p| {
                t.step.saturating_sub(t.epoch * p.steps_per_epoch).min(p.steps_per_epoch)
            });
            let total = s.total_steps().map_or("?".into(), |n| n.to_string());
            first.extend([
                Span::styled("  epoch ", THEME.label),
                Span::styled(format!("{}/{epochs}", t.epoch + 1), THEME.value),
                Span::styled("  step ", THEME.label),
                Span::styled(format!("{in_epoch}/{spe}"), THEME.value),
                Span::styled(format!(" (global {}/{total})", t.step), THEME.label),
            ]);
        } else {
            first.push(Span::styled("  waiting for the first step…", THEME.dim));
        }
        let nan = s.nan_count();
        let nan_style = if nan > 0 { THEME.bad } else { THEME.good };
        let mut second = vec![Span::styled("NaN events ", THEME.label)];
        second.push(Span::styled(format!(" {nan} "), nan_style));
        if let Some(t) = s.last() {
            second.extend([
                Span::styled("  lr ", THEME.label),
                Span::styled(num(t.lr), THEME.value),
                Span::styled("  arch lr ", THEME.label),
                Span::styled(num(t.arch_lr), THEME.value),
                Span::styled("  loss ", THEME.label),
                Span::styled(num(t.loss), THEME.value),
                Span::styled("  top1 ", THEME.label),
                Span::styled(format!("{:.1}%", 100.0 * t.top1), THEME.value),
            ]);
        }
        let rate = s.steps_per_sec();
        second.extend([
            Span::styled("  steps/s ", THEME.label),
            Span::styled(rate.map_or("-".into(), |r| format!("{r:.2}")), THEME.value),
            Span::styled("  ETA ", THEME.label),
            Span::styled(s.eta_seconds().map_or("-".into(), duration), THEME.value),
        ]);
        if let Some(last) = s.cost.last() {
            // The expected cost of the architecture at each epoch end, oldest first (at most 4).
            let trail: Vec<String> = s.cost[s.cost.len().saturating_sub(4)..]
                .iter()
                .map(|c| format!("{:.3e}", c.bitops))
                .collect();
            second.extend([
                Span::styled("  E[BitOPs] ", THEME.label),
                Span::styled(trail.join(" → "), THEME.value),
                Span::styled(format!("  E[weights] {:.0} B", last.weight_bytes), THEME.label),
            ]);
        }
        if let Some(last) = s.selection.last() {
            // The perturbation-based selection: how far it is, and its last verdict.
            let kept = s.selection.iter().filter(|r| r.verdict == Verdict::Kept).count();
            let removed = s.selection.len() - kept;
            let what = match last.verdict {
                Verdict::Kept => format!("{} kept", last.candidate),
                _ => "taken off its node".to_string(),
            };
            second.extend([
                Span::styled("  selection ", THEME.label),
                Span::styled(format!("{kept} ops kept, {removed} inputs removed"), THEME.value),
                Span::styled(
                    format!(
                        "  last: {} edge {}: {what} (top-1 {:+.1} pts without it)",
                        format!("{:?}", last.cell_type).to_lowercase(),
                        last.edge,
                        -100.0 * last.drop
                    ),
                    THEME.label,
                ),
            ]);
        }
        if s.collapse_alert().is_some() {
            second.push(Span::styled("  collapse: normal cell mostly parameter-free", THEME.bad));
        }
        if s.skipped_rows > 0 {
            second.push(Span::styled(format!("  {} rows skipped", s.skipped_rows), THEME.warn));
        }
        if let Some((text, failed)) = self.search {
            second.push(Span::styled("  search: ", THEME.label));
            second
                .push(Span::styled(text.to_string(), if failed { THEME.bad } else { THEME.good }));
        }
        Paragraph::new(vec![Line::from(first), Line::from(second)]).render(area, buf);
    }
}
