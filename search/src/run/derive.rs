//! The genotype of the supernet's current α: DARTS' derivation under the configured guards, or
//! the perturbation-based selection's decisions, and with a bit-width search the widths of
//! the kept ops.

use qdarts_engine::RunError;
use qdarts_genotypes::{Bits, DeriveOptions, Edge, Genotype, Primitive, edge_index};
use qdarts_ops::candidates::has_bits;
use qdarts_ops::qconfig::Site;

use crate::config::{BitsConfig, ExperimentConfig};
use crate::supernet::{AlphaRows, Alphas};

/// The genotype of the current α (and, with a bit-width search, the widths of its kept ops);
/// with a perturbation-based selection, the decided edges and nodes as decided.
pub fn derive_genotype(cfg: &ExperimentConfig, alphas: &Alphas) -> Result<Genotype, RunError> {
    let (an, ar) = alphas.to_rows()?;
    derive_rows(cfg, alphas, &an, &ar)
}

/// The most likely widths of each kept op of a derived cell: `w_rows`/`a_rows` are the
/// softmaxes over the candidate widths `[edges][K][B]`. Ops without convolutions get the
/// config's widths (clamped to 2..8), which they keep anyway.
fn kept_bits(
    cfg: &ExperimentConfig,
    bits: &BitsConfig,
    cell: &[Vec<Edge>],
    (w_rows, a_rows): (&[AlphaRows], &[AlphaRows]),
    reduction: bool,
) -> Vec<Vec<Bits>> {
    let argmax = |row: &[f32], choices: &[u32]| {
        let i =
            row.iter().enumerate().fold(0, |best, (i, v)| if *v > row[best] { i } else { best });
        choices[i] as u8
    };
    let config = |p: Primitive, site: Site| match cfg.quant.spec_for(p.name(), site) {
        Ok(Some(s)) => s.bits().clamp(2, 8) as u8,
        _ => 8,
    };
    let mut out = Vec::with_capacity(cell.len());
    for (i, node) in cell.iter().enumerate() {
        out.push(
            node.iter()
                .map(|edge| {
                    let (e, p) = (edge_index(i, edge.input), edge.op);
                    let stride = if reduction && edge.input < 2 { 2 } else { 1 };
                    let k = cfg.model.primitives.iter().position(|q| *q == p);
                    match k {
                        Some(k) if has_bits(p, stride) => Bits {
                            weight: argmax(&w_rows[e][k], &bits.weight),
                            act: argmax(&a_rows[e][k], &bits.act),
                        },
                        _ => Bits { weight: config(p, Site::Weight), act: config(p, Site::Act) },
                    }
                })
                .collect(),
        );
    }
    out
}

/// The genotype of α rows under the configured guards: P-DARTS' limit on skip connections and
/// on parameter-free ops, PC-DARTS' edge weights.
pub(super) fn derive_rows(
    cfg: &ExperimentConfig,
    alphas: &Alphas,
    an: &[Vec<f32>],
    ar: &[Vec<f32>],
) -> Result<Genotype, RunError> {
    let m = &cfg.model;
    let edges = alphas.edge_rows()?;
    let opt = DeriveOptions {
        max_skip: cfg.search.guards.max_skip,
        max_param_free: cfg.search.guards.max_param_free,
        edge_normal: edges.as_ref().map(|e| e.0.as_slice()),
        edge_reduce: edges.as_ref().map(|e| e.1.as_slice()),
    };
    let selected = alphas.projection.as_ref().and_then(|p| p.genotype(&m.primitives));
    let mut g = match (selected, &alphas.projection) {
        (Some(g), _) => g,
        (None, Some(p)) => {
            let (an, ar) = p.rows(an, ar);
            Genotype::derive_with(&an, &ar, &m.primitives, m.nodes, 2, &opt)?
        }
        (None, None) => Genotype::derive_with(an, ar, &m.primitives, m.nodes, 2, &opt)?,
    };
    if let (Some(bits), Some([wn, wr, a_n, a_r])) = (&cfg.search.bits, alphas.bit_rows()?) {
        g.normal_bits = Some(kept_bits(cfg, bits, &g.normal, (&wn, &a_n), false));
        g.reduce_bits = Some(kept_bits(cfg, bits, &g.reduce, (&wr, &a_r), true));
    }
    Ok(g)
}
