//! The comparison written out as CSV tables: one row per run, one per method against the
//! baseline.

use qdarts_genotypes::Genotype;

use super::{Comparison, Noise};
use crate::SweepError;
use crate::stats::Stats;

/// The methods-against-baseline figures as CSV: one row per method.
pub fn stats_csv(c: &Comparison) -> Result<Option<String>, SweepError> {
    let Some(a) = c.analysis() else { return Ok(None) };
    let mut w = csv_writer();
    let head = [
        "method",
        "genotypes",
        "runs",
        "mean",
        "baseline_genotypes",
        "baseline_mean",
        "scores",
        "diff",
        "ci_level",
        "ci_low",
        "ci_high",
        "welch_t",
        "welch_df",
        "welch_p",
        "welch_p_holm",
        "mann_whitney_u",
        "p_method_greater",
        "mann_whitney_p",
        "mann_whitney_p_holm",
        "permutation_p",
        "permutation_p_holm",
        "permutation_exact",
        "permutation_splits",
        "pairs",
        "paired_mean",
        "paired_ci_low",
        "paired_ci_high",
        "paired_t",
        "paired_t_p",
        "paired_t_p_holm",
        "wilcoxon_w",
        "wilcoxon_p",
        "wilcoxon_p_holm",
        "sign_flip_p",
        "sign_flip_p_holm",
        "equivalence_margin",
        "equivalence_p",
    ];
    w.write_record(head).map_err(|e| SweepError::Other(e.to_string()))?;
    let scores =
        if matches!(a.noise, Some(Noise::TwoWay(_))) { "seed_adjusted" } else { "seed_mean" };
    let f = |v: Option<f64>| v.map_or_else(String::new, |v| format!("{v:.6}"));
    let base = Stats::of(&a.baseline);
    for m in &a.methods {
        let mean = Stats::of(&m.scores).map(|s| s.mean);
        let row = vec![
            m.label.clone(),
            m.scores.len().to_string(),
            m.runs.to_string(),
            f(mean),
            a.baseline.len().to_string(),
            f(base.map(|s| s.mean)),
            scores.to_string(),
            f(m.bootstrap.map(|b| b.diff)),
            f(m.bootstrap.map(|b| b.level)),
            f(m.bootstrap.map(|b| b.low)),
            f(m.bootstrap.map(|b| b.high)),
            f(m.welch.map(|w| w.t)),
            f(m.welch.map(|w| w.df)),
            f(m.welch.map(|w| w.p)),
            f(m.holm[0]),
            f(m.mann_whitney.map(|u| u.u)),
            f(m.mann_whitney.map(|u| u.p_greater)),
            f(m.mann_whitney.map(|u| u.p)),
            f(m.holm[1]),
            f(m.permutation.map(|p| p.p)),
            f(m.holm[2]),
            m.permutation.map_or_else(String::new, |p| p.exact.to_string()),
            m.permutation.map_or_else(String::new, |p| p.resamples.to_string()),
        ];
        let p = m.paired.as_ref();
        let mut row = row;
        row.extend([
            p.map_or_else(String::new, |p| p.pairs.len().to_string()),
            f(p.and_then(|p| p.bootstrap).map(|b| b.diff)),
            f(p.and_then(|p| p.bootstrap).map(|b| b.low)),
            f(p.and_then(|p| p.bootstrap).map(|b| b.high)),
            f(p.and_then(|p| p.t).map(|t| t.t)),
            f(p.and_then(|p| p.t).map(|t| t.p)),
            f(p.and_then(|p| p.holm[0])),
            f(p.and_then(|p| p.wilcoxon).map(|w| w.statistic)),
            f(p.and_then(|p| p.wilcoxon).map(|w| w.p)),
            f(p.and_then(|p| p.holm[1])),
            f(p.and_then(|p| p.sign_flip).map(|s| s.p)),
            f(p.and_then(|p| p.holm[2])),
            f(p.and_then(|p| p.equivalence).map(|e| e.0)),
            f(p.and_then(|p| p.equivalence).map(|e| e.1)),
        ]);
        w.write_record(&row).map_err(|e| SweepError::Other(e.to_string()))?;
    }
    let bytes = w.into_inner().map_err(|e| SweepError::Other(e.to_string()))?;
    String::from_utf8(bytes).map(Some).map_err(|e| SweepError::Other(e.to_string()))
}

/// The comparison as CSV: one row per run.
pub fn csv(c: &Comparison) -> Result<String, SweepError> {
    let mut w = csv_writer();
    let mut head: Vec<String> =
        ["run", "dir", "group", "baseline", "kind"].iter().map(|s| s.to_string()).collect();
    head.extend(c.varying.iter().cloned());
    head.extend(
        [
            "finished",
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
            r.finished().to_string(),
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
