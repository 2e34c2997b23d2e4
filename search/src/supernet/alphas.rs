//! `Alphas`: the architecture parameters, one row of α per edge and op for each cell type.
//! The search controller owns them; the supernet holds only weights.

use burn::module::{Module, Param};
use burn::tensor::activation::softmax;
use burn::tensor::{Device, Distribution, Tensor, TensorData};
use qdarts_data::Rng;
use qdarts_engine::{RunError, read_f32};
use qdarts_genotypes::edge_count;
use qdarts_ops::candidates::EdgeBits;
use qdarts_ops::random;

use crate::selection::{CellProjection, Projection, Trial};

/// α of one cell type on the host: one row per edge, one value per op.
pub type AlphaRows = Vec<Vec<f32>>;

/// Edge weights of the normal and the reduction cell on the host, one per edge.
pub type EdgeRows = (Vec<f32>, Vec<f32>);

/// The architecture parameters: one row of α per edge and op, for each cell type, and with
/// PC-DARTS' edge normalization one β per edge.
#[derive(Module, Debug)]
pub struct Alphas {
    /// α of the normal cell, `[edges, K]`.
    pub normal: Param<Tensor<2>>,
    /// α of the reduction cell, `[edges, K]`.
    pub reduce: Param<Tensor<2>>,
    /// PC-DARTS β of the normal cell's edges, `[edges]` (softmax over each node's inputs).
    pub edge_normal: Option<Param<Tensor<1>>>,
    /// PC-DARTS β of the reduction cell's edges.
    pub edge_reduce: Option<Param<Tensor<1>>>,
    /// Intermediate nodes per cell (the softmax groups of β).
    pub nodes: usize,
    /// With a bit-width search, the parameters over each op's candidate widths.
    pub bits: Option<BitAlphas>,
    /// DARTS-PT's decisions, applied to the softmax weights of every forward (none: plain
    /// DARTS). Not a parameter: the search saves it beside the checkpoint.
    #[module(skip)]
    pub projection: Option<Projection>,
}

/// The bit-width parameters of a search (EdMIPS): for every edge and op of each cell type, one
/// value per candidate weight width and one per activation width. Ops without convolutions
/// have rows too; nothing reads them, so their gradient is zero.
#[derive(Module, Debug)]
pub struct BitAlphas {
    /// Weight widths of the normal cell, `[edges, K, Bw]`.
    pub weight_normal: Param<Tensor<3>>,
    /// Weight widths of the reduction cell.
    pub weight_reduce: Param<Tensor<3>>,
    /// Activation widths of the normal cell, `[edges, K, Ba]`.
    pub act_normal: Param<Tensor<3>>,
    /// Activation widths of the reduction cell.
    pub act_reduce: Param<Tensor<3>>,
}

/// EdMIPS' initial value of every bit-width parameter (all widths equally likely).
pub const BIT_ALPHA_INIT: f32 = 0.01;

impl BitAlphas {
    /// All four, in a fixed order: weight normal, weight reduce, act normal, act reduce.
    pub fn params(&self) -> [&Param<Tensor<3>>; 4] {
        [&self.weight_normal, &self.weight_reduce, &self.act_normal, &self.act_reduce]
    }
}

/// softmax over the candidate widths of every op on every edge of both cell types.
#[derive(Debug, Clone)]
pub struct BitWeights {
    /// Weight widths of the normal cell, `[edges, K, Bw]`.
    pub weight_normal: Tensor<3>,
    /// Weight widths of the reduction cell.
    pub weight_reduce: Tensor<3>,
    /// Activation widths of the normal cell, `[edges, K, Ba]`.
    pub act_normal: Tensor<3>,
    /// Activation widths of the reduction cell.
    pub act_reduce: Tensor<3>,
}

impl BitWeights {
    /// The weight and activation softmaxes of the reduction cell (`reduction`) or the normal
    /// cell, `[edges, K, B]` each.
    pub fn cell(&self, reduction: bool) -> (&Tensor<3>, &Tensor<3>) {
        if reduction {
            (&self.weight_reduce, &self.act_reduce)
        } else {
            (&self.weight_normal, &self.act_normal)
        }
    }

    /// The rows of one edge of one cell type.
    pub fn edge(&self, reduction: bool, e: usize) -> EdgeBits {
        let (w, a) = self.cell(reduction);
        let cut = |t: &Tensor<3>| {
            let [_, k, b] = t.dims();
            t.clone().slice([e..e + 1, 0..k, 0..b]).reshape([k, b])
        };
        EdgeBits { weight: cut(w), act: cut(a) }
    }

    fn map(self, f: impl Fn(Tensor<3>) -> Tensor<3>) -> Self {
        BitWeights {
            weight_normal: f(self.weight_normal),
            weight_reduce: f(self.weight_reduce),
            act_normal: f(self.act_normal),
            act_reduce: f(self.act_reduce),
        }
    }
}

