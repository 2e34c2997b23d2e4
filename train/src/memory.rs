//! The evaluation network's memory for a config and genotype, estimated before it is built
//! ([`qdarts_engine::memory`]): every kept op keeps about `T` tensors of its cell's output
//! size per image (calibrated on the maximum RSS of `qdarts train` with the default config at
//! C = 8 and 16: 12 under fake quantization), its weights with gradients and momentum.

use qdarts_engine::memory::{MemoryNeed, op_weights};
use qdarts_genotypes::Genotype;
use qdarts_ops::network::is_reduction;
use qdarts_ops::qconfig::Preset;

use crate::config::TrainConfig;
use crate::network::EvalShape;

/// The evaluation network's need for `shape` and `genotype` at the config's batch.
pub fn eval_need(cfg: &TrainConfig, shape: &EvalShape, genotype: &Genotype) -> MemoryNeed {
    let u = |v: usize| v as u64;
    let t = if cfg.quant.preset == Preset::Float { 7 } else { 12 };
    let (mut hw, mut c) = (u(shape.size) * u(shape.size), u(shape.channels));
    let c_stem = u(shape.stem_multiplier) * c;
    let (mut c_pp, mut c_p) = (c_stem, c_stem);
    let mut elems = c_stem * hw;
    let mut weights = u(shape.c_in) * c_stem * 9;
    for i in 0..shape.layers {
        let reduction = is_reduction(i, shape.layers);
        if reduction {
            c *= 2;
            hw = hw.div_ceil(4);
        }
        let (cell, concat) = if reduction {
            (&genotype.reduce, genotype.reduce_concat.len())
        } else {
            (&genotype.normal, genotype.normal_concat.len())
        };
        let edges = cell.iter().flatten();
        elems = elems.saturating_add(u(cell.iter().map(Vec::len).sum()) * c * hw);
        weights = weights.saturating_add(edges.map(|e| op_weights(e.op, c)).sum::<u64>());
        weights = weights.saturating_add((c_pp + c_p) * c);
        (c_pp, c_p) = (c_p, u(concat) * c);
    }
    weights = weights.saturating_add(c_p * u(shape.classes));
    MemoryNeed {
        parameters: weights.saturating_mul(4 * 4),
        activations: elems.saturating_mul(u(cfg.train.batch_size)).saturating_mul(4 * t),
    }
}
