//! The comparison written out as text: the runs, the unfinished ones, groups, genotype
//! stability, methods against the random baseline (the CSV tables: `tables.rs`).

use std::collections::BTreeSet;
use std::fmt::Write as _;

use qdarts_genotypes::Genotype;

use super::{
    Comparison, MethodResult, Noise, PairedResult, RunSummary, Score, Stability, cell_short,
};
use crate::stats::Stats;

fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{:.2}", 100.0 * v))
}

/// The report: a table of runs, the groups with mean ± std, genotype stability, and the
/// searched-versus-baseline summary when there is a baseline.
pub fn report(c: &Comparison) -> String {
    let mut out = runs_table(c);
    notes(&mut out, c);
    groups(&mut out, c);
    if let Some(b) = baseline_summary(c) {
        let _ = writeln!(out, "\n{b}");
    }
    out
}

/// One line per run: where it got to, its scores and its cells.
fn runs_table(c: &Comparison) -> String {
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
    out
}

/// The legend, how the configs differ, and the runs left out of the statistics.
fn notes(out: &mut String, c: &Comparison) {
    let _ = writeln!(
        out,
        "\nops: max3/avg3 pooling, skip, sep3/sep5 separable, dil3/dil5 dilated conv; op(input state)"
    );
    if c.varying.is_empty() {
        let _ = writeln!(out, "configs: identical");
    } else {
        let _ = writeln!(out, "configs differ in: {}", c.varying.join(", "));
    }
    let unfinished = c.unfinished();
    if !unfinished.is_empty() {
        let _ = writeln!(out, "\nunfinished, left out of every statistic:");
        for i in unfinished {
            let _ = writeln!(out, "  {}: {}", c.runs[i].name(), c.runs[i].state());
        }
    }
    let unscored = c.unscored();
    if !unscored.is_empty() && c.options.score == Score::Integer {
        let _ = writeln!(out, "\nfinished but not evaluated (no eval.json), left out:");
        for i in unscored {
            let _ = writeln!(out, "  {}", c.runs[i].name());
        }
    }
}

/// The groups' mean ± std, and each group's genotype stability.
fn groups(out: &mut String, c: &Comparison) {
    let _ = writeln!(out, "\ngroups (runs that differ only in their seed; finished runs):");
    for (gi, g) in c.groups.iter().enumerate() {
        let stats = g.top1.map_or_else(|| "no finished run".into(), |s| s.percent());
        let _ = writeln!(out, "  G{}  {}: top-1 {stats}", gi + 1, g.label);
    }
    for (gi, g) in c.groups.iter().enumerate() {
        let genos: Vec<&Genotype> = g
            .members
            .iter()
            .filter(|&&i| c.runs[i].kind == "search" && c.runs[i].finished())
            .filter_map(|&i| c.runs[i].genotype.as_ref())
            .collect();
        if genos.len() >= 2 {
            let _ = writeln!(out, "\ngenotype stability, G{}:", gi + 1);
            for l in Stability::of(genos).lines() {
                let _ = writeln!(out, "{l}");
            }
        }
    }
}

fn genotypes(n: usize) -> String {
    if n == 1 { "1 genotype".into() } else { format!("{n} genotypes") }
}

fn p_text(p: Option<f64>) -> String {
    match p {
        Some(p) if p < 0.001 => "<0.001".into(),
        Some(p) => format!("{p:.3}"),
        None => "-".into(),
    }
}

/// Methods against the random baseline, genotype by genotype: only finished training runs
/// count; a genotype's score is the mean of its seeds, or its mean adjusted for the seeds when
/// seeds are shared across genotypes (two-way ANOVA). Per method: its genotypes' mean, the
/// difference from the baseline's with a 95 % percentile bootstrap interval, Welch's t-test,
/// the exact Mann–Whitney test with P(method > baseline), a permutation test of the
/// difference, and each p-value Holm-adjusted across the methods.
pub fn baseline_summary(c: &Comparison) -> Option<String> {
    let a = c.analysis()?;
    let mut out = String::new();
    let adjusted = matches!(a.noise, Some(Noise::TwoWay(_)));
    let counted: usize = a.units.iter().map(|u| u.runs.len()).sum();
    let figure = match c.options.score {
        Score::FakeQuant => "top-1",
        Score::Integer => "integer model top-1",
    };
    let _ = writeln!(
        out,
        "methods against the baseline ({counted} finished training runs; the unit is the \
         genotype, scored by {}):",
        if adjusted {
            format!("its {figure} adjusted for the training seed")
        } else {
            format!("its seeds' mean {figure}")
        }
    );
    if let Some(note) = &a.method_note {
        let _ = writeln!(out, "  note: {note}");
    }
    let base = Stats::of(&a.baseline)?;
    let _ = writeln!(
        out,
        "  baseline  {}, {} runs, mean {:.2} %, sd {:.2} points",
        genotypes(base.n),
        a.units.iter().filter(|u| u.method.is_none()).map(|u| u.runs.len()).sum::<usize>(),
        100.0 * base.mean,
        100.0 * base.std
    );
    for m in &a.methods {
        method_lines(&mut out, m);
    }
    noise_line(&mut out, a.noise.as_ref(), a.units.len());
    Some(out)
}

