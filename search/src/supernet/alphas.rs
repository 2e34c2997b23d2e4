//! `Alphas`: the architecture parameters, one row of α per edge and op for each cell type.
//! The search controller owns them; the supernet holds only weights.

use burn::module::{Module, Param};
use burn::tensor::activation::softmax;
use burn::tensor::{Device, Distribution, Tensor};
use qdarts_engine::{RunError, read_f32};
use qdarts_genotypes::edge_count;

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
}

impl ArchWeights {
    /// Plain softmax(α) rows, no edge weights.
    pub fn plain(normal: Tensor<2>, reduce: Tensor<2>) -> Self {
        ArchWeights { normal, reduce, edge_normal: None, edge_reduce: None }
    }

    /// Cut from the autodiff graph (the weight step trains the weights only).
    pub fn detach(self) -> Self {
        ArchWeights {
            normal: self.normal.detach(),
            reduce: self.reduce.detach(),
            edge_normal: self.edge_normal.map(Tensor::detach),
            edge_reduce: self.edge_reduce.map(Tensor::detach),
        }
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
                Tensor::<2>::random(
                    [edge_count(nodes), ops],
                    Distribution::Normal(0.0, 1.0),
                    device,
                )
                .mul_scalar(1e-3),
            )
        };
        Alphas { normal: init(), reduce: init(), edge_normal: None, edge_reduce: None, nodes }
    }

    /// Adds PC-DARTS' β, `1e-3 · N(0, 1)` per edge as PC-DARTS initialises them (drawn after α).
    pub fn with_edge_normalization(mut self, device: &Device) -> Self {
        let init = || {
            Param::from_tensor(
                Tensor::<1>::random(
                    [edge_count(self.nodes)],
                    Distribution::Normal(0.0, 1.0),
                    device,
                )
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

    /// Everything the forward needs: softmax(α), and the edge weights when β exist.
    pub fn arch(&self) -> ArchWeights {
        let (normal, reduce) = self.weights();
        let edge =
            |b: &Option<Param<Tensor<1>>>| b.as_ref().map(|b| node_softmax(b.val(), self.nodes));
        ArchWeights {
            normal,
            reduce,
            edge_normal: edge(&self.edge_normal),
            edge_reduce: edge(&self.edge_reduce),
        }
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
