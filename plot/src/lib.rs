//! Pictures of qdarts runs, as SVG and PNG, without Burn:
//!
//! - [`cell`]: a DARTS cell drawn as pt.darts' `visualize.py` draws it (inputs `c_{k-2}`,
//!   `c_{k-1}`, intermediate nodes, output `c_{k}`, edges labelled with their ops), through
//!   graphviz's `dot` when it is installed, else laid out and drawn here;
//! - [`run`]: a run's loss and top-1 curves, its architecture weights per edge over epochs,
//!   and per-layer quantization error;
//! - [`across`]: many runs: final top-1 per group (mean ± std and each run), validation curves.
//!
//! Text is drawn with the DejaVu Sans font shipped in `assets/` (Bitstream Vera license), so
//! the pictures look the same on every machine.

pub mod across;
pub mod cell;
pub mod run;

use std::path::{Path, PathBuf};
use std::sync::Once;

use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use thiserror::Error;

/// What can go wrong while drawing.
#[derive(Debug, Error)]
pub enum PlotError {
    /// A file could not be read or written.
    #[error("{path}: {cause}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        cause: std::io::Error,
    },
    /// A run file could not be read.
    #[error("{0}")]
    Record(String),
    /// Nothing to draw.
    #[error("{0}")]
    Empty(String),
    /// The drawing library or graphviz failed.
    #[error("drawing {what}: {message}")]
    Draw {
        /// The figure.
        what: String,
        /// Its message.
        message: String,
    },
}

pub(crate) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> PlotError + '_ {
    move |cause| PlotError::Io { path: path.to_path_buf(), cause }
}

/// A drawing error as text.
pub(crate) fn de<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

static FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");
static REGISTER: Once = Once::new();

fn register_fonts() {
    REGISTER.call_once(|| {
        for style in [FontStyle::Normal, FontStyle::Bold] {
            // The font is shipped with the crate and parses; a failure would only mean
            // boxes where text should be, so it is not an error of the figure.
            let _ = plotters::style::register_font("sans-serif", style, FONT);
        }
    });
}

/// A figure that can be drawn on any plotters backend.
pub(crate) trait Figure {
    /// Draws itself on `root`.
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String>;
}

/// Writes `<base>.svg` and `<base>.png` of a figure; returns their paths.
pub(crate) fn save(
    fig: &impl Figure,
    base: &Path,
    (w, h): (u32, u32),
) -> Result<Vec<PathBuf>, PlotError> {
    register_fonts();
    let what = base.display().to_string();
    let draw_err = |message: String| PlotError::Draw { what: what.clone(), message };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (w, h)).into_drawing_area();
        root.fill(&WHITE).map_err(de).map_err(draw_err)?;
        fig.draw(&root).map_err(draw_err)?;
        root.present().map_err(de).map_err(draw_err)?;
    }
    let mut rgb = vec![0u8; w as usize * h as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut rgb, (w, h)).into_drawing_area();
        root.fill(&WHITE).map_err(de).map_err(draw_err)?;
        fig.draw(&root).map_err(draw_err)?;
        root.present().map_err(de).map_err(draw_err)?;
    }
    let svg_path = base.with_extension("svg");
    let png_path = base.with_extension("png");
    write_file(&svg_path, svg.as_bytes())?;
    write_file(&png_path, &encode_png(&rgb, w, h).map_err(draw_err)?)?;
    Ok(vec![svg_path, png_path])
}

/// An RGB buffer as PNG bytes.
pub(crate) fn encode_png(rgb: &[u8], w: u32, h: u32) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut out, w, h);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut writer = enc.write_header().map_err(de)?;
        writer.write_image_data(rgb).map_err(de)?;
        writer.finish().map_err(de)?;
    }
    Ok(out)
}

/// Writes a file whole (temp + rename, so a reader never sees half a picture).
pub(crate) fn write_file(path: &Path, bytes: &[u8]) -> Result<(), PlotError> {
    qdarts_record::write_atomic(path, bytes).map_err(|e| PlotError::Record(e.to_string()))
}

/// A chart over two `f64` ranges.
pub(crate) type Chart<'a, DB> = ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// A chart of the ranges `x × y` on `area`, with an optional caption, the axes described and
/// the mesh drawn.
pub(crate) fn new_chart<'a, DB: DrawingBackend>(
    area: &'a DrawingArea<DB, Shift>,
    caption: Option<&str>,
    (x, y): ((f64, f64), (f64, f64)),
    (x_desc, y_desc): (&str, &str),
) -> Result<Chart<'a, DB>, String> {
    let mut b = ChartBuilder::on(area);
    if let Some(c) = caption {
        b.caption(c, ("sans-serif", 14));
    }
    let mut chart = b
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(52)
        .build_cartesian_2d(x.0..x.1, y.0..y.1)
        .map_err(de)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .label_style(("sans-serif", 12))
        .draw()
        .map_err(de)?;
    Ok(chart)
}

/// The legend box of a chart's labelled series.
pub(crate) fn series_legend<'a, DB: DrawingBackend + 'a>(
    chart: &mut Chart<'a, DB>,
    position: SeriesLabelPosition,
) -> Result<(), String> {
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .position(position)
        .draw()
        .map_err(de)
}

/// A fixed colour per op, so that one op has one colour in every figure.
pub(crate) fn op_color(op: &str) -> RGBColor {
    match op {
        "none" => RGBColor(150, 150, 150),
        "max_pool_3x3" => RGBColor(31, 119, 180),
        "avg_pool_3x3" => RGBColor(174, 199, 232),
        "skip_connect" => RGBColor(255, 127, 14),
        "sep_conv_3x3" => RGBColor(44, 160, 44),
        "sep_conv_5x5" => RGBColor(152, 223, 138),
        "dil_conv_3x3" => RGBColor(214, 39, 40),
        "dil_conv_5x5" => RGBColor(255, 152, 150),
        "sep_conv_7x7" => RGBColor(148, 103, 189),
        _ => RGBColor(140, 86, 75),
    }
}

/// The n-th colour of a qualitative palette (groups, kinds).
pub(crate) fn series_color(i: usize) -> RGBColor {
    const P: [RGBColor; 8] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
    ];
    P[i % P.len()]
}

/// The range of some values with a margin, never empty.
pub(crate) fn padded_range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values.filter(|v| v.is_finite()) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    // One value (a single step or epoch) gets a visible span around it.
    let pad = if hi - lo < 1e-9 { (lo.abs() * 0.05).max(0.5) } else { (hi - lo) * 0.05 };
    (lo - pad, hi + pad)
}
