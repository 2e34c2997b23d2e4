//! The pictures of one run: its cells, loss and top-1 curves, architecture weights per edge
//! over epochs (search runs), and per-layer quantization error.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::prelude::*;
use qdarts_genotypes::Genotype;
use qdarts_record::{
    AlphaRow, CellType, MetricsRow, Phase, QuantErrorRow, RunLayout, Table, TensorRole, read_table,
};

use crate::cell::{Cell, Renderer, draw_cell, state_name};
use crate::{
    Figure, PlotError, de, io_err, new_chart, op_color, padded_range, save, series_color,
    series_legend,
};

fn read<T: Table>(layout: &RunLayout) -> Result<Vec<T>, PlotError> {
    let path = layout.table::<T>();
    if !path.exists() {
        return Ok(Vec::new());
    }
    read_table(&path).map_err(|e| PlotError::Record(e.to_string()))
}

/// Draws every picture a run's record allows into `out`; returns the files written.
pub fn plot_run(dir: &Path, out: &Path, renderer: Renderer) -> Result<Vec<PathBuf>, PlotError> {
    let layout = RunLayout::new(dir);
    if !layout.config().exists() {
        return Err(PlotError::Record(format!(
            "{}: not a run folder (no config.toml)",
            dir.display()
        )));
    }
    std::fs::create_dir_all(out).map_err(io_err(out))?;
    let mut files = Vec::new();
    let gpath = layout.genotype_json();
    if gpath.exists() {
        let text = std::fs::read_to_string(&gpath).map_err(io_err(&gpath))?;
        let g = Genotype::from_json(&text)
            .map_err(|e| PlotError::Record(format!("{}: {e}", gpath.display())))?;
        for (name, nodes, concat, bits) in [
            ("normal", &g.normal, &g.normal_concat, g.normal_bits.as_deref()),
            ("reduce", &g.reduce, &g.reduce_concat, g.reduce_bits.as_deref()),
        ] {
            let cell = Cell { name, nodes, concat, bits };
            files.extend(draw_cell(&cell, &out.join(name), renderer)?);
        }
    }
    let metrics: Vec<MetricsRow> = read(&layout)?;
    if !metrics.is_empty() {
        files.extend(save(&Curves::new(&metrics, dir), &out.join("curves"), (1100, 420))?);
    }
    let alphas: Vec<AlphaRow> = read(&layout)?;
    for (cell, name) in [(CellType::Normal, "normal"), (CellType::Reduce, "reduce")] {
        let rows: Vec<&AlphaRow> = alphas.iter().filter(|r| r.cell_type == cell).collect();
        if rows.is_empty() {
            continue;
        }
        let fig = Alphas::new(name, &rows);
        let size = fig.size();
        files.extend(save(&fig, &out.join(format!("alphas-{name}")), size)?);
    }
    let quant: Vec<QuantErrorRow> = read(&layout)?;
    if !quant.is_empty() {
        files.extend(save(&QuantErrorFigure::new(&quant), &out.join("quant-error"), (1100, 720))?);
    }
    if files.is_empty() {
        return Err(PlotError::Empty(format!("{}: nothing recorded yet to draw", dir.display())));
    }
    Ok(files)
}

/// Loss and top-1 over steps: training steps as a line, validations as points.
struct Curves {
    title: String,
    train: Vec<(f64, f64, f64)>,
    val: Vec<(f64, f64, f64)>,
    val_name: &'static str,
}

impl Curves {
    fn new(rows: &[MetricsRow], dir: &Path) -> Self {
        let pick = |p: Phase| -> Vec<(f64, f64, f64)> {
            rows.iter()
                .filter(|r| r.phase == p)
                .map(|r| (r.step as f64, r.loss, 100.0 * r.top1))
                .collect()
        };
        let is_search = rows.iter().any(|r| r.arch_lr > 0.0);
        Curves {
            title: dir.file_name().map_or_else(String::new, |f| f.to_string_lossy().into()),
            train: pick(Phase::Train),
            val: pick(Phase::Val),
            val_name: if is_search { "val (α split)" } else { "test" },
        }
    }
}

