//! A wave's convolutional candidates as one bank: every separable and dilated kind of the wave
//! in one chain of launches per stage on the CubeCL runtimes.
//!
//! A stage (ReLU – depthwise – 1×1 – BN) holds every kind's weights side by side, kind after
//! kind and, within a kind, edge after edge:
//!
//! - depthwise filters, one tensor per dilation: the kinds of one dilation zero-padded to the
//!   largest kernel among them (sep 3×3 as a 5×5 whose outer ring is zero, dil 3×3 beside dil
//!   5×5 at dilation 2), so that one launch convolves them all; a mask on their gradient keeps
//!   the padding's gradient at zero, so the padding stays zero through every optimizer step;
//! - 1×1 weights of every kind, one convolution in `kinds·E` groups;
//! - one BatchNorm of every kind's channels (each channel its own statistics, as before).
//!
//! On flex, where a launch costs nothing and a copy costs memory traffic, each kind runs on
//! its own slices of the same weights (its filters without the padding): the per-kind chain
//! the first form ran, with its values bit for bit. On the CubeCL runtimes the padding's taps
//! add zeros; what else changes is how the merged launches split their sums, so the values are
//! the per-kind chain's within float rounding (`tests/wgpu.rs` holds a two-step search in
//! waves on wgpu to flex's per-edge losses, and the parity fixtures to PyTorch).
//!
//! The separable kinds come first, so that their second stage reads the first `S·E·C`
//! channels of the first stage's output.

use std::ops::Range;

use burn::module::Module;
use burn::tensor::Tensor;
use qdarts_kernels::direct_conv::{GroupInputs, direct_available};
use qdarts_kernels::relu::relu;
use qdarts_kernels::split::split;
use qdarts_ops::candidates::Pass;
use qdarts_ops::quant::hold::{narrow_channels, relu_held};
use qdarts_ops::quant::{FakeQuantizer, Grid, QuantPass};

mod stage;
mod weights;

use super::BatchError;
use super::bits::{CellBits, RowMix};
pub use stage::BankStage;
use weights::weights_now;

/// One convolutional kind of a stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BankKind {
    /// Its candidate's index among the cell's primitives.
    pub primitive: usize,
    /// Kernel size `k` (square).
    pub kernel: usize,
    /// Dilation.
    pub dilation: usize,
    /// Padding (each side).
    pub padding: usize,
}

/// The kinds of a stage that share a dilation, convolved in one launch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DwGroup {
    /// Their positions among the stage's kinds.
    pub kinds: Range<usize>,
    /// The largest kernel among them, the size every filter of the group is padded to.
    pub kernel: usize,
    /// Their dilation.
    pub dilation: usize,
    /// The padding of the padded filters.
    pub padding: usize,
}

/// A stage's quantizers, each standing for every (kind, edge) of the stage as one row
/// ([`FakeQuantizer::stacked`]): numerically each edge's own (its observer state, its
/// rounding, its straight-through gradient).
#[derive(Module, Debug)]
pub struct StageQuant {
    /// Depthwise weights, per dilation group (per output channel; empty in a float cell).
    pub dw: Vec<FakeQuantizer>,
    /// Depthwise outputs (per tensor of each edge).
    pub dw_act: Option<FakeQuantizer>,
    /// 1×1 weights (per output channel).
    pub pw: Option<FakeQuantizer>,
    /// Outputs (per tensor of each edge).
    pub act: Option<FakeQuantizer>,
}

/// A stage's mixes under a bit-width search ([`RowMix`]), each standing for every (kind, edge)
/// of the stage as one row (empty and none otherwise): the quantizers they mix are the
/// sites' own at each candidate width.
#[derive(Module, Debug)]
pub struct StageMixes {
    /// Depthwise weights, per dilation group.
    pub dw: Vec<RowMix>,
    /// Depthwise outputs.
    pub dw_act: Option<RowMix>,
    /// 1×1 weights.
    pub pw: Option<RowMix>,
    /// Outputs.
    pub act: Option<RowMix>,
}

/// [`quantize_rows`], or where the pass mixes widths and `mix` is there, the mix of every
/// row's quantizers at its op's activation widths (no single grid then).
pub(super) fn quantize_or_mix(
    (q, mix): (&Option<FakeQuantizer>, &Option<RowMix>),
    x: Tensor<4>,
    pass: Pass<CellBits>,
) -> (Tensor<4>, Option<Grid>) {
    match (mix, pass.bits) {
        (Some(m), Some(bits)) => {
            let [n, c, h, w] = x.dims();
            let view = [n, m.ops.len(), c / m.ops.len() * h * w];
            (m.forward(x.reshape(view), &bits.act, view, pass.quant).reshape([n, c, h, w]), None)
        }
        _ => quantize_rows(q, x, pass.quant),
    }
}

