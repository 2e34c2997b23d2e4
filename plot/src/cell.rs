//! A DARTS cell as pt.darts' `visualize.py` draws it: the inputs `c_{k-2}` and `c_{k-1}`
//! (green), intermediate nodes `0, 1, …` (blue), the output `c_{k}` (yellow), each kept edge
//! labelled with its op, and the concatenated nodes joined to the output. graphviz's `dot`
//! lays it out when it is installed; otherwise the cell is laid out in columns (inputs, one
//! column per node, output) and drawn here, with the same colours and labels.

use std::path::{Path, PathBuf};
use std::process::Command;

use plotters::coord::Shift;
use plotters::prelude::*;
use qdarts_genotypes::{Bits, Edge};

use crate::{Figure, PlotError, de, op_color, save, write_file};

/// How to lay out a cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renderer {
    /// graphviz `dot` when it is on `PATH`, else [`Renderer::Builtin`].
    Auto,
    /// graphviz `dot` (an error when it is missing).
    Dot,
    /// The layout drawn here.
    Builtin,
}

/// A cell to draw.
#[derive(Debug, Clone, Copy)]
pub struct Cell<'a> {
    /// `normal` or `reduce`.
    pub name: &'a str,
    /// Incoming edges per intermediate node.
    pub nodes: &'a [Vec<Edge>],
    /// Concatenated states.
    pub concat: &'a [usize],
    /// Bits of each kept op (from a bit-width search), shaped as `nodes`.
    pub bits: Option<&'a [Vec<Bits>]>,
}

impl Cell<'_> {
    /// The label of edge `j` of node `i`: its op, and its bits when known (`sep_conv_3x3 w4a8`).
    fn label(&self, i: usize, j: usize) -> String {
        let op = self.nodes[i][j].op.name();
        match self.bits.and_then(|b| b.get(i)).and_then(|n| n.get(j)) {
            Some(b) => format!("{op} {b}"),
            None => op.to_string(),
        }
    }
}

/// A cell state as pt.darts' `visualize.py` names it: the inputs `c_{k-2}` and `c_{k-1}`, the
/// intermediate nodes from 0.
pub(crate) fn state_name(s: usize) -> String {
    match s {
        0 => "c_{k-2}".into(),
        1 => "c_{k-1}".into(),
        n => (n - 2).to_string(),
    }
}

/// The cell in graphviz DOT, with pt.darts' styles.
pub fn to_dot(cell: &Cell<'_>) -> String {
    let mut s = String::new();
    s.push_str(&format!("digraph {} {{\n", cell.name));
    s.push_str("  rankdir=LR;\n");
    s.push_str(
        "  node [style=\"filled,rounded\", shape=rect, align=center, fontsize=20, height=0.5, \
         width=0.5, penwidth=2, fontname=\"helvetica\"];\n",
    );
    s.push_str("  edge [fontsize=20, fontname=\"times\"];\n");
    s.push_str(
        "  \"c_{k-2}\" [fillcolor=darkseagreen2];\n  \"c_{k-1}\" [fillcolor=darkseagreen2];\n",
    );
    for i in 0..cell.nodes.len() {
        s.push_str(&format!("  \"{i}\" [fillcolor=lightblue];\n"));
    }
    for (i, edges) in cell.nodes.iter().enumerate() {
        for (j, e) in edges.iter().enumerate() {
            s.push_str(&format!(
                "  \"{}\" -> \"{i}\" [label=\"{}\", fillcolor=gray];\n",
                state_name(e.input),
                cell.label(i, j)
            ));
        }
    }
    s.push_str("  \"c_{k}\" [fillcolor=palegoldenrod];\n");
    for &c in cell.concat {
        s.push_str(&format!("  \"{}\" -> \"c_{{k}}\" [fillcolor=gray];\n", state_name(c)));
    }
    s.push_str("}\n");
    s
}

/// Whether graphviz's `dot` runs.
pub fn dot_available() -> bool {
    Command::new("dot").arg("-V").output().is_ok_and(|o| o.status.success())
}

fn run_dot(dot: &Path, format: &str, out: &Path) -> Result<(), PlotError> {
    let o = Command::new("dot")
        .arg(format!("-T{format}"))
        .arg("-o")
        .arg(out)
        .arg(dot)
        .output()
        .map_err(|e| PlotError::Draw {
            what: dot.display().to_string(),
            message: format!("running dot: {e}"),
        })?;
    if !o.status.success() {
        return Err(PlotError::Draw {
            what: dot.display().to_string(),
            message: format!("dot failed: {}", String::from_utf8_lossy(&o.stderr).trim()),
        });
    }
    Ok(())
}

