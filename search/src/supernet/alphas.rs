//! `Alphas`: the architecture parameters, one row of α per edge and op for each cell type.
//! The search controller owns them; the supernet holds only weights.

use burn::module::{Module, Param};
use burn::tensor::activation::softmax;
use burn::tensor::{Device, Distribution, Tensor};
use qdarts_engine::{RunError, read_f32};
use qdarts_genotypes::edge_count;

/// α of one cell type on the host: one row per edge, one value per op.
pub type AlphaRows = Vec<Vec<f32>>;

/// The architecture parameters: one row of α per edge and op, for each cell type.
#[derive(Module, Debug)]
pub struct Alphas {
    /// α of the normal cell, `[edges, K]`.
    pub normal: Param<Tensor<2>>,
    /// α of the reduction cell, `[edges, K]`.
    pub reduce: Param<Tensor<2>>,
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
        Alphas { normal: init(), reduce: init() }
    }

    /// Softmax over the ops of each edge: `(normal, reduce)`.
    pub fn weights(&self) -> (Tensor<2>, Tensor<2>) {
        (softmax(self.normal.val(), 1), softmax(self.reduce.val(), 1))
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