/// What the supernet's forward needs of the architecture: softmax(α) per edge of each cell
/// type, and the softmax of β within each node's inputs when edges are normalized.
#[derive(Debug, Clone)]
pub struct ArchWeights {
    /// softmax(α) of the normal cell, `[edges, K]`.
    pub normal: Tensor<2>,
    /// softmax(α) of the reduction cell.
    pub reduce: Tensor<2>,
    /// Edge weights of the normal cell, `[edges]`.
    pub edge_normal: Option<Tensor<1>>,
    /// Edge weights of the reduction cell.
    pub edge_reduce: Option<Tensor<1>>,
    /// The softmaxes over each op's candidate widths, with a bit-width search.
    pub bits: Option<BitWeights>,
}

impl ArchWeights {
    /// Plain softmax(α) rows, no edge weights.
    pub fn plain(normal: Tensor<2>, reduce: Tensor<2>) -> Self {
        ArchWeights { normal, reduce, edge_normal: None, edge_reduce: None, bits: None }
    }

    /// Cut from the autodiff graph (the weight step trains the weights only).
    pub fn detach(self) -> Self {
        ArchWeights {
            normal: self.normal.detach(),
            reduce: self.reduce.detach(),
            edge_normal: self.edge_normal.map(Tensor::detach),
            edge_reduce: self.edge_reduce.map(Tensor::detach),
            bits: self.bits.map(|b| b.map(Tensor::detach)),
        }
    }
}

/// One edge's SDARTS-RS perturbation, in place: `w + U(-eps, eps)` per op, clamped to
/// `[0, 1]`, divided by the sum; all 0 after the clamp: one-hot on the largest perturbed value.
pub fn smooth_row(row: &mut [f32], eps: f64, rng: &mut Rng) {
    for w in row.iter_mut() {
        let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        *w = (f64::from(*w) + eps * (2.0 * u - 1.0)) as f32;
    }
    let top = (0..row.len()).fold(0, |b, i| if row[i] > row[b] { i } else { b });
    for w in row.iter_mut() {
        *w = w.clamp(0.0, 1.0);
    }
    let sum: f32 = row.iter().sum();
    if sum == 0.0 {
        row[top] = 1.0;
    } else {
        row.iter_mut().for_each(|w| *w /= sum);
    }
}

/// softmax of β within each node's inputs (2, 3, … edges), concatenated: PC-DARTS' `weights2`.
fn node_softmax(beta: Tensor<1>, nodes: usize) -> Tensor<1> {
    let mut parts = Vec::with_capacity(nodes);
    let mut start = 0;
    for i in 0..nodes {
        let n = i + 2;
        parts.push(softmax(beta.clone().slice(start..start + n), 0));
        start += n;
    }
    Tensor::cat(parts, 0)
}

impl Alphas {
    /// `1e-3 · N(0, 1)`, as pt.darts and DARTS initialise them.
    pub fn new(nodes: usize, ops: usize, device: &Device) -> Self {
        let init = || {
            Param::from_tensor(
                random::<2>([edge_count(nodes), ops], Distribution::Normal(0.0, 1.0), device)
                    .mul_scalar(1e-3),
            )
        };
        Alphas {
            normal: init(),
            reduce: init(),
            edge_normal: None,
            edge_reduce: None,
            nodes,
            bits: None,
            projection: None,
        }
    }

    /// Adds bit-width parameters over `weight` and `act` candidate widths for `ops` ops per
    /// edge, all at EdMIPS' [`BIT_ALPHA_INIT`] (no random draw).
    pub fn with_bits(mut self, ops: usize, weight: usize, act: usize, device: &Device) -> Self {
        let e = edge_count(self.nodes);
        let init =
            |b: usize| Param::from_tensor(Tensor::<3>::full([e, ops, b], BIT_ALPHA_INIT, device));
        self.bits = Some(BitAlphas {
            weight_normal: init(weight),
            weight_reduce: init(weight),
            act_normal: init(act),
            act_reduce: init(act),
        });
        self
    }

    /// Adds PC-DARTS' β, `1e-3 · N(0, 1)` per edge as PC-DARTS initialises them (drawn after α).
    pub fn with_edge_normalization(mut self, device: &Device) -> Self {
        let init = || {
            Param::from_tensor(
                random::<1>([edge_count(self.nodes)], Distribution::Normal(0.0, 1.0), device)
                    .mul_scalar(1e-3),
            )
        };
        self.edge_normal = Some(init());
        self.edge_reduce = Some(init());
        self
    }

    /// Softmax over the ops of each edge: `(normal, reduce)`.
    pub fn weights(&self) -> (Tensor<2>, Tensor<2>) {
        (softmax(self.normal.val(), 1), softmax(self.reduce.val(), 1))
    }

    /// Everything the forward needs: softmax(α) (under the selection's decisions, if any),
    /// and the edge weights when β exist.
    pub fn arch(&self) -> ArchWeights {
        self.arch_with(false, &Trial::Nothing)
    }