/// Writes `<base>.dot`, `<base>.svg` and `<base>.png` of a cell; returns the paths written.
pub fn draw_cell(
    cell: &Cell<'_>,
    base: &Path,
    renderer: Renderer,
) -> Result<Vec<PathBuf>, PlotError> {
    let dot_path = base.with_extension("dot");
    write_file(&dot_path, to_dot(cell).as_bytes())?;
    let use_dot = match renderer {
        Renderer::Auto => dot_available(),
        Renderer::Dot => {
            if !dot_available() {
                return Err(PlotError::Draw {
                    what: base.display().to_string(),
                    message:
                        "graphviz `dot` is not installed (apt-get install graphviz), or use the \
                              built-in layout"
                            .into(),
                });
            }
            true
        }
        Renderer::Builtin => false,
    };
    let mut files = vec![dot_path.clone()];
    if use_dot {
        for ext in ["svg", "png"] {
            let out = base.with_extension(ext);
            let tmp = base.with_extension(format!("{ext}.tmp"));
            run_dot(&dot_path, ext, &tmp)?;
            std::fs::rename(&tmp, &out).map_err(crate::io_err(&out))?;
            files.push(out);
        }
    } else {
        let layout = Layout::new(cell);
        files.extend(save(&layout, base, layout.size)?);
    }
    Ok(files)
}

/// The built-in layout: columns of boxes, curved labelled edges.
struct Layout<'a> {
    cell: Cell<'a>,
    size: (u32, u32),
    /// Centre of each state's box, and the output's.
    centres: Vec<(i32, i32)>,
    output: (i32, i32),
}

const BOX_W: i32 = 96;
const BOX_H: i32 = 40;
const COL: i32 = 230;

impl<'a> Layout<'a> {
    fn new(cell: &Cell<'a>) -> Self {
        let n = cell.nodes.len() as i32;
        let h = 480;
        let w = 90 + COL * (n + 1) + BOX_W;
        let x0 = 40 + BOX_W / 2;
        let mut centres = vec![(x0, h / 6), (x0, 5 * h / 6)];
        for i in 0..n {
            // Alternate above and below the middle so that edges between nodes stay apart
            // and long edges pass between the boxes.
            let y = if n == 1 {
                h / 2
            } else if i % 2 == 0 {
                h / 2 - 55
            } else {
                h / 2 + 55
            };
            centres.push((x0 + COL * (i + 1), y));
        }
        let output = (x0 + COL * (n + 1), h / 2);
        Layout { cell: *cell, size: (w as u32, h as u32), centres, output }
    }
}

fn bezier(a: (f64, f64), c: (f64, f64), b: (f64, f64), t: f64) -> (f64, f64) {
    let u = 1.0 - t;
    (u * u * a.0 + 2.0 * u * t * c.0 + t * t * b.0, u * u * a.1 + 2.0 * u * t * c.1 + t * t * b.1)
}

fn draw_box<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    (x, y): (i32, i32),
    label: &str,
    fill: RGBColor,
) -> Result<(), String> {
    let (x0, y0, x1, y1) = (x - BOX_W / 2, y - BOX_H / 2, x + BOX_W / 2, y + BOX_H / 2);
    root.draw(&Rectangle::new([(x0, y0), (x1, y1)], fill.filled())).map_err(de)?;
    root.draw(&Rectangle::new([(x0, y0), (x1, y1)], BLACK.stroke_width(2))).map_err(de)?;
    let style = TextStyle::from(("sans-serif", 18).into_font()).color(&BLACK).pos(
        plotters::style::text_anchor::Pos::new(
            plotters::style::text_anchor::HPos::Center,
            plotters::style::text_anchor::VPos::Center,
        ),
    );
    root.draw(&Text::new(label.to_string(), (x, y), style)).map_err(de)
}

/// The control point of an edge: a slight bend (`bend` pixels across the chord) between
/// neighbouring columns; an edge that skips columns arcs over (or under) the boxes between,
/// on the side its source sits.
fn control(a: (f64, f64), b: (f64, f64), bend: f64, middle: f64) -> (f64, f64) {
    let (dx, dy) = (b.0 - a.0, b.1 - a.1);
    let len = (dx * dx + dy * dy).sqrt().max(1.0);
    let mid = ((a.0 + b.0) / 2.0, (a.1 + b.1) / 2.0);
    let span = dx / f64::from(COL);
    if span <= 1.2 {
        return (mid.0 - dy / len * bend, mid.1 + dx / len * bend);
    }
    let lift = 90.0 + 25.0 * span + bend.abs();
    let y = if a.1 <= middle { a.1.min(b.1) - lift } else { a.1.max(b.1) + lift };
    (mid.0, y)
}

