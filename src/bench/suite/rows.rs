//! The suite's CSV: one serde row per line of its table.

use super::Line;
use crate::backend::Backend;

/// The table's lines as CSV rows of `backend`.
pub(super) fn csv_lines(backend: Backend, lines: &[Line]) -> Vec<CsvRow<'_>> {
    let backend = backend.label();
    lines
        .iter()
        .map(|l| CsvRow {
            backend: backend.clone(),
            section: l.section,
            case: &l.case,
            variant: &l.variant,
            warmup: l.runs.0,
            reps: l.runs.1,
            median_s: l.time.map(|t| t.0),
            min_s: l.time.map(|t| t.1),
            max_s: l.time.map(|t| t.2),
            elems_per_s: l.rate.map(|r| r.0),
            gb_per_s: l.rate.map(|r| r.1),
            ratio: l.ratio.map(|r| r.0),
            ratio_of: l.ratio.map_or("", |r| r.1),
            peak_bytes: l.peak_bytes,
            note: &l.note,
        })
        .collect()
}

/// One row of the suite's CSV.
#[derive(serde::Serialize)]
pub(super) struct CsvRow<'a> {
    backend: String,
    section: &'static str,
    case: &'a str,
    variant: &'a str,
    warmup: usize,
    reps: usize,
    median_s: Option<f64>,
    min_s: Option<f64>,
    max_s: Option<f64>,
    elems_per_s: Option<f64>,
    gb_per_s: Option<f64>,
    ratio: Option<f64>,
    ratio_of: &'static str,
    peak_bytes: Option<u64>,
    note: &'a str,
}
