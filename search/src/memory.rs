//! The supernet's memory for a config, estimated before it is built
//! ([`qdarts_engine::memory`]).
//!
//! Activations: every edge of every cell keeps about `T` tensors of the cell's output size per
//! image for the backward pass, over all its candidates. `T` is calibrated on `qdarts bench
//! search` peaks (the DARTS shape, C=16, 8 cells, batch 64: 6.1 GiB float and 9.8 GiB
//! tensorrt, first order; 7.8 GiB float second order), rounded down; with partial channels
//! the candidates see C/K channels. Parameters: every candidate's weights, with their
//! gradients, momentum and the copies of a second-order step.

use qdarts_engine::memory::{MemoryNeed, op_weights};
use qdarts_genotypes::edge_count;
use qdarts_ops::network::is_reduction;
use qdarts_ops::qconfig::Preset;

use crate::config::{ExperimentConfig, Order};
use crate::supernet::NetShape;

/// Saved tensors per edge and image, at the cell's output size.
fn tensors_per_edge(cfg: &ExperimentConfig, partial: u64) -> u64 {
    let quantized = cfg.quant.preset != Preset::Float;
    let t = match (cfg.search.order, quantized) {
        (Order::First, false) => 23,
        (Order::First, true) => 38,
        (Order::Second, false) => 29,
        (Order::Second, true) => 64,
    };
    if partial > 1 { t / partial + 4 } else { t }
}

/// The supernet's need for `shape` on images of `hw` at the config's batch.
pub fn supernet_need(cfg: &ExperimentConfig, shape: &NetShape, hw: (usize, usize)) -> MemoryNeed {
    let u = |v: usize| v as u64;
    let k = u(shape.partial_channels.max(1));
    let edges = u(edge_count(shape.nodes));
    let (mut h, mut w) = (u(hw.0), u(hw.1));
    let mut c = u(shape.channels);
    let c_stem = u(shape.stem_multiplier) * c;
    let (mut c_pp, mut c_p) = (c_stem, c_stem);
    let mut elems = c_stem * h * w;
    let mut weights = u(shape.c_in) * c_stem * 9;
    for i in 0..shape.layers {
        if is_reduction(i, shape.layers) {
            c *= 2;
            h = h.div_ceil(2);
            w = w.div_ceil(2);
        }
        elems = elems.saturating_add(edges.saturating_mul(c * h * w));
        let per_edge: u64 = shape.primitives.iter().map(|&p| op_weights(p, c / k)).sum();
        weights = weights.saturating_add(edges * per_edge + (c_pp + c_p) * c);
        (c_pp, c_p) = (c_p, u(shape.nodes) * c);
    }
    weights = weights.saturating_add(c_p * u(shape.classes));
    let batch = u(cfg.search.batch_size);
    let t = tensors_per_edge(cfg, k);
    MemoryNeed {
        parameters: weights.saturating_mul(4 * 6),
        activations: elems.saturating_mul(batch).saturating_mul(4 * t),
    }
}
