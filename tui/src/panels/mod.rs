//! The dashboard's panels: each is plain data borrowed from the state plus view options, and
//! renders itself with `impl Widget for &Panel`.

mod alphas;
mod curves;
mod genotype;
mod header;
mod nan;
mod quant;

pub use alphas::AlphaPanel;
pub use curves::{Curve, Curves};
pub use genotype::GenotypePanel;
pub use header::Header;
pub use nan::NanTable;
pub use quant::{QuantSort, QuantTable};

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::text::Line;
use ratatui::widgets::{Block, Widget};

use crate::theme::THEME;

/// A bordered panel with a title.
fn block(title: impl Into<String>) -> Block<'static> {
    Block::bordered().title(Line::styled(format!(" {} ", title.into()), THEME.title))
}

/// Draws a titled frame over `area` and returns the area inside it.
fn framed(title: impl Into<String>, area: Rect, buf: &mut Buffer) -> Rect {
    let outer = block(title);
    let inner = outer.inner(area);
    outer.render(area, buf);
    inner
}

/// `3h05m`, `4m10s`, `12s`.
pub fn duration(secs: f64) -> String {
    if !secs.is_finite() || secs < 0.0 {
        return "-".into();
    }
    let s = secs.round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

/// A compact number: `0.0123`, `1.2e-5`, `NaN`.
pub fn num(v: f64) -> String {
    if !v.is_finite() {
        format!("{v}")
    } else if v != 0.0 && (v.abs() < 1e-3 || v.abs() >= 1e5) {
        format!("{v:.2e}")
    } else {
        format!("{v:.4}")
    }
}

/// The last `width` characters of a long name, with `…` in front.
pub fn tail_chars(s: &str, width: usize) -> String {
    let n = s.chars().count();
    if n <= width {
        s.to_string()
    } else if width == 0 {
        String::new()
    } else {
        let skip = n - width + 1;
        format!("…{}", s.chars().skip(skip).collect::<String>())
    }
}

/// Rows that fit in `height` lines after `offset`, with the offset clamped so the last page
/// stays full.
pub fn window(len: usize, height: usize, offset: usize) -> std::ops::Range<usize> {
    let start = offset.min(len.saturating_sub(height));
    start..(start + height).min(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_numbers_read_as_a_person_writes_them() {
        assert_eq!(duration(12.4), "12s");
        assert_eq!(duration(250.0), "4m10s");
        assert_eq!(duration(11_100.0), "3h05m");
        assert_eq!(duration(f64::NAN), "-");
        assert_eq!(num(0.0125), "0.0125");
        assert_eq!(num(1.2e-5), "1.20e-5");
        assert_eq!(num(f64::NAN), "NaN");
        assert_eq!(tail_chars("cells.0.edges.1.op", 8), "…es.1.op");
        assert_eq!(window(10, 4, 100), 6..10);
        assert_eq!(window(3, 4, 2), 0..3);
    }
}
