//! A quantizer's observer in one or two launches on the CubeCL backends: the extrema of the
//! tensor it sees (per tensor or per channel), its state update and the grid it derives.
//!
//! As tensor expressions an observer is a few dozen launches per training forward on a GPU: a
//! moving-average min/max observer of one activation is two split row reductions (slices,
//! reshapes, partial and tail reductions, pair maxima), the moving average (`is_inf`, four
//! arithmetic ops and a select per bound), torch.ao's `calculate_qparams` (each clamp a compare
//! and a fill) and the grid (`clamp`, `recip`); a quantized search step runs hundreds of them,
//! about half of its launches (`docs/results/2026-11-27-launches.md`). Here the extrema are one pass: one cube per row reads it
//! where it lies (through its strides), or, for rows longer than [`CHUNK`], one cube per
//! chunk writes the chunk's extrema and one cube per row combines them; the cube that finishes
//! a row also updates the state and writes the grid.
//!
//! [`observe_fake_quant`] also fake-quantizes the tensor on the grid it derives, in the same
//! launches: one kernel for rows up to [`CHUNK`] (a conv weight's output channel), and for longer
//! rows the chunk kernel, then one cube per chunk that combines the row's chunk extrema (every
//! cube of the row the same ones in the same order, so the same grid), updates the state (the
//! row's first cube writes it) and quantizes its chunk; rows of more than 1 024 chunks, whose
//! every cube would read that many extrema, quantize in a launch of their own. A quantizer's
//! training forward is then one or two launches instead of two or three; the values and the
//! straight-through gradient are [`crate::fake_quant`]'s, bit for bit.
//!
//! Per tensor, where the gradient is recorded, the same launch also writes a clip mask, one bit
//! per element (set where the element rounds outside the integer range), and the backward
//! masks the upstream gradient with it: the step keeps 1/32 of the input instead of the input
//! itself. A quantizer's input (a BatchNorm's or a convolution's output) is usually kept by
//! nothing else, so on a DARTS supernet, whose activation quantizers see about a dozen tensors
//! per edge, this is most of what fake quantization adds to a step's memory. A signed abs-max
//! grid on the tensor itself clips nothing and keeps nothing ([`passes_every_gradient`]).
//!
//! The arithmetic is the expressions' (`qdarts_ops::quant::observer`), operation for operation
//! in f32, so flex, LibTorch and the kernels give the same grids; `tests/observe.rs` in
//! `qdarts-ops` holds them together. Minimum and maximum are exact in any order; a NaN in the
//! tensor makes both extrema NaN (as `torch.aminmax`). On CUDA a moving average's `a·r + b` may
//! be contracted into one fused multiply-add: its last bit may then differ from the
//! expressions'.

use burn::tensor::{DType, Device, Tensor};

/// Smallest scale (step or threshold) a quantizer uses, as torch's observers do
/// (`torch.finfo(torch.float32).eps`). It keeps all-zero tensors finite: their output is 0.
pub const MIN_SCALE: f32 = f32::EPSILON;

/// How an observer folds the extrema `(m, M)` of the tensor it sees into its per-channel state
/// `(a, b)`; the state after the update is returned as [`Observed::state`] `[a, b, T]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rule {
    /// The tensor's own abs-max `T = max(|m|, |M|)`, no memory (Paddle's `abs_max` and
    /// `channel_wise_abs_max`): `a = b = T`.
    AbsMax,
    /// Paddle's `moving_average_abs_max`: `a ← a·rate + 1`, `b ← b·rate + T_x`, `T = b/a`.
    MovingAverageAbsMax {
        /// Moving rate.
        rate: f32,
    },
    /// torch.ao's `MinMaxObserver`: `a ← min(a, m)`, `b ← max(b, M)`; `T` is 0.
    MinMax,
    /// torch.ao's `MovingAverageMinMaxObserver`: `a ← a + (m − a)·c` and `b ← b + (M − b)·c`,
    /// or `(m, M)` while `a` is infinite (the first tensor); `T` is 0.
    MovingAverageMinMax {
        /// Averaging constant `c`.
        averaging_constant: f32,
    },
    /// No update (an observer in eval mode, or frozen): the stored state as it is, the
    /// threshold `T = a` for a threshold grid (`b` is not read), the min and max `(a, b)` for a
    /// min/max grid. The tensor is not read for the grid; it is still fake-quantized by
    /// [`observe_fake_quant`].
    Stored,
}

