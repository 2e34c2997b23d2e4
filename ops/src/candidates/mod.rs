//! Quantized DARTS candidate ops (pt.darts semantics, one file each) and the mixed op.

mod bn;
mod common;
mod conv;
mod dil_conv;
mod fac_conv;
mod factorized_reduce;
mod identity;
mod mixed;
mod pool_bn;
mod sep_conv;
mod std_conv;
mod zero;

use burn::module::Module;
use burn::tensor::Device;
use qdarts_genotypes::Primitive;

pub use bn::QBatchNorm;
pub use bn::{quantize_bias, quantize_bias_with};
pub use common::{
    BitProbs, Ctx, OpBits, Pass, QTensor, QuantSites, check_quant_sites, quantize_opt,
    quantize_site, visited_quantizers,
};
pub use conv::{Bias, ConvChain, ConvShape, QConv};
pub use dil_conv::{DilShape, QDilConv};
pub use fac_conv::QFacConv;
pub use factorized_reduce::QFactorizedReduce;
pub use identity::QIdentity;
pub use mixed::{EdgeBits, QMixedOp, channel_shuffle};
pub use pool_bn::{PoolKind, QPoolBN};
pub use sep_conv::QSepConv;
pub use std_conv::QStdConv;
pub use zero::QZero;

use crate::qconfig::QuantConfig;
use crate::quant::{FakeQuantizer, SpecError};

/// One candidate op on a DARTS edge, built from a [`Primitive`].
// Ops are built once and stay in their mixed op's Vec; the variant size gap costs nothing there,
// while boxing would put every forward behind a pointer.
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum CandidateOp {
    /// `none`.
    Zero(QZero),
    /// `max_pool_3x3`, `avg_pool_3x3`.
    Pool(QPoolBN),
    /// `skip_connect` at stride 1.
    Identity(QIdentity),
    /// `skip_connect` at stride 2.
    Reduce(QFactorizedReduce),
    /// `sep_conv_3x3`, `sep_conv_5x5`.
    Sep(QSepConv),
    /// `dil_conv_3x3`, `dil_conv_5x5`.
    Dil(QDilConv),
    /// `conv_7x1_1x7`.
    Fac(QFacConv),
}

/// Multiply-accumulates and weights per image of one op.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OpCost {
    /// Multiply-accumulates per image.
    pub macs: u64,
    /// Conv weights.
    pub params: u64,
}

/// Whether `primitive` at `stride` has convolutions, whose weight and activation widths a
/// bit-width search chooses (skip_connect at stride 2 is a FactorizedReduce); pooling, identity
/// and none keep the config's widths.
pub fn has_bits(primitive: Primitive, stride: usize) -> bool {
    primitive.has_weights() || (primitive == Primitive::SkipConnect && stride > 1)
}

impl CandidateOp {
    /// The op for `primitive` on `c` channels at `stride`, with quantizers under `path`
    /// (e.g. `cells.3.edges.5.sep_conv_3x3`).
    pub fn new(
        primitive: Primitive,
        c: usize,
        stride: usize,
        affine: bool,
        cfg: &QuantConfig,
        path: &str,
        device: &Device,
    ) -> Result<Self, SpecError> {
        Self::with_bits(primitive, c, stride, affine, cfg, path, device, OpBits::Config)
    }

