//! The hardware cost of the architecture a search is choosing, as a differentiable function
//! of α and the bit-width parameters: the expected BitOPs per image or the expected bytes of
//! the weights of the derived network at the search's shape.
//!
//! Per cell type the tables hold, for every edge `e` and candidate op `k`, the MACs `M_ek` and
//! conv weights `P_ek` of that op summed over the cells of that type (one α is shared by all
//! of them). With `p_ek` the op's softmax weight on its edge and `E[b]` the expected width under
//! the op's bit softmax (or the config's width without a bit search):
//!
//! - BitOPs: `f · Σ_type Σ_ek p_ek·M_ek·E[b_w]_ek·E[b_a]_ek + fixed`,
//! - bytes: `f · Σ_type Σ_ek p_ek·P_ek·E[b_w]_ek / 8 + fixed`,
//!
//! where `f = 2·nodes / edges` is the share of edges the derived cell keeps (two inputs per
//! node), so that the sum over all edges of the supernet estimates the derived cell's cost,
//! and `fixed` is the stem, the cells' input preprocessing and the classifier at the config's
//! widths (the same in the supernet and the derived network). All MACs of an op are charged at
//! its one activation width; an op's first convolution actually reads the node's 8-bit grid,
//! which the frozen model counts exactly (`qdarts eval`).

use burn::tensor::{Device, Tensor};
use qdarts_genotypes::{Primitive, edge_count};
use qdarts_ops::candidates::{OpCost, QMixedOp};
use qdarts_ops::cost::{Penalty, expected_cost};
use qdarts_ops::network::Preprocess;
use qdarts_ops::qconfig::{QuantConfig, Site};

use crate::config::CostMetric;
use crate::supernet::{ArchWeights, BitWeights, SearchNetwork};

/// The MACs and weights of every candidate op on every edge of one cell type, `[edges][K]`,
/// summed over the cells of that type.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CellCost {
    /// Per edge and op.
    pub ops: Vec<Vec<OpCost>>,
}

impl CellCost {
    fn add(&mut self, edges: &[QMixedOp], sizes: &[(usize, usize)]) {
        if self.ops.is_empty() {
            self.ops = edges.iter().map(|e| vec![OpCost::default(); e.ops.len()]).collect();
        }
        for ((row, edge), &(h, w)) in self.ops.iter_mut().zip(edges).zip(sizes) {
            for (c, op) in row.iter_mut().zip(&edge.ops) {
                let o = op.cost(h, w);
                c.macs += o.macs;
                c.params += o.params;
            }
        }
    }

    fn table(&self, metric: CostMetric, device: &Device) -> Tensor<2> {
        let k = self.ops.first().map_or(0, Vec::len);
        let v: Vec<f32> = self
            .ops
            .iter()
            .flatten()
            .map(|c| match metric {
                CostMetric::Bitops => c.macs as f32,
                CostMetric::Size => c.params as f32,
            })
            .collect();
        Tensor::<1>::from_floats(v.as_slice(), device).reshape([self.ops.len(), k])
    }
}

/// What a search's cost is computed from.
#[derive(Debug, Clone, PartialEq)]
pub struct CostModel {
    /// The normal cells.
    pub normal: CellCost,
    /// The reduction cells.
    pub reduce: CellCost,
    /// Share of the edges the derived cell keeps.
    pub kept: f64,
    /// BitOPs per image of the stem, preprocessing and classifier.
    pub fixed_bitops: f64,
    /// Weight bits of the stem, preprocessing and classifier.
    pub fixed_weight_bits: f64,
    /// The config's weight and activation widths of each candidate (without a bit search).
    pub config_bits: Vec<(f32, f32)>,
    /// Candidate weight and activation widths (with a bit search).
    pub choices: Option<(Vec<u32>, Vec<u32>)>,
}

/// The expected cost of the current architecture.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExpectedCost {
    /// BitOPs per image.
    pub bitops: f64,
    /// Bytes of the weights.
    pub weight_bytes: f64,
}

/// A width as the cost counts it: the spec's bits, 32 for float.
fn spec_bits(cfg: &QuantConfig, op: &str, site: Site) -> f32 {
    match cfg.spec_for(op, site) {
        Ok(Some(s)) => s.bits() as f32,
        _ => 32.0,
    }
}