/// A stacked quantizer of `sites`: none where every site is float.
///
/// # Errors
/// Where some sites are quantized and others not, or they do not stack.
pub(super) fn stack_sites(
    sites: Vec<Option<&FakeQuantizer>>,
    path: &str,
) -> Result<Option<FakeQuantizer>, BatchError> {
    let Some(quantized) = all_or_none(sites, path)? else { return Ok(None) };
    Ok(Some(FakeQuantizer::stacked(&quantized, path)?))
}

/// Every site's `T`, where all have one; none where none has.
///
/// # Errors
/// Where some have one and others not (`path` names them).
pub(super) fn all_or_none<'a, T>(
    sites: Vec<Option<&'a T>>,
    path: &str,
) -> Result<Option<Vec<&'a T>>, BatchError> {
    let present: Vec<&T> = sites.iter().flatten().copied().collect();
    match present.len() {
        0 => Ok(None),
        n if n < sites.len() => Err(BatchError::Quantizers(path.to_string())),
        _ => Ok(Some(present)),
    }
}

/// A stacked quantizer of `rows` per-tensor sites applied to `x` `[N, rows·C, H, W]`, the
/// output and its grid (over the rows, one per site: each row's value stands for its `C`
/// channels), in the quantizer pass `qp`.
pub(super) fn quantize_rows(
    q: &Option<FakeQuantizer>,
    x: Tensor<4>,
    qp: QuantPass,
) -> (Tensor<4>, Option<Grid>) {
    let Some(q) = q else { return (x, None) };
    let [n, c, h, w] = x.dims();
    let rows = q.rows().len();
    let (y, grid) = q.forward_in(x.reshape([n, rows, c / rows * h * w]), qp);
    (y.reshape([n, c, h, w]), Some(grid))
}

/// A wave's separable and dilated candidates: their first stages, and the separable kinds'
/// second.
#[derive(Module, Debug)]
pub struct ConvBank {
    /// The first stage of every kind (a separable conv's `op1`, a dilated conv's only one).
    pub first: BankStage,
    /// The second stage of the separable kinds (`op2`), the first `seps` of `first`'s kinds.
    pub second: Option<BankStage>,
}

/// What a merged stage reads; with `relu`, its ReLU, which the convolutions take as they read.
enum Input {
    /// The wave's sources, which every kind and edge reads: `per` edges from each.
    Sources { x: Tensor<4>, per: usize, relu: bool },
    /// Each kind's own input, side by side.
    Kinds { x: Tensor<4>, relu: bool },
}

/// The wave's sources `[N, S·C, H, W]` as a bank takes them: before the ReLU that every
/// convolutional candidate starts with (its convolutions then take it as they read), or after.
#[derive(Debug)]
pub enum Sources {
    /// Before the ReLU (the CubeCL runtimes, on a grid not held at `w`).
    BeforeRelu(Tensor<4>),
    /// After it.
    AfterRelu(Tensor<4>),
}

impl Sources {
    /// The sources after the ReLU.
    fn after_relu(self) -> Tensor<4> {
        match self {
            Sources::BeforeRelu(x) => relu(x),
            Sources::AfterRelu(x) => x,
        }
    }
}

/// `x` `[N, S·C, H, W]` (after the ReLU) as every edge's input, `copies` times over:
/// `[N, copies·S·per·C, H, W]`, copy after copy, edge after edge (edges source by source).
pub fn stack_sources(x: &Tensor<4>, sources: usize, per: usize, copies: usize) -> Tensor<4> {
    let inner = x.dims()[1] / sources;
    GroupInputs { sources, per, inner }.laid_out(x.clone(), copies * sources * per * inner)
}