impl Rule {
    /// Whether the rule keeps an abs-max threshold (and so pairs with [`GridRule::Threshold`]).
    pub fn is_abs_max(self) -> bool {
        matches!(self, Rule::AbsMax | Rule::MovingAverageAbsMax { .. })
    }

    /// Whether the rule derives a `grid` ([`Rule::Stored`] pairs with either).
    pub fn pairs_with(self, grid: GridRule) -> bool {
        self == Rule::Stored || self.is_abs_max() == matches!(grid, GridRule::Threshold { .. })
    }
}

/// Whether fake quantization on the grid that `rule` and `grid` derive from a tensor passes
/// every element of that same tensor inside `qmin..=qmax`, so that its straight-through
/// gradient is the upstream gradient unchanged: an abs-max rule on the tensor itself
/// ([`Rule::AbsMax`]) with a threshold grid whose range holds `−bin_cnt..=bin_cnt` (a signed
/// one; an unsigned grid clips the negative values).
///
/// Why: with `T = max|x|` (clamped up to [`MIN_SCALE`], which only shrinks `|x|/T`) and
/// `mult = (1/T)·b`, every `|x·mult| ≤ T·mult ≤ b·(1 + 2.5u)(1 + u)(1 + u)` for the f32 unit
/// roundoff `u` (the reciprocal allowed Vulkan's 2.5 ulps), below `b + ½` for any `b < 2²⁰`: it
/// rounds to at most `b` in magnitude. A NaN or infinite `x` makes `x·mult` NaN, which the
/// backward does not clip either.
pub fn passes_every_gradient(rule: Rule, grid: GridRule, (qmin, qmax): (i32, i32)) -> bool {
    match (rule, grid) {
        (Rule::AbsMax, GridRule::Threshold { bin_cnt }) => {
            qmin <= -bin_cnt && bin_cnt <= qmax && bin_cnt < 1 << 20
        }
        _ => false,
    }
}

/// The grid an observer derives from its state.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum GridRule {
    /// Paddle's symmetric grid from the threshold: `T' = max(T, MIN_SCALE)`,
    /// `mult = (1/T')·bin_cnt`, `step = T'/bin_cnt`, zero point 0.
    Threshold {
        /// Paddle's `bin_cnt`.
        bin_cnt: i32,
    },
    /// torch.ao's `_calculate_qparams` from the state's `(a, b)` = (min, max) on the integers
    /// `qmin..=qmax`, then `step = max(scale, MIN_SCALE)`, `mult = 1/step`.
    MinMax {
        /// Smallest integer.
        qmin: i32,
        /// Largest integer.
        qmax: i32,
        /// Symmetric (`scale = max(−min⁻, max⁺)/((qmax − qmin)/2)`), else affine.
        symmetric: bool,
        /// The symmetric grid's zero point (0 signed, `(qmin + qmax + 1)/2` unsigned).
        zero_point: f32,
    },
}

/// The state after an update and the grid, each `[C]` (`[1]` per tensor).
#[derive(Debug, Clone)]
pub struct Observed {
    /// `[a, b, T]` (see [`Rule`]).
    pub state: [Tensor<1>; 3],
    /// Multiplier applied to `x` before rounding.
    pub mult: Tensor<1>,
    /// Dequantization step.
    pub step: Tensor<1>,
    /// Zero point, an integer held in f32.
    pub zero_point: Tensor<1>,
}

/// Whether [`observe`] runs on tensors on `device` with this dtype: the CubeCL backends, f32.
pub fn observe_available(device: &Device, dtype: DType) -> bool {
    crate::support::on_cube(device) && dtype == DType::F32
}

/// The panics of [`observe`] and [`observe_fake_quant`].
fn check<const D: usize>(x: &Tensor<D>, axis: Option<usize>, rule: Rule, grid: GridRule) {
    assert!(
        observe_available(&x.device(), x.dtype()),
        "observe: not available on {:?} for {:?}",
        x.device(),
        x.dtype()
    );
    assert!(rule.pairs_with(grid), "observe: {rule:?} does not derive a {grid:?} grid");
    if let Some(a) = axis {
        assert!(a < D, "observe: axis {a} of a rank-{D} tensor");
    }
}