    /// [`Alphas::arch`] with `trial` taken out of the reduction cell (`reduction`) or the
    /// normal cell: a measurement of the perturbation-based selection.
    pub fn arch_with(&self, reduction: bool, trial: &Trial) -> ArchWeights {
        let (normal, reduce) = self.weights();
        self.finish_arch(normal, reduce, reduction, trial)
    }

    /// SDARTS-RS' random smoothing (Chen & Hsieh, ICML 2020): softmax(α) of every edge plus
    /// noise drawn uniformly in `[-eps, eps]` from `rng`, clamped to `[0, 1]` and divided by
    /// its sum (an edge left all 0 becomes one-hot on its largest perturbed weight), before
    /// the selection's decisions. Detached: it serves the weight step.
    pub fn arch_smoothed(&self, eps: f64, rng: &mut Rng) -> Result<ArchWeights, RunError> {
        let (normal, reduce) = self.weights();
        let mut perturb = |w: Tensor<2>| -> Result<Tensor<2>, RunError> {
            let [e, k] = w.dims();
            let device = w.device();
            let mut v = read_f32(w.detach(), "softmax(α)")?;
            for row in v.chunks_mut(k) {
                smooth_row(row, eps, rng);
            }
            Ok(Tensor::<2>::from_data(TensorData::new(v, [e, k]), &device))
        };
        let (normal, reduce) = (perturb(normal)?, perturb(reduce)?);
        Ok(self.finish_arch(normal, reduce, false, &Trial::Nothing).detach())
    }

    fn finish_arch(
        &self,
        mut normal: Tensor<2>,
        mut reduce: Tensor<2>,
        reduction: bool,
        trial: &Trial,
    ) -> ArchWeights {
        if let Some(p) = &self.projection {
            let project = |w: Tensor<2>, cell: &CellProjection, trial: &Trial| {
                let [e, k] = w.dims();
                let (keep, fill) = cell.masks(k, trial);
                let device = w.device();
                let t = |v: Vec<f32>| Tensor::<2>::from_data(TensorData::new(v, [e, k]), &device);
                w.mul(t(keep)).add(t(fill))
            };
            let (tn, tr) =
                if reduction { (&Trial::Nothing, trial) } else { (trial, &Trial::Nothing) };
            normal = project(normal, &p.normal, tn);
            reduce = project(reduce, &p.reduce, tr);
        }
        let edge =
            |b: &Option<Param<Tensor<1>>>| b.as_ref().map(|b| node_softmax(b.val(), self.nodes));
        ArchWeights {
            normal,
            reduce,
            edge_normal: edge(&self.edge_normal),
            edge_reduce: edge(&self.edge_reduce),
            bits: self.bit_weights(),
        }
    }

    /// softmax over the candidate widths, with a bit-width search.
    pub fn bit_weights(&self) -> Option<BitWeights> {
        self.bits.as_ref().map(|b| BitWeights {
            weight_normal: softmax(b.weight_normal.val(), 2),
            weight_reduce: softmax(b.weight_reduce.val(), 2),
            act_normal: softmax(b.act_normal.val(), 2),
            act_reduce: softmax(b.act_reduce.val(), 2),
        })
    }

    /// softmax over the candidate widths on the host, `[edges][K][B]` per tensor in
    /// [`BitAlphas::params`]' order, with a bit-width search.
    pub fn bit_rows(&self) -> Result<Option<[Vec<AlphaRows>; 4]>, RunError> {
        let Some(w) = self.bit_weights() else { return Ok(None) };
        let rows = |t: Tensor<3>| -> Result<Vec<AlphaRows>, RunError> {
            let [_, k, b] = t.dims();
            let flat = read_f32(t, "bit α")?;
            Ok(flat.chunks(k * b).map(|e| e.chunks(b).map(<[f32]>::to_vec).collect()).collect())
        };
        Ok(Some([
            rows(w.weight_normal)?,
            rows(w.weight_reduce)?,
            rows(w.act_normal)?,
            rows(w.act_reduce)?,
        ]))
    }

    /// The edge weights (softmax of β within each node) on the host: `(normal, reduce)`, when
    /// edges are normalized.
    pub fn edge_rows(&self) -> Result<Option<EdgeRows>, RunError> {
        let rows = |b: &Param<Tensor<1>>| read_f32(node_softmax(b.val(), self.nodes), "β");
        match (&self.edge_normal, &self.edge_reduce) {
            (Some(n), Some(r)) => Ok(Some((rows(n)?, rows(r)?))),
            _ => Ok(None),
        }
    }

    /// Raw α as host rows: `(normal, reduce)`.
    pub fn to_rows(&self) -> Result<(AlphaRows, AlphaRows), RunError> {
        let rows = |t: Tensor<2>| -> Result<AlphaRows, RunError> {
            let [_, k] = t.dims();
            Ok(read_f32(t, "α")?.chunks(k).map(<[f32]>::to_vec).collect())
        };
        Ok((rows(self.normal.val())?, rows(self.reduce.val())?))
    }
}
