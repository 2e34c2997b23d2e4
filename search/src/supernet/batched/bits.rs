//! A bit-width search in waves (EdMIPS' composite quantization, [`BitMix`]): each site's mix
//! of a wave's (kind, edge) pairs is one stacked mix, a stacked quantizer per candidate width,
//! and each row mixes them with its own op's softmax over the widths.

use burn::module::Module;
use burn::tensor::Tensor;
use qdarts_kernels::pick::pick;
use qdarts_ops::quant::{BitMix, QuantPass};

use super::super::alphas::BitWeights;
use super::BatchError;
use super::bank::all_or_none;

/// One cell type's softmaxes over the candidate widths, a row per (edge, op) of the cell,
/// `edge·K + op`.
#[derive(Debug, Clone)]
pub struct CellBits {
    /// Over the weight widths, `[edges·K, Bw]`.
    pub weight: Tensor<2>,
    /// Over the activation widths, `[edges·K, Ba]`.
    pub act: Tensor<2>,
}

impl CellBits {
    /// The reduction cell's rows of `bits` (`reduction`), or the normal cell's.
    pub fn of(bits: &BitWeights, reduction: bool) -> Self {
        let (w, a) = bits.cell(reduction);
        let flat = |t: &Tensor<3>| {
            let [e, k, b] = t.dims();
            t.clone().reshape([e * k, b])
        };
        CellBits { weight: flat(w), act: flat(a) }
    }
}

/// The mixes of a stacked site: at each candidate width a stacked quantizer (a row per
/// (kind, edge) it stands for), and each row's op in the cell's `[edges·K]` order, whose
/// softmax over the widths mixes the row.
#[derive(Module, Debug)]
pub struct RowMix {
    /// The stacked quantizers, one per width.
    pub mix: BitMix,
    /// Each row's `edge·K + op`.
    #[module(skip)]
    pub ops: Vec<usize>,
}

impl RowMix {
    /// The mix of `sites`, whose rows are the cell's ops `ops` (one per site); none where no
    /// site has a mix.
    ///
    /// # Errors
    /// Where some sites have a mix and others not, or they do not stack.
    pub(super) fn stack(
        sites: Vec<Option<&BitMix>>,
        ops: Vec<usize>,
        path: &str,
    ) -> Result<Option<Self>, BatchError> {
        let Some(mixed) = all_or_none(sites, path)? else { return Ok(None) };
        Ok(Some(RowMix { mix: BitMix::stacked(&mixed, path)?, ops }))
    }

    /// `Σ_i p[row, i] · Q_i(x)`, each row's probabilities `p` its op's row of `probs` (a
    /// [`CellBits`] tensor, `[edges·K, B]`): every width's column of the rows in one
    /// [`pick`] (one launch each way on the CubeCL runtimes); `view` is `x` seen as
    /// `[A, rows, B]`.
    pub(super) fn forward<const D: usize>(
        &self,
        x: Tensor<D>,
        probs: &Tensor<2>,
        view: [usize; 3],
        qp: QuantPass,
    ) -> Tensor<D> {
        self.mix.forward_rows(x, self.columns(probs), view, qp)
    }

    /// Each width's column of the rows' softmaxes in `probs` (`[edges·K, B]`), `[rows]` each,
    /// in one [`pick`].
    pub(super) fn columns(&self, probs: &Tensor<2>) -> Vec<Tensor<1>> {
        let [ops, widths] = probs.dims();
        let index: Vec<Vec<usize>> =
            (0..widths).map(|i| self.ops.iter().map(|&o| o * widths + i).collect()).collect();
        pick(probs.clone().reshape([ops * widths]), &index)
    }

    /// Row `r` into `site`'s mix, where it has one.
    pub(super) fn row_into(mix: &Option<RowMix>, r: usize, site: &Option<BitMix>) {
        if let (Some(all), Some(site)) = (mix, site) {
            all.mix.row_into(r, site);
        }
    }
}