/// Observes `x` (not differentiated) per channel along `axis` (`None`: per tensor) with the
/// state `(a, b)` (each `[C]`; read only by the rules with memory): the updated state and the
/// grid. The outputs use autodiff where `x` does.
///
/// # Panics
/// Where [`observe_available`] is false, where `rule` and `grid` do not pair (an abs-max rule
/// takes a threshold grid, a min/max rule a min/max grid), or where `axis` is not a dimension
/// of `x`.
pub fn observe<const D: usize>(
    x: Tensor<D>,
    axis: Option<usize>,
    state: [Tensor<1>; 2],
    rule: Rule,
    grid: GridRule,
) -> Observed {
    check(&x, axis, rule, grid);
    #[cfg(feature = "cube")]
    {
        let autodiff = x.is_autodiff();
        let [a, b] = state;
        let (s0, s1, s2, mult, step, zp) = <burn::backend::Dispatch as ObserveBackend>::observe(
            x.inner().into_dispatch(),
            a.inner().into_dispatch(),
            b.inner().into_dispatch(),
            axis.unwrap_or(D),
            rule,
            grid,
        );
        let out = |t| {
            let t = Tensor::<1>::from_dispatch(t);
            if autodiff { t.autodiff() } else { t }
        };
        Observed {
            state: [out(s0), out(s1), out(s2)],
            mult: out(mult),
            step: out(step),
            zero_point: out(zp),
        }
    }
    #[cfg(not(feature = "cube"))]
    unreachable!("observe_available is false without the CubeCL backends: {state:?}")
}

/// [`observe`] and the fake quantization of `x` on the grid it derives, with the
/// straight-through gradient of [`crate::fake_quant::fake_quant_fused`] (`∂x = ∂out` where `x`
/// rounds inside `qmin..=qmax`): one launch fewer than the two calls (as many for rows of
/// more than 1 024 chunks, see the module docs), the same bits. The grid
/// is the one [`observe`] returns (its outputs are constants, as the fused fake quantization
/// takes them); the output is contiguous. Where [`passes_every_gradient`], the backward is the
/// upstream gradient itself, without a launch.
///
/// `(qmin, qmax)` is the grid's integer range (a threshold grid does not hold it) and
/// `ties_away` its rounding.
///
/// # Panics
/// As [`observe`].
#[allow(clippy::too_many_arguments)]
pub fn observe_fake_quant<const D: usize>(
    x: Tensor<D>,
    axis: Option<usize>,
    state: [Tensor<1>; 2],
    rule: Rule,
    grid: GridRule,
    (qmin, qmax): (i32, i32),
    ties_away: bool,
) -> (Observed, Tensor<D>) {
    check(&x, axis, rule, grid);
    #[cfg(feature = "cube")]
    {
        let layout = crate::fake_quant::FusedLayout::new(&x.dims(), axis, qmin, qmax, ties_away);
        let [a, b] = state;
        // The state is a constant of the step (the grid's outputs are not tracked), on `x`'s
        // side of autodiff.
        let (a, b) = (a.detach(), b.detach());
        let (a, b) = match (x.is_autodiff(), a.is_autodiff()) {
            (true, false) => (a.autodiff(), b.autodiff()),
            (false, true) => (a.inner(), b.inner()),
            _ => (a, b),
        };
        let (s0, s1, s2, mult, step, zp, out) =
            <burn::backend::Dispatch as ObserveBackend>::observe_fake_quant(
                x.into_dispatch(),
                a.into_dispatch(),
                b.into_dispatch(),
                axis.unwrap_or(D),
                rule,
                grid,
                layout,
            );
        let out1 = Tensor::<1>::from_dispatch;
        let observed = Observed {
            state: [out1(s0), out1(s1), out1(s2)],
            mult: out1(mult),
            step: out1(step),
            zero_point: out1(zp),
        };
        (observed, Tensor::from_dispatch(out))
    }
    #[cfg(not(feature = "cube"))]
    unreachable!(
        "observe_available is false without the CubeCL backends: {state:?} {qmin}..{qmax} {ties_away}"
    )
}

#[cfg(feature = "cube")]
pub(crate) use extension::MaskBackend;
#[cfg(feature = "cube")]
pub use extension::ObserveBackend;

/// Elements one cube reduces in the first stage of a long row (16 per unit).
pub const CHUNK: usize = 4096;

#[cfg(feature = "cube")]
mod cube;

mod many;

#[cfg(feature = "cube")]
pub use many::ManyBackend;
pub use many::{many_available, observe_fake_quant_many};

#[cfg(feature = "cube")]
mod extension;
