//! A bank's weights as its convolutions take them: masked where padded, fake-quantized in
//! one launch for several sites, or mixed at a bit-width search's widths.

use burn::tensor::Tensor;
use qdarts_kernels::grad_mask::masked_gradient;
use qdarts_ops::candidates::Pass;
use qdarts_ops::quant::{BitMix, FakeQuantizer, Grid};

use super::super::bits::{CellBits, RowMix};
use super::BankStage;

/// A stage's weights as its convolutions use them (see [`weights_now`]), and the pass they
/// were taken in (its quantizers' held rounding, a bit-width search's softmaxes).
pub(super) struct StageWeights<'a> {
    /// The pass.
    pub pass: Pass<'a, CellBits>,
    /// Each dilation group's depthwise filters.
    pub filters: Vec<Tensor<4>>,
    /// The 1×1 weights, and their grid where quantized.
    pub pw: (Tensor<4>, Option<Grid>),
}

/// A weight as it is, the index of its quantizer's site in [`weights_now`], or under a
/// bit-width search the first of its widths' sites there and how they mix.
enum Site {
    Raw(Box<Tensor<4>>),
    Quantized(usize),
    Mixed { first: usize, columns: Vec<Tensor<1>>, view: [usize; 3] },
}

impl Site {
    /// `w` as it is without a quantizer, else a site of `sites`.
    fn of<'a>(
        sites: &mut Vec<(&'a FakeQuantizer, Tensor<4>)>,
        q: Option<&'a FakeQuantizer>,
        w: Tensor<4>,
    ) -> Site {
        match q {
            Some(q) => {
                sites.push((q, w));
                Site::Quantized(sites.len() - 1)
            }
            None => Site::Raw(Box::new(w)),
        }
    }
}

/// The weights of `stages` as their convolutions use them: the depthwise filters' gradient
/// masked where padded (so that the padding, zero from the start, has no gradient and stays
/// zero) unless the convolution skips the padding, every weight fake-quantized where its stage is quantized, all the stages' weight
/// quantizers in one [`FakeQuantizer::forward_many`] (on the CubeCL runtimes one launch for
/// up to eight of them instead of one each); under a bit-width search each weight the mix of
/// its rows' quantizers at their ops' widths (EdMIPS' composite convolution).
pub(super) fn weights_now<'a, 'b>(
    stages: &[&'b BankStage],
    pass: Pass<'a, CellBits>,
) -> Vec<StageWeights<'a>> {
    let qp = pass.quant;
    let mut sites: Vec<(&'b FakeQuantizer, Tensor<4>)> = Vec::new();
    let mut plan = Vec::with_capacity(stages.len());
    // A weight `w` as its quantizer `q` or its mix `m` (every width's quantizer a site of the
    // one launch) takes it.
    let mut site =
        |q: Option<&'b FakeQuantizer>, m: Option<&'b RowMix>, w: Tensor<4>| match (m, pass.bits) {
            (Some(m), Some(bits)) => {
                let rows = m.ops.len();
                let view = [1, rows, w.shape().num_elements() / rows];
                let first = sites.len();
                sites.extend(m.mix.quantizers.iter().map(|q| (q, w.clone())));
                Site::Mixed { first, columns: m.columns(&bits.weight), view }
            }
            _ => Site::of(&mut sites, q, w),
        };
    for stage in stages {
        let groups = stage.groups.iter().zip(&stage.dw).enumerate();
        let filters: Vec<Site> = groups
            .map(|(i, (g, dw))| {
                let mask = (!stage.skips_padding(g, &dw.val())).then(|| stage.mask(g));
                let filters = match mask.flatten() {
                    Some(mask) => masked_gradient(dw.val(), mask),
                    None => dw.val(),
                };
                site(stage.quant.dw.get(i), stage.mixes.dw.get(i), filters)
            })
            .collect();
        let pw = site(stage.quant.pw.as_ref(), stage.mixes.pw.as_ref(), stage.pw.val());
        plan.push((filters, pw));
    }
    let mut done: Vec<Option<(Tensor<4>, Grid)>> =
        FakeQuantizer::forward_many(sites, qp).into_iter().map(Some).collect();
    let mut take = |s: Site| match s {
        Site::Raw(w) => (*w, None),
        Site::Quantized(i) => {
            let (w, grid) = done[i].take().expect("each site is taken once");
            (w, Some(grid))
        }
        // EdMIPS' composite weight: no single grid.
        Site::Mixed { first, columns, view } => {
            let ys = (first..first + columns.len())
                .map(|i| done[i].take().expect("each site is taken once").0)
                .collect();
            (BitMix::mix_rows(ys, columns, view), None)
        }
    };
    plan.into_iter()
        .map(|(filters, pw)| StageWeights {
            pass,
            filters: filters.into_iter().map(|f| take(f).0).collect(),
            pw: take(pw),
        })
        .collect()
}