/// One method against the baseline: its scores, the difference with its interval and the
/// tests.
fn method_lines(out: &mut String, m: &MethodResult) {
    let Some(s) = Stats::of(&m.scores) else { return };
    let _ = writeln!(
        out,
        "  {}  {}, {} runs, mean {:.2} %, sd {:.2} points",
        m.label,
        genotypes(s.n),
        m.runs,
        100.0 * s.mean,
        100.0 * s.std
    );
    if let Some(b) = m.bootstrap {
        let _ = writeln!(
            out,
            "    difference {:+.2} points, {:.0} % CI [{:+.2}, {:+.2}] (percentile bootstrap, \
             {} resamples)",
            100.0 * b.diff,
            100.0 * b.level,
            100.0 * b.low,
            100.0 * b.high,
            b.resamples
        );
    }
    let [hw, hm, hp] = m.holm;
    match m.welch {
        Some(w) => {
            let _ = writeln!(
                out,
                "    Welch t({:.1}) = {:.2}, p = {}, Holm p = {}",
                w.df,
                w.t,
                p_text(Some(w.p)),
                p_text(hw)
            );
        }
        None => {
            let _ = writeln!(out, "    Welch: needs two genotypes a side with some spread");
        }
    }
    if let Some(u) = m.mann_whitney {
        let _ = writeln!(
            out,
            "    Mann–Whitney U = {:.1} (exact), p = {}, Holm p = {}; P(method > baseline) = {:.2}",
            u.u,
            p_text(Some(u.p)),
            p_text(hm),
            u.p_greater
        );
    }
    if let Some(p) = m.permutation {
        let how = if p.exact {
            format!("all {} splits", p.resamples)
        } else {
            format!("{} random splits", p.resamples)
        };
        let _ = writeln!(
            out,
            "    permutation test of the difference ({how}): p = {}, Holm p = {}",
            p_text(Some(p.p)),
            p_text(hp)
        );
    }
    if let Some(p) = &m.paired {
        paired_lines(out, p);
    }
}

/// How much of the spread is seed noise.
fn noise_line(out: &mut String, noise: Option<&Noise>, genotypes: usize) {
    match noise {
        Some(Noise::TwoWay(t)) => {
            let _ = write!(
                out,
                "  seed noise: residual std {:.2} points once genotype and seed are fitted; \
                 genotypes differ beyond it: F({}, {}) = {:.2}, p = {}; seeds: F({}, {}) = {:.2}, \
                 p = {} (two-way ANOVA, seed a crossed block, {} genotypes)",
                100.0 * t.residual_std,
                t.df_genotype,
                t.df_residual,
                t.genotype_f,
                p_text(Some(t.genotype_p)),
                t.df_seed,
                t.df_residual,
                t.seed_f,
                p_text(Some(t.seed_p)),
                genotypes
            );
        }
        Some(Noise::OneWay(o)) => {
            let _ = write!(
                out,
                "  seed noise: pooled std within a genotype {:.2} points; genotypes differ beyond \
                 it: F({}, {}) = {:.2}, p = {} (one-way ANOVA over {} genotypes)",
                100.0 * o.within_std,
                o.df_between,
                o.df_within,
                o.f,
                p_text(Some(o.p)),
                genotypes
            );
        }
        None => {
            let _ = write!(out, "  seed noise: no genotype has two finished runs");
        }
    }
}

/// A method's paired differences (by search seed) in the report.
fn paired_lines(out: &mut String, p: &PairedResult) {
    let _ = writeln!(
        out,
        "    paired by search seed: {} pairs ({} of the method's genotypes unpaired)",
        p.pairs.len(),
        p.unpaired
    );
    if let Some(b) = p.bootstrap {
        let _ = writeln!(
            out,
            "      mean difference {:+.2} points, 95 % CI [{:+.2}, {:+.2}] (pairs resampled)",
            100.0 * b.diff,
            100.0 * b.low,
            100.0 * b.high
        );
    }
    let [ht, hw, hs] = p.holm;
    if let Some(t) = p.t {
        let _ = writeln!(
            out,
            "      paired t({:.0}) = {:.2}, p = {}, Holm p = {}",
            t.df,
            t.t,
            p_text(Some(t.p)),
            p_text(ht)
        );
    }
    if let Some(w) = p.wilcoxon {
        let _ = writeln!(
            out,
            "      Wilcoxon signed-rank W = {:.1} over {} non-zero differences (exact), p = {}, \
             Holm p = {}",
            w.statistic,
            w.n,
            p_text(Some(w.p)),
            p_text(hw)
        );
    }
    if let Some(f) = p.sign_flip {
        let how = if f.exact { "all" } else { "random" };
        let _ = writeln!(
            out,
            "      sign-flip permutation test ({how} {} flips): p = {}, Holm p = {}",
            f.resamples,
            p_text(Some(f.p)),
            p_text(hs)
        );
    }
    if let Some((margin, q)) = p.equivalence {
        let verdict = if q < 0.05 { "equivalent at 0.05" } else { "not shown equivalent" };
        let _ = writeln!(
            out,
            "      equivalence within ±{:.2} points (two one-sided t-tests): p = {} ({verdict})",
            100.0 * margin,
            p_text(Some(q))
        );
    }
}
