//! [`QuantPass`]: what the quantizers of one forward pass do besides quantizing, passed through
//! `forward` rather than set on the quantizers (so that nothing of one pass is seen by
//! another, or by a copy of the network).

use std::sync::atomic::{AtomicU64, Ordering};

use super::fake_quant::FakeQuantImpl;
use super::hold::Hold;
use super::stats::ErrorTape;

/// What the quantizers of one forward pass do besides quantizing: hold their rounding (the
/// second-order step's passes), record their error statistics on a tape, and which kernel
/// computes the fake quantization.
#[derive(Debug, Clone, Copy)]
pub struct QuantPass<'a> {
    /// What a quantizer does with its rounding.
    pub hold: Hold<'a>,
    /// Where a quantizer records the error of the tensor it quantizes (`None`: nowhere, and no
    /// reduction is spent on it).
    pub errors: Option<&'a ErrorTape>,
    /// How the fake quantization computes (fused where the backend has the kernels; both give
    /// the same values and gradients).
    pub imp: FakeQuantImpl,
}

impl QuantPass<'_> {
    /// A pass that holds nothing and records nothing, fused where the kernels run.
    pub const OFF: QuantPass<'static> =
        QuantPass { hold: Hold::Off, errors: None, imp: FakeQuantImpl::Fused };
}

impl Default for QuantPass<'_> {
    fn default() -> Self {
        QuantPass::OFF
    }
}

impl<'a> QuantPass<'a> {
    /// A pass holding its rounding as `hold` says.
    pub fn held(hold: Hold<'a>) -> Self {
        QuantPass { hold, ..QuantPass::OFF }
    }

    /// A pass recording each quantizer's error on `errors` (nowhere with `None`).
    pub fn recording(errors: Option<&'a ErrorTape>) -> Self {
        QuantPass { errors, ..QuantPass::OFF }
    }
}

/// Which quantizer a tape's entry belongs to: drawn once per quantizer and kept by its copies
/// (`clone`, `valid`, `train`, a mapper's new module), so that a recording made through one
/// copy is found through another, as the second-order step's passes at `w` and `w±` need.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SiteKey(u64);

impl SiteKey {
    /// A key no other quantizer of this process has.
    pub fn fresh() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        SiteKey(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}
