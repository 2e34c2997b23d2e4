//! The comparison written out: the text report (runs, groups, genotype stability, searched
//! against random) and the CSV table.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use qdarts_genotypes::Genotype;

use super::{Comparison, RunSummary, Stability, cell_short};
use crate::SweepError;
use crate::stats::{Anova, Stats, Welch};

fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{:.2}", 100.0 * v))
}

/// The report: a table of runs, the groups with mean ± std, genotype stability, and the
/// searched-versus-baseline summary when there is a baseline.
pub fn report(c: &Comparison) -> String {
    let mut out = String::new();
    let headers = [
        "run",
        "group",
        "kind",
        "seed",
        "epochs",
        "steps",
        "top-1 %",
        "int top-1 %",
        "agree %",
        "GBitOPs",
        "param B",
        "wall s",
        "normal cell",
        "reduce cell",
    ];
    // Folder names, or whole paths where two runs share a name (trials of two sweeps).
    let names: Vec<String> = c.runs.iter().map(RunSummary::name).collect();
    let unique = names.iter().collect::<BTreeSet<_>>().len() == names.len();
    let rows: Vec<Vec<String>> = c
        .runs
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let e = r.eval;
            vec![
                if unique { names[i].clone() } else { r.dir.display().to_string() },
                format!("G{}", c.group_of(i) + 1),
                r.kind.to_string(),
                r.seed().unwrap_or("-").to_string(),
                format!(
                    "{}/{}",
                    r.epochs_done,
                    r.epochs_planned.map_or_else(|| "?".into(), |p| p.to_string())
                ),
                r.steps.to_string(),
                pct(r.top1),
                pct(e.map(|e| e.integer_top1)),
                pct(e.map(|e| e.agreement)),
                e.map_or_else(|| "-".into(), |e| format!("{:.4}", e.bitops as f64 / 1e9)),
                e.map_or_else(|| "-".into(), |e| e.param_bytes.to_string()),
                format!("{:.1}", r.seconds),
                r.genotype.as_ref().map_or_else(|| "-".into(), |g| cell_short(&g.normal)),
                r.genotype.as_ref().map_or_else(|| "-".into(), |g| cell_short(&g.reduce)),
            ]
        })
        .collect();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &[String]| -> String {
        let mut s = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            let pad = w - cell.chars().count();
            // Text columns left, numbers right.
            if matches!(i, 0..=2 | 12 | 13) {
                s.push_str(cell);
                s.push_str(&" ".repeat(pad));
            } else {
                s.push_str(&" ".repeat(pad));
                s.push_str(cell);
            }
            s.push_str("  ");
        }
        s.trim_end().to_string()
    };
    let head: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
    let _ = writeln!(out, "{}", line(&head));
    for row in &rows {
        let _ = writeln!(out, "{}", line(row));
    }
    let _ = writeln!(
        out,
        "\nops: max3/avg3 pooling, skip, sep3/sep5 separable, dil3/dil5 dilated conv; op(input state)"
    );
    if c.varying.is_empty() {
        let _ = writeln!(out, "configs: identical");
    } else {
        let _ = writeln!(out, "configs differ in: {}", c.varying.join(", "));
    }
    let _ = writeln!(out, "\ngroups (runs that differ only in their seed):");
    for (gi, g) in c.groups.iter().enumerate() {
        let stats = g.top1.map_or_else(|| "no finished epoch".into(), |s| s.percent());
        let _ = writeln!(out, "  G{}  {}: top-1 {stats}", gi + 1, g.label);
    }
    for (gi, g) in c.groups.iter().enumerate() {
        let genos: Vec<&Genotype> = g
            .members
            .iter()
            .filter(|&&i| c.runs[i].kind == "search")
            .filter_map(|&i| c.runs[i].genotype.as_ref())
            .collect();
        if genos.len() >= 2 {
            let _ = writeln!(out, "\ngenotype stability, G{}:", gi + 1);
            for l in Stability::of(genos).lines() {
                let _ = writeln!(out, "{l}");
            }
        }
    }
    if let Some(b) = baseline_summary(c) {
        let _ = writeln!(out, "\n{b}");
    }
    out
}