    /// [`new`](Self::new) at other bit widths; ops without convolutions ([`has_bits`]) keep
    /// the config's.
    #[allow(clippy::too_many_arguments)]
    pub fn with_bits(
        primitive: Primitive,
        c: usize,
        stride: usize,
        affine: bool,
        cfg: &QuantConfig,
        path: &str,
        device: &Device,
        bits: OpBits,
    ) -> Result<Self, SpecError> {
        let bits = if has_bits(primitive, stride) { bits } else { OpBits::Config };
        let ctx = Ctx::new(cfg, primitive.name(), path, device).with_bits(bits);
        let dil = |k: usize, padding: usize| DilShape {
            c_in: c,
            c_out: c,
            k,
            stride,
            padding,
            dilation: 2,
        };
        Ok(match primitive {
            Primitive::None => CandidateOp::Zero(QZero::new(stride, &ctx)?),
            Primitive::MaxPool3x3 => {
                CandidateOp::Pool(QPoolBN::new(PoolKind::Max, c, stride, affine, &ctx)?)
            }
            Primitive::AvgPool3x3 => {
                CandidateOp::Pool(QPoolBN::new(PoolKind::Avg, c, stride, affine, &ctx)?)
            }
            Primitive::SkipConnect if stride == 1 => {
                CandidateOp::Identity(QIdentity { path: path.to_string() })
            }
            Primitive::SkipConnect => {
                CandidateOp::Reduce(QFactorizedReduce::new(c, c, affine, &ctx)?)
            }
            Primitive::SepConv3x3 => {
                CandidateOp::Sep(QSepConv::new(c, c, 3, stride, affine, &ctx)?)
            }
            Primitive::SepConv5x5 => {
                CandidateOp::Sep(QSepConv::new(c, c, 5, stride, affine, &ctx)?)
            }
            Primitive::DilConv3x3 => CandidateOp::Dil(QDilConv::new(dil(3, 2), affine, &ctx)?),
            Primitive::DilConv5x5 => CandidateOp::Dil(QDilConv::new(dil(5, 4), affine, &ctx)?),
            Primitive::SepConv7x7 => {
                CandidateOp::Sep(QSepConv::new(c, c, 7, stride, affine, &ctx)?)
            }
            Primitive::Conv7x1_1x7 => {
                CandidateOp::Fac(QFacConv::new(c, c, 7, stride, 3, affine, &ctx)?)
            }
        })
    }

    /// # Shapes
    /// - x: `[N, C, H, W]`; output: `[N, C, H/s, W/s]`.
    pub fn forward(&self, x: QTensor) -> QTensor {
        self.forward_in(x, Pass::default())
    }

    /// [`forward`](Self::forward) in the pass `pass`: its held rounding, and the candidate
    /// widths of a bit-width search (ignored by ops without convolutions).
    pub fn forward_in(&self, x: QTensor, pass: Pass) -> QTensor {
        self.forward_shared(&x, &mut None, pass)
    }

    /// [`forward_in`](Self::forward_in) for a candidate of an edge whose candidates share
    /// `relued`, the ReLU of `x` computed by the first one that starts with it (as the
    /// separable, dilated and factorized convolutions do): the same values as
    /// [`forward_in`](Self::forward_in), one ReLU (and one ReLU backward) per edge rather
    /// than one per candidate, and one ReLU output kept for the backward.
    pub fn forward_shared(&self, x: &QTensor, relued: &mut Option<QTensor>, pass: Pass) -> QTensor {
        let mut relu = || relued.get_or_insert_with(|| x.clone().relu()).clone();
        match self {
            CandidateOp::Reduce(op) => op.forward_relued(relu(), pass),
            CandidateOp::Sep(op) => op.forward_relued(relu(), pass),
            CandidateOp::Dil(op) => op.forward_relued(relu(), pass),
            CandidateOp::Fac(op) => op.forward_relued(relu(), pass),
            CandidateOp::Zero(op) => op.forward_in(x.clone(), pass.quant),
            CandidateOp::Pool(op) => op.forward_in(x.clone(), pass.quant),
            CandidateOp::Identity(op) => op.forward(x.clone()),
        }
    }

    /// Multiply-accumulates (of its convolutions; pooling and BN are not counted) and conv
    /// weights per image on an `h×w` input.
    pub fn cost(&self, h: usize, w: usize) -> OpCost {
        let (macs, params) = match self {
            CandidateOp::Zero(_) | CandidateOp::Pool(_) | CandidateOp::Identity(_) => (0, 0),
            CandidateOp::Reduce(op) => (op.macs(h, w).0, op.params()),
            CandidateOp::Sep(op) => (op.macs(h, w).0, op.params()),
            CandidateOp::Dil(op) => (op.macs(h, w).0, op.params()),
            CandidateOp::Fac(op) => (op.macs(h, w).0, op.params()),
        };
        OpCost { macs, params }
    }
}

impl QuantSites for CandidateOp {
    fn quantizers(&self) -> Vec<&FakeQuantizer> {
        match self {
            CandidateOp::Zero(op) => op.quantizers(),
            CandidateOp::Pool(op) => op.quantizers(),
            CandidateOp::Identity(_) => vec![],
            CandidateOp::Reduce(op) => op.quantizers(),
            CandidateOp::Sep(op) => op.quantizers(),
            CandidateOp::Dil(op) => op.quantizers(),
            CandidateOp::Fac(op) => op.quantizers(),
        }
    }
}
