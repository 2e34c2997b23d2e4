//! `SearchCell`: a DARTS search cell over quantized mixed ops (pt.darts `SearchCell`).
//!
//! Inputs `s0`, `s1` (outputs of the two previous cells) are preprocessed to `C` channels
//! (FactorizedReduce when the previous cell reduced, else ReLU–Conv1×1–BN); each intermediate
//! node sums one mixed op per earlier state (stride 2 on the inputs of a reduction cell), as a
//! quantized add; the output concatenates the intermediate nodes on one grid.

use burn::module::Module;
use burn::tensor::{Device, Tensor};
use qdarts_genotypes::Primitive;
use qdarts_ops::arith::{QAdd, QConcat};
use qdarts_ops::candidates::{Ctx, OpBits, Pass, QMixedOp, QStdConv, QTensor, QuantSites};
use qdarts_ops::network::Preprocess;
use qdarts_ops::qconfig::QuantConfig;
use qdarts_ops::quant::{FakeQuantizer, SpecError};

use super::alphas::BitWeights;

/// One search cell.
#[derive(Module, Debug)]
pub struct SearchCell {
    /// Preprocessing of `s0`.
    pub preproc0: Preprocess,
    /// Preprocessing of `s1`.
    pub preproc1: QStdConv,
    /// Mixed ops, node by node, inputs in increasing order.
    pub edges: Vec<QMixedOp>,
    /// The quantized sum of each node.
    pub adds: Vec<QAdd>,
    /// The output concatenation.
    pub concat: QConcat,
    /// Whether this cell halves the resolution.
    pub reduction: bool,
    /// Intermediate nodes.
    pub nodes: usize,
}

/// What a cell is built from.
#[derive(Debug, Clone, Copy)]
pub struct CellShape {
    /// Channels of `s0`.
    pub c_pp: usize,
    /// Channels of `s1`.
    pub c_p: usize,
    /// Channels of each node.
    pub c: usize,
    /// Whether this cell reduces.
    pub reduction: bool,
    /// Whether the previous cell reduced.
    pub reduction_prev: bool,
    /// Intermediate nodes.
    pub nodes: usize,
    /// PC-DARTS partial channels `K` of the mixed ops.
    pub partial: usize,
}

impl SearchCell {
    /// A cell at `path` (e.g. `cells.3`).
    pub fn new(
        s: CellShape,
        primitives: &[Primitive],
        cfg: &QuantConfig,
        path: &str,
        device: &Device,
    ) -> Result<Self, SpecError> {
        Self::with_bits(s, primitives, cfg, path, device, OpBits::Config)
    }

    /// [`new`](Self::new) with the candidates' widths given (a bit-width search).
    pub fn with_bits(
        s: CellShape,
        primitives: &[Primitive],
        cfg: &QuantConfig,
        path: &str,
        device: &Device,
        bits: OpBits,
    ) -> Result<Self, SpecError> {
        let ctx =
            |name: &str, op: &'static str| Ctx::new(cfg, op, format!("{path}.{name}"), device);
        let (preproc0, preproc1) =
            Preprocess::pair(s.reduction_prev, [s.c_pp, s.c_p, s.c], false, cfg, path, device)?;
        let mut edges = Vec::new();
        let mut adds = Vec::new();
        for i in 0..s.nodes {
            for j in 0..i + 2 {
                let stride = if s.reduction && j < 2 { 2 } else { 1 };
                let k = edges.len();
                edges.push(QMixedOp::with_bits(
                    primitives,
                    s.c,
                    stride,
                    s.partial,
                    cfg,
                    &format!("{path}.edges.{k}"),
                    device,
                    bits,
                )?);
            }
            adds.push(QAdd::new(&ctx(&format!("nodes.{}", i + 2), "add"))?);
        }
        Ok(SearchCell {
            preproc0,
            preproc1,
            edges,
            adds,
            concat: QConcat::new(&ctx("concat", "concat"))?,
            reduction: s.reduction,
            nodes: s.nodes,
        })
    }

    /// `edge`: PC-DARTS' edge weights (one `[1]` per edge), which scale each edge's output
    /// in its node's sum. `aux_skip` is DARTS-' β: when positive, `β·h` joins the node sum
    /// for every stride-1 edge reading state `h` (in a reduction cell, the edges between
    /// intermediate nodes). `pass`: how the quantizers hold their rounding, and with a
    /// bit-width search the softmaxes over each op's candidate widths.
    ///
    /// # Shapes
    /// - s0, s1: `[N, c_pp, H, W]`, `[N, c_p, H, W]` (s0 at twice the resolution after a
    ///   reduction); weights: one `[K]` row per edge; output: `[N, nodes·C, H', W']`.
    pub fn forward(
        &self,
        s0: QTensor,
        s1: QTensor,
        weights: &[Tensor<1>],
        edge: Option<&[Tensor<1>]>,
        aux_skip: f32,
        pass: Pass<BitWeights>,
    ) -> QTensor {
        let s0 = self.preproc0.forward_in(s0, pass.quant);
        let mut states = vec![s0, self.preproc1.forward_in(s1, pass.quant)];
        let mut k = 0;
        for add in &self.adds {
            let mut terms: Vec<QTensor> = Vec::with_capacity(2 * states.len());
            for (j, h) in states.iter().enumerate() {
                let eb = pass.bits.map(|b| b.edge(self.reduction, k));
                let edge_pass = pass.with_bits(eb.as_ref());
                let y = self.edges[k].forward_in(h.clone(), weights[k].clone(), edge_pass);
                terms.push(match edge {
                    // Off the edge's grid; the node's add requantizes the sum.
                    Some(e) => QTensor::float(qdarts_ops::scale(y.value, e[k].clone())),
                    None => y,
                });
                k += 1;
                let stride1 = !(self.reduction && j < 2);
                if aux_skip > 0.0 && stride1 {
                    terms.push(QTensor::float(h.value.clone().mul_scalar(aux_skip)));
                }
            }
            states.push(add.forward_in(terms, pass.quant));
        }
        self.concat.forward_in(states.split_off(2), pass.quant)
    }
}

impl QuantSites for SearchCell {
    fn quantizers(&self) -> Vec<&FakeQuantizer> {
        let mut q = self.preproc0.quantizers();
        q.extend(self.preproc1.quantizers());
        for e in &self.edges {
            q.extend(e.quantizers());
        }
        for a in &self.adds {
            q.extend(a.quantizers());
        }
        q.extend(self.concat.quantizers());
        q
    }
}