impl CostModel {
    /// The tables of `net` on `h×w` images.
    pub fn new(
        net: &SearchNetwork,
        (h, w): (usize, usize),
        nodes: usize,
        primitives: &[Primitive],
        cfg: &QuantConfig,
        choices: Option<(Vec<u32>, Vec<u32>)>,
    ) -> Self {
        let at = |op: &str| {
            f64::from(spec_bits(cfg, op, Site::Weight)) * f64::from(spec_bits(cfg, op, Site::Act))
        };
        let wbits = |op: &str| f64::from(spec_bits(cfg, op, Site::Weight));
        let (stem_macs, _) = net.stem.macs(h, w);
        let mut fixed_bitops = stem_macs as f64 * at("stem");
        let mut fixed_weight_bits = net.stem.params() as f64 * wbits("stem");
        let (mut normal, mut reduce) = (CellCost::default(), CellCost::default());
        // (h, w) of s0 and s1 at each cell.
        let (mut hw0, mut hw1) = ((h, w), (h, w));
        for cell in &net.cells {
            let (m0, p0, out0) = match &cell.preproc0 {
                Preprocess::Reduce(op) => {
                    let (m, out) = op.macs(hw0.0, hw0.1);
                    (m, op.params(), out)
                }
                Preprocess::Conv(op) => {
                    let (m, out) = op.conv.macs(hw0.0, hw0.1);
                    (m, op.conv.params(), out)
                }
            };
            let (m1, _) = cell.preproc1.conv.macs(hw1.0, hw1.1);
            fixed_bitops += (m0 + m1) as f64 * at("preprocess");
            fixed_weight_bits += (p0 + cell.preproc1.conv.params()) as f64 * wbits("preprocess");
            let inner =
                if cell.reduction { (out0.0.div_ceil(2), out0.1.div_ceil(2)) } else { out0 };
            let mut sizes = Vec::new();
            for i in 0..cell.nodes {
                for j in 0..i + 2 {
                    sizes.push(if cell.reduction && j >= 2 { inner } else { out0 });
                }
            }
            if cell.reduction { &mut reduce } else { &mut normal }.add(&cell.edges, &sizes);
            (hw0, hw1) = (hw1, inner);
        }
        let feats = net.classifier.weight.val().dims();
        fixed_bitops += (feats[0] * feats[1]) as f64 * at("classifier");
        fixed_weight_bits += (feats[0] * feats[1]) as f64 * wbits("classifier");
        let config_bits = primitives
            .iter()
            .map(|p| (spec_bits(cfg, p.name(), Site::Weight), spec_bits(cfg, p.name(), Site::Act)))
            .collect();
        CostModel {
            normal,
            reduce,
            kept: (2 * nodes) as f64 / edge_count(nodes) as f64,
            fixed_bitops,
            fixed_weight_bits,
            config_bits,
            choices,
        }
    }

    /// `[E, K]` expected widths: under the bit softmax `probs` `[E, K, B]` over `choices`, or
    /// the config's.
    fn widths(
        &self,
        probs: Option<Tensor<3>>,
        choices: Option<&[u32]>,
        weight: bool,
        like: &Tensor<2>,
    ) -> Tensor<2> {
        match (probs, choices) {
            (Some(p), Some(c)) => {
                let [e, k, b] = p.dims();
                let c: Vec<f32> = c.iter().map(|&v| v as f32).collect();
                let c = Tensor::<1>::from_floats(c.as_slice(), &p.device()).reshape([1, 1, b]);
                p.mul(c).sum_dim(2).reshape([e, k])
            }
            _ => {
                let [e, k] = like.dims();
                let v: Vec<f32> = (0..e)
                    .flat_map(|_| self.config_bits.iter().map(|&(w, a)| if weight { w } else { a }))
                    .collect();
                Tensor::<1>::from_floats(v.as_slice(), &like.device()).reshape([e, k])
            }
        }
    }

    /// The expected cost `[1]` under the architecture weights `a` (differentiable in them).
    pub fn expected(&self, metric: CostMetric, a: &ArchWeights) -> Tensor<1> {
        let dev = a.normal.device();
        let (wc, ac) = match &self.choices {
            Some((w, a)) => (Some(w.as_slice()), Some(a.as_slice())),
            None => (None, None),
        };
        let part = |cell: &CellCost, probs: &Tensor<2>, bits: Option<(Tensor<3>, Tensor<3>)>| {
            let (bw, ba) = match bits {
                Some((w, a)) => (Some(w), Some(a)),
                None => (None, None),
            };
            let w_bits = self.widths(bw, wc, true, probs);
            let table = cell.table(metric, &dev);
            match metric {
                CostMetric::Bitops => {
                    let a_bits = self.widths(ba, ac, false, probs);
                    expected_cost(probs.clone(), table, w_bits, Some(a_bits))
                }
                CostMetric::Size => expected_cost(probs.clone(), table, w_bits, None),
            }
        };
        let split = |b: &BitWeights, reduce: bool| {
            if reduce {
                (b.weight_reduce.clone(), b.act_reduce.clone())
            } else {
                (b.weight_normal.clone(), b.act_normal.clone())
            }
        };
        let n = part(&self.normal, &a.normal, a.bits.as_ref().map(|b| split(b, false)));
        let r = part(&self.reduce, &a.reduce, a.bits.as_ref().map(|b| split(b, true)));
        let (fixed, scale) = match metric {
            CostMetric::Bitops => (self.fixed_bitops, 1.0),
            CostMetric::Size => (self.fixed_weight_bits / 8.0, 1.0 / 8.0),
        };
        n.add(r).mul_scalar(self.kept * scale).add_scalar(fixed)
    }

    /// Both costs of `a` on the host.
    pub fn report(&self, a: &ArchWeights) -> ExpectedCost {
        let read = |t: Tensor<1>| f64::from(t.into_scalar::<f32>());
        ExpectedCost {
            bitops: read(self.expected(CostMetric::Bitops, a)),
            weight_bytes: read(self.expected(CostMetric::Size, a)),
        }
    }

    /// The penalty of the cost of `a`, `[1]`.
    pub fn penalty(&self, metric: CostMetric, penalty: &Penalty, a: &ArchWeights) -> Tensor<1> {
        penalty.of(self.expected(metric, a))
    }
}