/// An edge from the right side of one box to the left side of another (see [`control`]),
/// with an arrow head; returns its midpoint for the label.
fn draw_edge<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    from: (i32, i32),
    to: (i32, i32),
    bend: f64,
    color: RGBColor,
    middle: f64,
) -> Result<(f64, f64), String> {
    let a = (f64::from(from.0 + BOX_W / 2), f64::from(from.1));
    let b = (f64::from(to.0 - BOX_W / 2), f64::from(to.1));
    let c = control(a, b, bend, middle);
    let pts: Vec<(i32, i32)> = (0..=40)
        .map(|i| bezier(a, c, b, f64::from(i) / 40.0))
        .map(|(x, y)| (x.round() as i32, y.round() as i32))
        .collect();
    root.draw(&PathElement::new(pts, color.stroke_width(2))).map_err(de)?;
    // Arrow head along the curve's last stretch.
    let p = bezier(a, c, b, 0.95);
    let (ux, uy) = (b.0 - p.0, b.1 - p.1);
    let ul = (ux * ux + uy * uy).sqrt().max(1e-9);
    let (ux, uy) = (ux / ul, uy / ul);
    let back = (b.0 - 12.0 * ux, b.1 - 12.0 * uy);
    let head = vec![
        (b.0.round() as i32, b.1.round() as i32),
        ((back.0 - 5.0 * uy).round() as i32, (back.1 + 5.0 * ux).round() as i32),
        ((back.0 + 5.0 * uy).round() as i32, (back.1 - 5.0 * ux).round() as i32),
    ];
    root.draw(&Polygon::new(head, color.filled())).map_err(de)?;
    Ok(bezier(a, c, b, 0.5))
}

impl Figure for Layout<'_> {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        let title = TextStyle::from(("sans-serif", 16).into_font()).color(&BLACK);
        root.draw(&Text::new(format!("{} cell", self.cell.name), (10, 8), title)).map_err(de)?;
        let middle = f64::from(self.size.1) / 2.0;
        let mut labels = Vec::new();
        for (i, edges) in self.cell.nodes.iter().enumerate() {
            for (j, e) in edges.iter().enumerate() {
                let from = self.centres[e.input];
                let to = self.centres[i + 2];
                // Edges into one node bend to either side; longer edges bend more.
                let span = f64::from((to.0 - from.0).abs()) / f64::from(COL);
                let side = if j % 2 == 0 { 1.0 } else { -1.0 };
                let bend = side * (18.0 + 14.0 * (span - 1.0).max(0.0));
                let mid = draw_edge(root, from, to, bend, op_color(e.op.name()), middle)?;
                labels.push((mid, self.cell.label(i, j)));
            }
        }
        for &s in self.cell.concat {
            draw_edge(root, self.centres[s], self.output, 0.0, RGBColor(128, 128, 128), middle)?;
        }
        // Boxes over the edges, labels over everything.
        let green = RGBColor(180, 238, 180);
        draw_box(root, self.centres[0], "c_{k-2}", green)?;
        draw_box(root, self.centres[1], "c_{k-1}", green)?;
        for i in 0..self.cell.nodes.len() {
            draw_box(root, self.centres[i + 2], &i.to_string(), RGBColor(173, 216, 230))?;
        }
        draw_box(root, self.output, "c_{k}", RGBColor(238, 232, 170))?;
        let style = TextStyle::from(("sans-serif", 14).into_font()).color(&BLACK).pos(
            plotters::style::text_anchor::Pos::new(
                plotters::style::text_anchor::HPos::Center,
                plotters::style::text_anchor::VPos::Center,
            ),
        );
        for ((x, y), name) in labels {
            let (x, y) = (x.round() as i32, y.round() as i32);
            let half = 4 * name.len() as i32 + 4;
            root.draw(&Rectangle::new(
                [(x - half, y - 9), (x + half, y + 9)],
                WHITE.mix(0.85).filled(),
            ))
            .map_err(de)?;
            root.draw(&Text::new(name, (x, y), style.clone())).map_err(de)?;
        }
        Ok(())
    }
}