impl ConvBank {
    /// Every kind's output on the wave's sources `x` `[N, S·C, H, W]` after the ReLU (`per`
    /// edges from each), as columns of the node sums: tensors `[N, kinds·E, C·H'·W']` whose
    /// kinds, in order, are the bank's (separable first); and the shape of one node,
    /// `[N, C, H', W']`. `pass`: what the quantizers do besides quantizing, and under a
    /// bit-width search the cell's softmaxes over the widths.
    pub fn forward(
        &self,
        x: Sources,
        per: usize,
        pass: Pass<CellBits>,
    ) -> (Vec<Tensor<3>>, [usize; 4]) {
        let (Sources::BeforeRelu(t) | Sources::AfterRelu(t)) = &x;
        let merged = direct_available(&t.device(), t.dtype());
        let sources = t.dims()[1] / self.first.channels;
        let seps = self.second.as_ref().map_or(0, |s| s.kinds.len());
        let (width, c) = (self.first.width(), self.first.channels);
        let stages: Vec<&BankStage> = std::iter::once(&self.first).chain(&self.second).collect();
        let mut weights = weights_now(&stages, pass).into_iter();
        let mut weights = move || weights.next().expect("weights per stage");
        if merged || self.first.quantized() {
            // Every kind's channels side by side after the depthwise convolutions: one chain
            // per stage on the CubeCL runtimes; on flex (a quantized cell) the depthwise
            // convolutions kind by kind.
            let y = match (merged, x) {
                (true, Sources::BeforeRelu(x)) => {
                    self.first.forward_merged(Input::Sources { x, per, relu: true }, weights())
                }
                (true, Sources::AfterRelu(x)) => {
                    self.first.forward_merged(Input::Sources { x, per, relu: false }, weights())
                }
                (false, x) => {
                    let x = [stack_sources(&x.after_relu(), sources, per, 1)];
                    self.first.forward_per_kind(&x, weights()).remove(0)
                }
            };
            let dims = y.dims();
            let [n, _, h, w] = dims;
            let columns = |t: Tensor<4>| {
                let cols = t.dims()[1] / c;
                t.reshape([n, cols, c * h * w])
            };
            let Some(second) = &self.second else { return (vec![columns(y.value)], [n, c, h, w]) };
            // The second stage starts with a ReLU of the first's output, on its grid; the
            // kinds without one (dilated) are done. The cut is a split (one backward) of the
            // output laid flat, `[N, kinds·E·C·H·W]`, so that each part takes its next shape as
            // a view (cut along the channels, the dilated kinds' columns would be a copy).
            let sep_grid = narrow_channels(y.grid.as_ref(), dims, 0, seps * width);
            let kinds = self.first.kinds.len();
            let plane = h * w;
            let sizes = [seps * width * plane, (kinds - seps) * width * plane];
            let flat = y.value.reshape([n, kinds * width * plane]);
            let mut parts = split(flat, 1, &sizes[..if kinds > seps { 2 } else { 1 }]).into_iter();
            let sep_out = parts.next().expect("a bank with a second stage has separable kinds");
            let sep_out = sep_out.reshape([n, seps * width, h, w]);
            let held = sep_grid.as_ref().is_some_and(|g| g.is_held());
            let z = match merged {
                // The second stage's convolutions take the ReLU as they read.
                true if !held => {
                    second.forward_merged(Input::Kinds { x: sep_out, relu: true }, weights())
                }
                true => {
                    let x = relu_held(sep_out, sep_grid.as_ref());
                    second.forward_merged(Input::Kinds { x, relu: false }, weights())
                }
                false => {
                    let sep_in = relu_held(sep_out, sep_grid.as_ref());
                    let xs = split(sep_in, 1, &vec![width; seps]);
                    second.forward_per_kind(&xs, weights()).remove(0)
                }
            };
            let mut out = vec![columns(z.value)];
            out.extend(parts.map(|t| t.reshape([n, (kinds - seps) * width / c, c * plane])));
            return (out, [n, c, h, w]);
        }
        // Kind by kind.
        let x = [stack_sources(&x.after_relu(), sources, per, 1)];
        let mut ys = self.first.forward_per_kind(&x, weights());
        if let Some(second) = &self.second {
            let sep_in: Vec<Tensor<4>> = ys.drain(..seps).map(|y| relu(y.value)).collect();
            ys.splice(0..0, second.forward_per_kind(&sep_in, weights()));
        }
        let [n, _, h, w] = ys[0].dims();
        let out = ys.into_iter().map(|t| t.value.reshape([n, width / c, c * h * w])).collect();
        (out, [n, c, h, w])
    }

    /// The primitives of the bank's kinds, in its order.
    pub fn primitives(&self) -> Vec<usize> {
        self.first.kinds.iter().map(|k| k.primitive).collect()
    }
}
