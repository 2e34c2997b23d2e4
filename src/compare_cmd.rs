//! `qdarts compare` (many run records in one table) and `qdarts sample` (random genotypes of
//! a search space, the baseline a search must beat).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use qdarts_data::Rng;
use qdarts_engine::config::Experiment;
use qdarts_genotypes::random_genotype;
use qdarts_plot::across::plot_comparison;
use qdarts_plot::cell::Renderer;
use qdarts_plot::run::plot_run;
use qdarts_record::write_atomic;
use qdarts_search::config::ExperimentConfig;
use qdarts_sweep::compare::{Comparison, Options, Score, csv, expand, read_run, report, stats_csv};

/// How `qdarts plot` lays out cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CellRenderer {
    /// graphviz `dot` when it is installed, else the built-in layout.
    Auto,
    /// graphviz `dot` (an error when it is missing).
    Dot,
    /// The built-in layout.
    Builtin,
}

/// Runs `qdarts plot`.
pub fn plot(run: &Path, out: Option<&Path>, cells: CellRenderer) -> Result<()> {
    let out = out.map_or_else(|| run.join("plots"), Path::to_path_buf);
    let renderer = match cells {
        CellRenderer::Auto => Renderer::Auto,
        CellRenderer::Dot => Renderer::Dot,
        CellRenderer::Builtin => Renderer::Builtin,
    };
    for f in plot_run(run, &out, renderer)? {
        println!("{}", f.display());
    }
    Ok(())
}

/// The figure `qdarts compare` scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ScoreArg {
    /// The last evaluation's top-1 of the fake-quant network.
    FakeQuant,
    /// `qdarts eval`'s integer model top-1 (runs without eval.json are left out).
    Integer,
}

impl From<ScoreArg> for Score {
    fn from(s: ScoreArg) -> Score {
        match s {
            ScoreArg::FakeQuant => Score::FakeQuant,
            ScoreArg::Integer => Score::Integer,
        }
    }
}

/// `--equivalence-margin`: points of top-1, above 0 and at most 100.
pub fn parse_margin(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 100.0 => Ok(v),
        _ => Err(format!("{text:?} is not a margin in points of top-1 (above 0, at most 100)")),
    }
}

/// Where `qdarts compare` writes besides the terminal.
#[derive(Debug, Clone, Copy)]
pub struct Outputs<'a> {
    /// The runs' CSV (and the methods' beside it).
    pub csv: Option<&'a Path>,
    /// The across-run figures' folder.
    pub plot: Option<&'a Path>,
}

/// The methods' CSV beside the runs' one: `cmp.csv` → `cmp-methods.csv`.
fn methods_csv_path(csv: &Path) -> PathBuf {
    let stem = csv.file_stem().map_or_else(|| "compare".into(), |s| s.to_string_lossy());
    csv.with_file_name(format!("{stem}-methods.csv"))
}

/// Runs `qdarts compare`. Training runs whose configs differ in more than the genotype and the
/// seed are refused unless `allow_differing_keys`.
pub fn compare(
    paths: &[PathBuf],
    baseline: &[PathBuf],
    allow_differing_keys: bool,
    options: Options,
    out: Outputs<'_>,
) -> Result<()> {
    let mut runs = Vec::new();
    for (list, is_baseline) in [(paths, false), (baseline, true)] {
        for p in list {
            for dir in expand(p)? {
                let mut r = read_run(&dir)?;
                r.baseline = is_baseline;
                runs.push(r);
            }
        }
    }
    if runs.is_empty() {
        bail!("no run to compare (the sweeps given have no started trial yet)");
    }
    let c = Comparison::with_options(runs, options);
    let mismatch = c.training_mismatch();
    if !mismatch.is_empty() {
        let keys: Vec<String> =
            mismatch.iter().map(|(k, v)| format!("{k} ({})", v.join(" / "))).collect();
        let what = "the finished training runs differ in training keys other than the genotype \
                    and the seed";
        if !allow_differing_keys {
            bail!(
                "{what}: {}. Their scores would not compare genotypes alone: retrain one side \
                 with the other's config, leave the odd runs out, or pass \
                 --allow-differing-keys to compare them all the same",
                keys.join(", ")
            );
        }
        eprintln!("warning: {what} (allowed by --allow-differing-keys): {}", keys.join(", "));
    }
    print!("{}", report(&c));
    if let Some(path) = out.csv {
        write_atomic(path, csv(&c)?.as_bytes())?;
        eprintln!("wrote {}", path.display());
        if let Some(methods) = stats_csv(&c)? {
            let path = methods_csv_path(path);
            write_atomic(&path, methods.as_bytes())?;
            eprintln!("wrote {}", path.display());
        }
    }
    if let Some(dir) = out.plot {
        for f in plot_comparison(&c, dir)? {
            eprintln!("wrote {}", f.display());
        }
    }
    Ok(())
}

/// Runs `qdarts sample --random N`: random genotypes of the search space of `config`,
/// `random-000.json` / `.txt`, … in `out`.
pub fn sample(count: usize, seed: u64, config: &Path, out: &Path) -> Result<()> {
    let cfg = ExperimentConfig::load(config, &[])?;
    let mut rng = Rng::new(seed);
    let mut below = |n: usize| rng.below(n);
    let width = count.saturating_sub(1).to_string().len().max(3);
    let mut files = Vec::new();
    for i in 0..count {
        let g = random_genotype(cfg.model.nodes, &cfg.model.primitives, &mut below)
            .with_context(|| format!("{}: the search space", config.display()))?;
        let stem = out.join(format!("random-{i:0width$}"));
        files.push((stem, g));
    }
    for (stem, _) in &files {
        let json = stem.with_extension("json");
        if json.exists() {
            bail!("{} exists: choose another --out, or remove it", json.display());
        }
    }
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    for (stem, g) in &files {
        write_atomic(&stem.with_extension("txt"), format!("{}\n", g.to_darts_text()).as_bytes())?;
        write_atomic(&stem.with_extension("json"), &g.to_json()?)?;
        println!("{}", stem.with_extension("json").display());
    }
    eprintln!(
        "{count} random genotypes of {} ({} nodes, ops {}), seed {seed}",
        config.display(),
        cfg.model.nodes,
        cfg.model.primitives.iter().map(|p| p.name()).collect::<Vec<_>>().join(" ")
    );
    Ok(())
}