/// Searched genotypes against the random baseline: each side's mean ± std over runs, the
/// difference, and how many baseline genotypes (their seed means) the searched mean beats.
/// With seeds repeated, also the noise: the pooled seed std within a genotype and a one-way
/// ANOVA over the genotypes (does the training tell them apart at all?), and Welch's t-test
/// of the searched genotypes' seed means against the random ones' (is the difference more
/// than a lucky draw of genotypes?).
pub fn baseline_summary(c: &Comparison) -> Option<String> {
    let top = |base: bool| -> Vec<f64> {
        c.runs.iter().filter(|r| r.baseline == base).filter_map(|r| r.top1).collect()
    };
    let (searched, random) = (Stats::of(&top(false))?, Stats::of(&top(true))?);
    // Each group of runs that differ only in their seed is one genotype: its runs' top-1 and
    // their mean.
    let genotypes = |base: bool| -> Vec<(Vec<f64>, f64)> {
        c.groups
            .iter()
            .filter(|g| g.members.iter().all(|&i| c.runs[i].baseline == base))
            .filter_map(|g| {
                let top1 = g.members.iter().filter_map(|&i| c.runs[i].top1).collect();
                g.top1.map(|s| (top1, s.mean))
            })
            .collect()
    };
    let (searched_g, random_g) = (genotypes(false), genotypes(true));
    let means = |g: &[(Vec<f64>, f64)]| -> Vec<f64> { g.iter().map(|v| v.1).collect() };
    let baseline_means = means(&random_g);
    let beaten = baseline_means.iter().filter(|&&m| searched.mean > m).count();
    let mut out = format!(
        "searched vs random baseline (final top-1 over runs):\n  searched {}\n  random   {}\n  \
         difference {:+.2} points; the searched mean beats {beaten} of {} random genotypes' seed means",
        searched.percent(),
        random.percent(),
        100.0 * (searched.mean - random.mean),
        baseline_means.len()
    );
    let all: Vec<Vec<f64>> = searched_g.iter().chain(&random_g).map(|g| g.0.clone()).collect();
    if let Some(a) = Anova::of(&all) {
        let _ = write!(
            out,
            "\n  seed noise: pooled std within a genotype {:.2} points; genotypes differ beyond \
             it: F({}, {}) = {:.2}, p = {:.3} (one-way ANOVA over {} genotypes)",
            100.0 * a.within_std,
            a.df_between,
            a.df_within,
            a.f,
            a.p,
            all.len()
        );
    }
    if let Some(w) = Welch::of(&means(&searched_g), &baseline_means) {
        let _ = write!(
            out,
            "\n  over genotypes (seed means, {} searched, {} random): {:+.2} ± {:.2} points, \
             Welch t({:.1}) = {:.2}, p = {:.3}",
            searched_g.len(),
            random_g.len(),
            100.0 * w.diff,
            100.0 * w.se,
            w.df,
            w.t,
            w.p
        );
    }
    Some(out)
}

/// The comparison as CSV: one row per run.
pub fn csv(c: &Comparison) -> Result<String, SweepError> {
    let mut w = csv_writer();
    let mut head: Vec<String> =
        ["run", "dir", "group", "baseline", "kind"].iter().map(|s| s.to_string()).collect();
    head.extend(c.varying.iter().cloned());
    head.extend(
        [
            "epochs_done",
            "epochs_planned",
            "steps",
            "top1",
            "integer_top1",
            "agreement",
            "bitops",
            "param_bytes",
            "seconds",
            "genotype",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    w.write_record(&head).map_err(|e| SweepError::Other(e.to_string()))?;
    for (i, r) in c.runs.iter().enumerate() {
        let opt = |v: Option<String>| v.unwrap_or_default();
        let mut row = vec![
            r.name(),
            r.dir.display().to_string(),
            format!("G{}", c.group_of(i) + 1),
            r.baseline.to_string(),
            r.kind.to_string(),
        ];
        row.extend(c.varying.iter().map(|k| r.config.get(k).cloned().unwrap_or_default()));
        row.extend([
            r.epochs_done.to_string(),
            opt(r.epochs_planned.map(|p| p.to_string())),
            r.steps.to_string(),
            opt(r.top1.map(|v| format!("{v:.6}"))),
            opt(r.eval.map(|e| format!("{:.6}", e.integer_top1))),
            opt(r.eval.map(|e| format!("{:.6}", e.agreement))),
            opt(r.eval.map(|e| e.bitops.to_string())),
            opt(r.eval.map(|e| e.param_bytes.to_string())),
            format!("{:.3}", r.seconds),
            opt(r.genotype.as_ref().map(Genotype::to_darts_text)),
        ]);
        w.write_record(&row).map_err(|e| SweepError::Other(e.to_string()))?;
    }
    let bytes = w.into_inner().map_err(|e| SweepError::Other(e.to_string()))?;
    String::from_utf8(bytes).map_err(|e| SweepError::Other(e.to_string()))
}

fn csv_writer() -> csv::Writer<Vec<u8>> {
    csv::WriterBuilder::new().from_writer(Vec::new())
}