impl Figure for Curves {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        let root = root.titled(&self.title, ("sans-serif", 18)).map_err(de)?;
        let (left, right) = root.split_horizontally(550);
        let all = || self.train.iter().chain(&self.val);
        let steps = padded_range(all().map(|p| p.0));
        for (area, pick, name) in [(&left, 1usize, "loss"), (&right, 2usize, "top-1 %")] {
            let get = |p: &(f64, f64, f64)| if pick == 1 { p.1 } else { p.2 };
            let ys = padded_range(all().map(get));
            let mut chart = new_chart(area, None, (steps, ys), ("step", name))?;
            let c0 = series_color(0);
            chart
                .draw_series(LineSeries::new(
                    self.train.iter().map(|p| (p.0, get(p))),
                    c0.stroke_width(1),
                ))
                .map_err(de)?
                .label(if pick == 1 { "train (step)" } else { "train (running, epoch)" })
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], c0.stroke_width(2))
                });
            let c1 = series_color(1);
            chart
                .draw_series(LineSeries::new(
                    self.val.iter().map(|p| (p.0, get(p))),
                    c1.stroke_width(2),
                ))
                .map_err(de)?
                .label(self.val_name)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], c1.stroke_width(2))
                });
            chart
                .draw_series(self.val.iter().map(|p| Circle::new((p.0, get(p)), 4, c1.filled())))
                .map_err(de)?;
            let pos = if pick == 1 {
                SeriesLabelPosition::UpperRight
            } else {
                SeriesLabelPosition::LowerRight
            };
            series_legend(&mut chart, pos)?;
        }
        Ok(())
    }
}

/// (node state, input state) of each edge index, node by node, inputs in order.
pub fn edge_ends(edges: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut node = 0;
    while out.len() < edges {
        for input in 0..node + 2 {
            out.push((node + 2, input));
        }
        node += 1;
    }
    out.truncate(edges);
    out
}

/// softmax(α) of every op on every edge of one cell type, over epochs: a panel per edge.
struct Alphas {
    cell: &'static str,
    ops: Vec<String>,
    /// Per edge: op → (epoch, weight).
    edges: Vec<BTreeMap<String, Vec<(f64, f64)>>>,
    epochs: (f64, f64),
    /// Top of the y axis.
    top: f64,
}

const PANEL_COLS: usize = 5;

impl Alphas {
    fn new(cell: &'static str, rows: &[&AlphaRow]) -> Self {
        let n = rows.iter().map(|r| r.edge + 1).max().unwrap_or(0);
        let mut edges: Vec<BTreeMap<String, Vec<(f64, f64)>>> = vec![BTreeMap::new(); n];
        let mut ops: Vec<String> = Vec::new();
        for r in rows {
            if !ops.contains(&r.op) {
                ops.push(r.op.clone());
            }
            edges[r.edge].entry(r.op.clone()).or_default().push(((r.epoch + 1) as f64, r.weight));
        }
        let (lo, hi) = rows.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), r| {
            (lo.min((r.epoch + 1) as f64), hi.max((r.epoch + 1) as f64))
        });
        let epochs = if hi > lo { (lo, hi) } else { (lo - 0.5, lo + 0.5) };
        // One y scale for all panels, to the largest weight (softmax weights of 8 ops start
        // near 1/8 and rarely reach 1 in short searches).
        let top = rows.iter().map(|r| r.weight).fold(0.0f64, f64::max);
        let top = (top * 1.1).clamp(0.05, 1.0);
        Alphas { cell, ops, edges, epochs, top }
    }

    fn size(&self) -> (u32, u32) {
        let rows = self.edges.len().div_ceil(PANEL_COLS).max(1);
        (1200, 70 + 220 * rows as u32 + 50)
    }
}

impl Figure for Alphas {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        let root = root
            .titled(
                &format!("softmax(α) per edge over epochs, {} cell", self.cell),
                ("sans-serif", 18),
            )
            .map_err(de)?;
        let (h, _) = (root.dim_in_pixel().1, ());
        let (grid, legend) = root.split_vertically(h.saturating_sub(50));
        let rows = self.edges.len().div_ceil(PANEL_COLS).max(1);
        let panels = grid.split_evenly((rows, PANEL_COLS));
        let ends = edge_ends(self.edges.len());
        for ((edge, series), area) in self.edges.iter().enumerate().zip(panels.iter()) {
            let (node, input) = ends[edge];
            let mut chart = ChartBuilder::on(area)
                .caption(
                    format!("edge {edge}: node {} ← {}", state_name(node), state_name(input)),
                    ("sans-serif", 13),
                )
                .margin(6)
                .x_label_area_size(22)
                .y_label_area_size(34)
                .build_cartesian_2d(self.epochs.0..self.epochs.1, 0.0..self.top)
                .map_err(de)?;
            chart
                .configure_mesh()
                .x_labels(5)
                .y_labels(5)
                .label_style(("sans-serif", 11))
                .draw()
                .map_err(de)?;
            for (op, pts) in series {
                let c = op_color(op);
                chart
                    .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))
                    .map_err(de)?;
                chart
                    .draw_series(pts.iter().map(|&p| Circle::new(p, 2, c.filled())))
                    .map_err(de)?;
            }
        }
        let style = TextStyle::from(("sans-serif", 14).into_font()).color(&BLACK);
        let mut x = 20;
        for op in &self.ops {
            let c = op_color(op);
            legend
                .draw(&PathElement::new(vec![(x, 22), (x + 24, 22)], c.stroke_width(4)))
                .map_err(de)?;
            legend.draw(&Text::new(op.clone(), (x + 30, 14), style.clone())).map_err(de)?;
            x += 40 + 9 * op.len() as i32;
        }
        Ok(())
    }
}

