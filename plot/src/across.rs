//! Figures over many runs (`qdarts compare --plot`): the final top-1 of each group (every run
//! as a point, mean ± std as a bar), and every run's validation top-1 over epochs coloured by
//! group.

use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::prelude::*;
use qdarts_record::{MetricsRow, Phase, RunLayout, read_table};
use qdarts_sweep::compare::Comparison;

use crate::{Figure, PlotError, de, io_err, new_chart, padded_range, save, series_color};

/// Writes `compare-top1` and `compare-curves` (SVG and PNG) into `out`.
pub fn plot_comparison(c: &Comparison, out: &Path) -> Result<Vec<PathBuf>, PlotError> {
    std::fs::create_dir_all(out).map_err(io_err(out))?;
    let mut files = Vec::new();
    let top = GroupTop1::new(c);
    if top.points.is_empty() {
        return Err(PlotError::Empty("no run has finished an epoch yet: nothing to plot".into()));
    }
    let h = 420 + 20 * c.groups.len() as u32;
    files.extend(save(&top, &out.join("compare-top1"), (900, h))?);
    let curves = RunCurves::new(c)?;
    files.extend(save(&curves, &out.join("compare-curves"), (900, h))?);
    Ok(files)
}

struct GroupTop1 {
    labels: Vec<String>,
    /// (group, top-1 %).
    points: Vec<(usize, f64)>,
    /// (group, mean %, std %).
    bars: Vec<(usize, f64, f64)>,
}

impl GroupTop1 {
    fn new(c: &Comparison) -> Self {
        let mut points = Vec::new();
        let mut bars = Vec::new();
        for (g, group) in c.groups.iter().enumerate() {
            for &i in &group.members {
                if let Some(t) = c.runs[i].top1 {
                    points.push((g, 100.0 * t));
                }
            }
            if let Some(s) = group.top1 {
                bars.push((g, 100.0 * s.mean, 100.0 * s.std));
            }
        }
        GroupTop1 { labels: group_labels(c), points, bars }
    }
}

/// `G1: <label>`, … for the legend.
fn group_labels(c: &Comparison) -> Vec<String> {
    c.groups.iter().enumerate().map(|(g, x)| format!("G{}: {}", g + 1, x.label)).collect()
}

/// A figure area.
type Area<DB> = DrawingArea<DB, Shift>;

/// The figure titled, split into the plot and a legend strip of one line per label.
fn with_legend<DB: DrawingBackend>(
    root: &Area<DB>,
    title: &str,
    labels: usize,
) -> Result<(Area<DB>, Area<DB>), String> {
    let root = root.titled(title, ("sans-serif", 17)).map_err(de)?;
    let (_, h) = root.dim_in_pixel();
    Ok(root.split_vertically(h.saturating_sub(20 * labels as u32 + 10)))
}

fn legend_lines<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    labels: &[String],
) -> Result<(), String> {
    for (g, l) in labels.iter().enumerate() {
        let y = 6 + 20 * g as i32;
        let c = series_color(g);
        area.draw(&Rectangle::new([(16, y + 2), (30, y + 14)], c.filled())).map_err(de)?;
        let style = TextStyle::from(("sans-serif", 13).into_font()).color(&BLACK);
        area.draw(&Text::new(l.clone(), (38, y), style)).map_err(de)?;
    }
    Ok(())
}

impl Figure for GroupTop1 {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        let (plot, legend) = with_legend(
            root,
            "final top-1 by group (points: runs; bar: mean ± std)",
            self.labels.len(),
        )?;
        let n = self.labels.len();
        let ys = padded_range(
            self.points
                .iter()
                .map(|p| p.1)
                .chain(self.bars.iter().flat_map(|b| [b.1 - b.2, b.1 + b.2])),
        );
        let mut chart = ChartBuilder::on(&plot)
            .margin(12)
            .x_label_area_size(30)
            .y_label_area_size(52)
            .build_cartesian_2d(-0.5..(n as f64 - 0.5), ys.0..ys.1)
            .map_err(de)?;
        chart
            .configure_mesh()
            .x_labels(n.max(1))
            .x_label_formatter(&|x| {
                let g = x.round();
                if (x - g).abs() < 1e-6 && g >= 0.0 {
                    format!("G{}", g as usize + 1)
                } else {
                    String::new()
                }
            })
            .y_desc("top-1 %")
            .label_style(("sans-serif", 12))
            .draw()
            .map_err(de)?;
        for &(g, mean, std) in &self.bars {
            let c = series_color(g);
            let x = g as f64;
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(x - 0.25, mean - std), (x + 0.25, mean + std)],
                    c.mix(0.25).filled(),
                )))
                .map_err(de)?;
            chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(x - 0.3, mean), (x + 0.3, mean)],
                    c.stroke_width(3),
                )))
                .map_err(de)?;
        }
        chart
            .draw_series(
                self.points
                    .iter()
                    .map(|&(g, t)| Circle::new((g as f64, t), 5, series_color(g).filled())),
            )
            .map_err(de)?;
        legend_lines(&legend, &self.labels)
    }
}

struct RunCurves {
    labels: Vec<String>,
    /// (group, points (epoch, top-1 %)).
    runs: Vec<(usize, Vec<(f64, f64)>)>,
}

impl RunCurves {
    fn new(c: &Comparison) -> Result<Self, PlotError> {
        let mut runs = Vec::new();
        for (i, r) in c.runs.iter().enumerate() {
            let path = RunLayout::new(&r.dir).table::<MetricsRow>();
            if !path.exists() {
                continue;
            }
            let rows: Vec<MetricsRow> =
                read_table(&path).map_err(|e| PlotError::Record(e.to_string()))?;
            let pts: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.phase == Phase::Val)
                .map(|r| ((r.epoch + 1) as f64, 100.0 * r.top1))
                .collect();
            if !pts.is_empty() {
                runs.push((c.group_of(i), pts));
            }
        }
        Ok(RunCurves { labels: group_labels(c), runs })
    }
}

impl Figure for RunCurves {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        let (plot, legend) =
            with_legend(root, "validation top-1 over epochs, one line per run", self.labels.len())?;
        let all = || self.runs.iter().flat_map(|r| r.1.iter());
        let xs = padded_range(all().map(|p| p.0));
        let ys = padded_range(all().map(|p| p.1));
        let mut chart = new_chart(&plot, None, (xs, ys), ("epoch", "top-1 %"))?;
        for (g, pts) in &self.runs {
            let c = series_color(*g);
            chart
                .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))
                .map_err(de)?;
            chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, c.filled()))).map_err(de)?;
        }
        legend_lines(&legend, &self.labels)
    }
}
