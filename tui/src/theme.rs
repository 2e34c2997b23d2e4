//! The dashboard's colours and styles, in one place. Only the 16 basic colours and a few
//! indexed ones, so it reads the same over SSH on any terminal.

use ratatui::style::{Color, Modifier, Style};

/// Styles of the dashboard.
#[derive(Debug, Clone, Copy)]
pub struct Theme {
    /// Panel titles.
    pub title: Style,
    /// Labels before values.
    pub label: Style,
    /// Values.
    pub value: Style,
    /// Healthy.
    pub good: Style,
    /// Trouble (NaN events, low SQNR, a failed search).
    pub bad: Style,
    /// Attention.
    pub warn: Style,
    /// Secondary text.
    pub dim: Style,
    /// The selected tab or row.
    pub selected: Style,
    /// Key names in the help line.
    pub key: Style,
    /// Training curves.
    pub train: Color,
    /// Validation curves.
    pub val: Color,
    /// Heat-map colours from weakest to strongest.
    pub heat: [Color; 6],
}

/// The theme.
pub const THEME: Theme = Theme {
    title: Style::new().fg(Color::Cyan).add_modifier(Modifier::BOLD),
    label: Style::new().fg(Color::Gray),
    value: Style::new().fg(Color::White).add_modifier(Modifier::BOLD),
    good: Style::new().fg(Color::Green),
    bad: Style::new().fg(Color::White).bg(Color::Red).add_modifier(Modifier::BOLD),
    warn: Style::new().fg(Color::Yellow),
    dim: Style::new().fg(Color::DarkGray),
    selected: Style::new().fg(Color::Black).bg(Color::Cyan).add_modifier(Modifier::BOLD),
    key: Style::new().fg(Color::Black).bg(Color::Gray),
    train: Color::Yellow,
    val: Color::Cyan,
    heat: [
        Color::Indexed(17),
        Color::Indexed(19),
        Color::Indexed(25),
        Color::Indexed(30),
        Color::Indexed(172),
        Color::Indexed(196),
    ],
};

/// The heat colour of a fraction in [0, 1].
pub fn heat(frac: f64) -> Color {
    let n = THEME.heat.len();
    let i =
        if frac.is_finite() { (frac.clamp(0.0, 1.0) * (n - 1) as f64).round() as usize } else { 0 };
    THEME.heat[i.min(n - 1)]
}