/// Per-layer quantization error: the last recorded step's SQNR of every quantizer, and the
/// median SQNR of each kind over steps.
struct QuantErrorFigure {
    step: usize,
    /// (index, sqnr dB, kind index) at the last step.
    last: Vec<(f64, f64, usize)>,
    kinds: Vec<TensorRole>,
    /// Per kind: (step, median sqnr).
    medians: Vec<Vec<(f64, f64)>>,
}

/// SQNR from which a quantizer counts as exact.
const EXACT_DB: f64 = 150.0;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

impl QuantErrorFigure {
    fn new(rows: &[QuantErrorRow]) -> Self {
        let mut kinds: Vec<TensorRole> = Vec::new();
        for r in rows {
            if !kinds.contains(&r.error.kind) {
                kinds.push(r.error.kind);
            }
        }
        let kind_of = |k: TensorRole| kinds.iter().position(|&x| x == k).unwrap_or(0);
        let step = rows.iter().map(|r| r.step).max().unwrap_or(0);
        let last: Vec<(f64, f64, usize)> = rows
            .iter()
            .filter(|r| r.step == step && r.error.sqnr_db.is_finite())
            .enumerate()
            .map(|(i, r)| (i as f64, r.error.sqnr_db, kind_of(r.error.kind)))
            .collect();
        let mut by: BTreeMap<(usize, usize), Vec<f64>> = BTreeMap::new();
        for r in rows.iter().filter(|r| r.error.sqnr_db.is_finite() && r.error.sqnr_db < EXACT_DB) {
            by.entry((kind_of(r.error.kind), r.step)).or_default().push(r.error.sqnr_db);
        }
        let mut medians = vec![Vec::new(); kinds.len()];
        for ((k, s), mut v) in by {
            medians[k].push((s as f64, median(&mut v)));
        }
        QuantErrorFigure { step, last, kinds, medians }
    }
}

impl Figure for QuantErrorFigure {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        let root = root.titled("quantization error (SQNR, dB)", ("sans-serif", 18)).map_err(de)?;
        let (top, bottom) = root.split_vertically(360);
        let xs = padded_range(self.last.iter().map(|p| p.0));
        // Exact quantizers (an all-zero input: SQNR capped at 200 dB) would flatten the rest;
        // they are drawn as triangles on the top edge.
        let ys = padded_range(self.last.iter().map(|p| p.1).filter(|&v| v < EXACT_DB));
        let exact = self.last.iter().filter(|p| p.1 >= EXACT_DB).count();
        let caption = if exact > 0 {
            format!(
                "every quantizer at step {} (in record order; ▲ on top: {exact} exact, ≥ {EXACT_DB} dB)",
                self.step
            )
        } else {
            format!("every quantizer at step {} (in record order)", self.step)
        };
        let mut chart = new_chart(&top, Some(&caption), (xs, ys), ("quantizer", "SQNR dB"))?;
        for (k, kind) in self.kinds.iter().enumerate() {
            let c = series_color(k);
            chart
                .draw_series(
                    self.last
                        .iter()
                        .filter(|p| p.2 == k && p.1 < EXACT_DB)
                        .map(|p| Circle::new((p.0, p.1), 3, c.filled())),
                )
                .map_err(de)?;
            chart
                .draw_series(
                    self.last
                        .iter()
                        .filter(|p| p.2 == k && p.1 >= EXACT_DB)
                        .map(|p| TriangleMarker::new((p.0, ys.1), 5, c.filled())),
                )
                .map_err(de)?
                .label(kind.name())
                .legend(move |(x, y)| Circle::new((x + 8, y), 4, c.filled()));
        }
        series_legend(&mut chart, SeriesLabelPosition::UpperRight)?;
        let all = || self.medians.iter().flatten();
        let sx = padded_range(all().map(|p| p.0));
        let sy = padded_range(all().map(|p| p.1));
        let mut chart = new_chart(
            &bottom,
            Some("median SQNR per kind over steps (exact quantizers left out)"),
            (sx, sy),
            ("step", "median SQNR dB"),
        )?;
        for (k, kind) in self.kinds.iter().enumerate() {
            let c = series_color(k);
            chart
                .draw_series(LineSeries::new(self.medians[k].iter().copied(), c.stroke_width(2)))
                .map_err(de)?
                .label(kind.name())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2))
                });
        }
        series_legend(&mut chart, SeriesLabelPosition::UpperRight)?;
        Ok(())
    }
}
