//! Random genotypes of a DARTS search space: the random-search baseline that a searched
//! genotype has to beat (Li & Talwalkar, "Random Search and Reproducibility for Neural
//! Architecture Search", 2019; the DARTS paper's random baseline samples cells the same way).
//! Each intermediate node takes two distinct inputs among the states before it, each with an
//! op drawn uniformly from the space without `none`; every intermediate node is concatenated.

use crate::error::GenotypeError;
use crate::genotype::{Edge, Genotype};
use crate::primitive::Primitive;

/// Draws one cell; `below(n)` returns a uniform integer in `0..n`.
fn random_cell(
    nodes: usize,
    ops: &[Primitive],
    below: &mut dyn FnMut(usize) -> usize,
) -> Vec<Vec<Edge>> {
    (0..nodes)
        .map(|i| {
            let states = i + 2;
            let a = below(states);
            let mut b = below(states - 1);
            if b >= a {
                b += 1;
            }
            let (a, b) = (a.min(b), a.max(b));
            [a, b].iter().map(|&input| Edge { op: ops[below(ops.len())], input }).collect()
        })
        .collect()
}

/// A random genotype with `nodes` intermediate nodes per cell, ops drawn from `space` (its
/// `none` left out), the normal cell drawn before the reduction cell.
pub fn random_genotype(
    nodes: usize,
    space: &[Primitive],
    below: &mut dyn FnMut(usize) -> usize,
) -> Result<Genotype, GenotypeError> {
    let ops: Vec<Primitive> = space.iter().copied().filter(|p| *p != Primitive::None).collect();
    if ops.is_empty() {
        return Err(GenotypeError::Invalid("the search space has no op other than none".into()));
    }
    if nodes == 0 || nodes > crate::genotype::MAX_NODES {
        return Err(GenotypeError::Invalid(format!(
            "{nodes} nodes: a cell has 1 to {} intermediate nodes",
            crate::genotype::MAX_NODES
        )));
    }
    let concat: Vec<usize> = (2..nodes + 2).collect();
    let normal = random_cell(nodes, &ops, below);
    let reduce = random_cell(nodes, &ops, below);
    let g = Genotype {
        normal,
        normal_concat: concat.clone(),
        reduce,
        reduce_concat: concat,
        normal_bits: None,
        reduce_bits: None,
    };
    g.validate()?;
    Ok(g)
}
