//! Fake quantization as composite tensor math: quantize → dequantize with a straight-through
//! gradient, on every backend; and the switch to the fused kernel of
//! [`qdarts_kernels::fake_quant`] where a backend has it, which gives the same bits.
//!
//! The value path is plain f32 tensor math in the same evaluation order as the references, so
//! that integers agree exactly at rounding ties:
//!
//! - torch: `q = clamp(nearbyint(x · (1/s)) + z, qmin, qmax)`, `out = (q − z) · s`;
//! - Paddle: `q = clamp(rint((bin_cnt · (1/T)) · x), −bin_cnt−1, bin_cnt)`, `out = q · T/bin_cnt`.
//!
//! Both are `q = clamp(round(x · mult) + z)`, `out = (q − z) · step` with a per-convention
//! `mult` (see [`Grid`]). Gradients are added as terms whose value is exactly zero
//! (`a − a.detach()`), so the forward value is bit-identical to the quantized value while autodiff
//! sees the straight-through estimator:
//!
//! - `∂out/∂x = 1` where the rounded value lies in `[qmin, qmax]`, else 0;
//! - LSQ (torch `_fake_quantize_learnable_per_tensor_affine`): `∂out/∂s = (q − z) − x/s` inside,
//!   `qmin − z` / `qmax − z` outside; `∂out/∂z = 0` inside, `−s` outside; both times the
//!   gradient factor `g = 1/sqrt(N·Qp)`.

use burn::tensor::{Bool, Tensor};
pub use qdarts_kernels::fake_quant::fused_available;
use qdarts_kernels::fake_quant::{self as kernels, FusedLayout};
use qdarts_kernels::quant_sum::quant_sum_available;

use super::spec::RoundMode;

/// Smallest scale (step or threshold) a quantizer will use, as torch's observers do
/// (`torch.finfo(torch.float32).eps`). It keeps all-zero tensors finite: their output is 0.
pub const MIN_SCALE: f32 = qdarts_kernels::observe::MIN_SCALE;

/// Quantization grid parameters, per tensor (`[1]`) or per channel (`[C]` along `axis`).
#[derive(Debug, Clone)]
pub struct Grid {
    /// Multiplier applied to `x` before rounding (`1/s` for torch, `bin_cnt·(1/T)` for Paddle).
    pub mult: Tensor<1>,
    /// Dequantization step: the value of one integer unit (torch's `scale`).
    pub step: Tensor<1>,
    /// Zero point, an integer held in f32.
    pub zero_point: Tensor<1>,
    /// Smallest integer.
    pub qmin: i32,
    /// Largest integer.
    pub qmax: i32,
    /// Rounding at ties.
    pub round: RoundMode,
    /// Channel axis of per-channel parameters.
    pub axis: Option<usize>,
    /// On the grid of a quantizer whose rounding is held (see [`super::hold`]), the values of
    /// the tensor it came with as they were at `w` (flattened): the roundings that follow from
    /// it (an integer average, an int32 bias) are left out, so that the held network is the
    /// straight-through surrogate throughout, and the ReLU and max pooling that read it keep
    /// the choices they made at `w` ([`super::hold::relu_held`],
    /// [`super::hold::max_pool2d_held`]). `None` on every other grid.
    pub held: Option<Tensor<1>>,
}

impl Grid {
    /// A grid from its multiplier, step and zero point (not held).
    pub fn new(
        [mult, step, zero_point]: [Tensor<1>; 3],
        (qmin, qmax): (i32, i32),
        round: RoundMode,
        axis: Option<usize>,
    ) -> Self {
        Grid { mult, step, zero_point, qmin, qmax, round, axis, held: None }
    }

    /// Whether this is the grid of a held quantizer ([`Grid::held`]).
    pub fn is_held(&self) -> bool {
        self.held.is_some()
    }

    /// A torch-style grid from a step (scale) and a zero point.
    pub fn from_step(
        step: Tensor<1>,
        zero_point: Tensor<1>,
        range: (i32, i32),
        round: RoundMode,
        axis: Option<usize>,
    ) -> Self {
        let step = step.clamp_min(MIN_SCALE);
        Grid::new([step.clone().recip(), step, zero_point], range, round, axis)
    }

    /// A Paddle-style symmetric grid from an abs-max threshold `T` and `bin_cnt`.
    pub fn from_threshold(
        threshold: Tensor<1>,
        bin_cnt: i32,
        range: (i32, i32),
        round: RoundMode,
        axis: Option<usize>,
    ) -> Self {
        let t = threshold.clamp_min(MIN_SCALE);
        let b = bin_cnt as f32;
        let zero_point = t.zeros_like();
        Grid::new(
            [t.clone().recip().mul_scalar(b), t.div_scalar(b), zero_point],
            range,
            round,
            axis,
        )
    }
}

/// Rounds to integers with the given tie rule.
pub fn round_with<const D: usize>(v: Tensor<D>, mode: RoundMode) -> Tensor<D> {
    match mode {
        RoundMode::TiesToEven => v.round(),
        RoundMode::TiesAwayFromZero => {
            // trunc(v) + sign(v) where |frac| >= 0.5; v - trunc(v) is exact in f32, so no
            // `floor(|v| + 0.5)` double rounding (0.49999997 + 0.5 rounds up to 1 in f32).
            let t = v.clone().trunc();
            let frac = v.clone().sub(t.clone()).abs();
            let up = frac.greater_equal_elem(0.5);
            t.clone().mask_where(up, t.add(v.sign()))
        }
    }
}

/// Splits f32 values into a high part with 12 significant bits and an exact remainder
/// (Veltkamp): `v = hi + lo` exactly.
fn veltkamp_split(v: Tensor<1>) -> (Tensor<1>, Tensor<1>) {
    let c = v.clone().mul_scalar(4097.0);
    let hi = c.clone().sub(c.sub(v.clone()));
    let lo = v.sub(hi.clone());
    (hi, lo)
}

/// Reshapes a `[1]` or `[C]` parameter so it broadcasts against a rank-`D` tensor.
pub fn broadcast_param<const D: usize>(p: Tensor<1>, axis: Option<usize>) -> Tensor<D> {
    let mut dims = [1usize; D];
    if let Some(a) = axis {
        dims[a] = p.dims()[0];
    }
    p.reshape(dims)
}

/// Integers of a quantized tensor (held in f32) and the in-range mask of the unclamped values.
#[derive(Debug, Clone)]
pub struct Quantized<const D: usize> {
    /// Clamped integers, as f32.
    pub q: Tensor<D>,
    /// Where the rounded value was already inside `[qmin, qmax]`.
    pub in_range: Tensor<D, Bool>,
    /// Where the rounded value was below `qmin`.
    pub below: Tensor<D, Bool>,
}

/// Quantizes `x` on `grid` (no gradient).
pub fn quantize<const D: usize>(x: Tensor<D>, grid: &Grid) -> Quantized<D> {
    let x = x.detach();
    let mult = broadcast_param::<D>(grid.mult.clone().detach(), grid.axis);
    let zp = broadcast_param::<D>(grid.zero_point.clone().detach(), grid.axis);
    clamped(round_with(x.mul(mult), grid.round).add(zp), grid)
}

/// The clamped integers and range masks of unclamped integers `r` (zero point included).
fn clamped<const D: usize>(r: Tensor<D>, grid: &Grid) -> Quantized<D> {
    let below = r.clone().lower_elem(grid.qmin as f32);
    let above = r.clone().greater_elem(grid.qmax as f32);
    let in_range = below.clone().bool_or(above).bool_not();
    let q = r.clamp(grid.qmin as f32, grid.qmax as f32);
    Quantized { q, in_range, below }
}

/// Dequantizes integers: `(q − z) · step`.
pub fn dequantize<const D: usize>(q: Tensor<D>, grid: &Grid) -> Tensor<D> {
    let zp = broadcast_param::<D>(grid.zero_point.clone().detach(), grid.axis);
    let step = broadcast_param::<D>(grid.step.clone().detach(), grid.axis);
    q.sub(zp).mul(step)
}

/// Adds a term that is exactly zero in value and has gradient `coef` with respect to `p`.
fn zero_with_grad<const D: usize>(p: Tensor<D>, coef: Tensor<D>) -> Tensor<D> {
    p.clone().sub(p.detach()).mul(coef)
}

/// [`zero_with_grad`] of a quantizer parameter `p` (`[1]`, or `[C]` along `axis`) broadcast
/// over `coef`. A per-tensor one's gradient sums `∂out ⊙ coef` over the whole tensor:
/// [`qdarts_kernels::scale::scale`] computes it by whole cubes on the CubeCL backends, where
/// Burn's broadcast product gives it to one thread (the same product elsewhere).
fn zero_with_param_grad<const D: usize>(
    p: Tensor<1>,
    axis: Option<usize>,
    coef: Tensor<D>,
) -> Tensor<D> {
    if axis.is_none() && p.dims() == [1] {
        return qdarts_kernels::scale::scale(coef, p.clone().sub(p.detach()));
    }
    zero_with_grad(broadcast_param::<D>(p, axis), coef)
}

/// Fake-quantizes a sum the way integer kernels add: every operand is rounded onto the output
/// grid on its own (rescaled with its own multiplier), then the integers are added once with the
/// zero point and clamped. The straight-through gradient goes to `sum`, the float sum of `xs`
/// (whose adds hand it to every operand): the upstream gradient where the clamped sum was in
/// range, else 0. The operands' values alone are read, so they may be detached copies.
pub fn fake_quant_sum<const D: usize>(
    xs: &[Tensor<D>],
    sum: &Tensor<D>,
    grid: &Grid,
) -> (Tensor<D>, Quantized<D>) {
    let mult = broadcast_param::<D>(grid.mult.clone().detach(), grid.axis);
    let zp = broadcast_param::<D>(grid.zero_point.clone().detach(), grid.axis);
    let mut r: Option<Tensor<D>> = None;
    for x in xs {
        let q = round_with(x.clone().detach().mul(mult.clone()), grid.round);
        r = Some(match r {
            Some(acc) => acc.add(q),
            None => q,
        });
    }
    let Some(r) = r else {
        panic!("fake_quant_sum needs at least one operand");
    };
    let Quantized { q, in_range, below } = clamped(r.add(zp), grid);
    let mut out = dequantize(q.clone(), grid);
    if sum.is_autodiff() {
        out = out.add(zero_with_grad(sum.clone(), in_range.clone().float()));
    }
    (out, Quantized { q, in_range, below })
}

/// [`fake_quant_sum`], by the kernels of [`qdarts_kernels::quant_sum`] where they run (the
/// CubeCL backends, two operands or more) and `imp` is the fused implementation: the same
/// values and gradients in one launch forward (up to eight operands) and one backward. `sum` is the float sum of `xs` (the kernels' gradient goes through it).
/// The integers come back from the kernels only when `integers` asks for them (they cost
/// launches of their own there).
pub fn fake_quant_sum_ste<const D: usize>(
    xs: &[Tensor<D>],
    sum: &Tensor<D>,
    grid: &Grid,
    integers: bool,
    imp: FakeQuantImpl,
) -> (Tensor<D>, Option<Quantized<D>>) {
    let fused = imp == FakeQuantImpl::Fused
        && xs.len() >= 2
        && quant_sum_available(&sum.device(), sum.dtype());
    if !fused {
        let (out, qz) = fake_quant_sum(xs, sum, grid);
        return (out, Some(qz));
    }
    let ties_away = grid.round == RoundMode::TiesAwayFromZero;
    let layout = FusedLayout::new(&sum.dims(), grid.axis, grid.qmin, grid.qmax, ties_away);
    let params = [&grid.mult, &grid.step, &grid.zero_point];
    let (out, r) = qdarts_kernels::quant_sum::fake_quant_sum(sum.clone(), xs, params, layout);
    (out, integers.then(|| clamped(r, grid)))
}

/// How a fake quantization computes ([`fake_quant_with`], a
/// [`FakeQuantizer`](super::FakeQuantizer)'s choice): the composite tensor expression, or the
/// fused kernel. Both give bit-identical values and gradients; the choice exists to benchmark
/// and test one against the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FakeQuantImpl {
    /// Composite tensor operations (every backend).
    Composite,
    /// One fused pass forward and one backward where the backend has it
    /// ([`fused_available`]), else composite.
    Fused,
}

/// Fake-quantizes with the straight-through estimator, as [`fake_quant`], returning only the
/// dequantized tensor, computed by `imp`.
pub fn fake_quant_with<const D: usize>(x: Tensor<D>, grid: &Grid, imp: FakeQuantImpl) -> Tensor<D> {
    if imp == FakeQuantImpl::Fused && fused_available(&x.device(), x.dtype()) {
        fake_quant_fused(x, grid)
    } else {
        fake_quant(x, grid).0
    }
}

/// Fused fake quantization of `x` on `grid` with the straight-through gradient
/// ([`qdarts_kernels::fake_quant`]): the same values and gradients as [`fake_quant`] in one
/// pass each way. The grid parameters are treated as constants (detached), as in the composite
/// version.
///
/// # Panics
/// If [`fused_available`] is false for `x`.
pub fn fake_quant_fused<const D: usize>(x: Tensor<D>, grid: &Grid) -> Tensor<D> {
    let ties_away = grid.round == RoundMode::TiesAwayFromZero;
    let layout = FusedLayout::new(&x.dims(), grid.axis, grid.qmin, grid.qmax, ties_away);
    kernels::fake_quant_fused(x, &grid.mult, &grid.step, &grid.zero_point, layout)
}

/// Fake-quantizes with the straight-through estimator (no learnable scale), as composite
/// tensor operations.
///
/// Returns the dequantized tensor and the quantization result it came from.
pub fn fake_quant<const D: usize>(x: Tensor<D>, grid: &Grid) -> (Tensor<D>, Quantized<D>) {
    let qz = quantize(x.clone(), grid);
    let deq = dequantize(qz.q.clone(), grid);
    if !x.is_autodiff() {
        return (deq, qz);
    }
    let mask = qz.in_range.clone().float();
    (deq.add(zero_with_grad(x, mask)), qz)
}

/// The learnable step size (and zero point) of LSQ, with torch's learnable fake-quant gradient.
#[derive(Debug, Clone)]
pub struct LearnableGrid {
    /// Step size `s`, `[1]` or `[C]`, usually a tracked parameter.
    pub scale: Tensor<1>,
    /// Zero point, float (rounded in the forward as torch does), `[1]` or `[C]`.
    pub zero_point: Tensor<1>,
    /// Smallest integer.
    pub qmin: i32,
    /// Largest integer.
    pub qmax: i32,
    /// Gradient factor `g` (`1/sqrt(N·Qp)` in LSQ).
    pub grad_factor: f32,
    /// Rounding at ties.
    pub round: RoundMode,
    /// Channel axis of per-channel parameters.
    pub axis: Option<usize>,
}

impl LearnableGrid {
    /// The fixed grid used by the forward pass: `z = clamp(nearbyint(zero_point))`.
    pub fn forward_grid(&self) -> Grid {
        let zp = self.zero_point.clone().detach().round().clamp(self.qmin as f32, self.qmax as f32);
        Grid::from_step(
            self.scale.clone().detach(),
            zp,
            (self.qmin, self.qmax),
            self.round,
            self.axis,
        )
    }
}

/// LSQ fake quantization: forward as [`fake_quant`], gradients to `x`, `scale` and `zero_point`
/// as torch's `_fake_quantize_learnable_per_tensor_affine` / `_per_channel_affine`.
pub fn fake_quant_learnable<const D: usize>(
    x: Tensor<D>,
    lg: &LearnableGrid,
) -> (Tensor<D>, Quantized<D>) {
    let grid = lg.forward_grid();
    let qz = quantize(x.clone(), &grid);
    let deq = dequantize(qz.q.clone(), &grid);
    if !x.is_autodiff() && !lg.scale.is_autodiff() {
        return (deq, qz);
    }
    // torch's backward takes the zero point as int(clamp(z + 0.5)) and rounds
    // nearbyint(z + x·inv) (the zero point added before rounding, unlike the forward).
    let (qmin, qmax) = (lg.qmin as f32, lg.qmax as f32);
    let zb = lg.zero_point.clone().detach().add_scalar(0.5).clamp(qmin, qmax).trunc();
    let zb = broadcast_param::<D>(zb, lg.axis);
    let step = broadcast_param::<D>(grid.step.clone(), lg.axis);
    let inv = broadcast_param::<D>(grid.mult.clone(), lg.axis);
    let xd = x.clone().detach();
    let xs = xd.clone().mul(inv.clone());
    let r = round_with(xs.clone().add(zb.clone()), lg.round);
    let below = r.clone().lower_elem(qmin);
    let above = r.clone().greater_elem(qmax);
    let inside = below.clone().bool_or(above.clone()).bool_not();
    let g = lg.grad_factor;

    // ∂out/∂s: inside ((clamp(r) − z)·s − x)·(1/s); outside qmin − z or qmax − z.
    // torch's compiled kernel contracts `(q − z)·s − x` into one fused multiply-add; the
    // difference of two close numbers is all cancellation, so computing it as two roundings
    // costs ~1e-5 relative per element. Split s = hi + lo (Veltkamp, 12 bits each) so that
    // (q − z)·hi − x is exact for |q − z| < 2^12 and the sum rounds once, as the FMA does.
    let (hi, lo) = veltkamp_split(grid.step.clone());
    let qi = r.clone().clamp(qmin, qmax).sub(zb.clone());
    let err = qi
        .clone()
        .mul(broadcast_param::<D>(hi, lg.axis))
        .sub(xd)
        .add(qi.mul(broadcast_param::<D>(lo, lg.axis)));
    let ds_inside = err.mul(inv);
    let ds = ds_inside
        .mask_where(below.clone(), zb.clone().neg().add_scalar(qmin))
        .mask_where(above, zb.neg().add_scalar(qmax))
        .mul_scalar(g);
    // ∂out/∂z: 0 inside, −s outside. The step is expanded to the input's shape first: LibTorch
    // fills the mask in place and refuses a per-tensor step broadcast against a larger mask.
    let dz = step.neg().mul_scalar(g).expand(inside.shape()).mask_fill(inside.clone(), 0.0);

    let mut out = deq;
    if x.is_autodiff() {
        out = out.add(zero_with_grad(x, inside.float()));
    }
    if lg.scale.is_autodiff() {
        out = out.add(zero_with_param_grad(lg.scale.clone(), lg.axis, ds));
    }
    if lg.zero_point.is_autodiff() {
        out = out.add(zero_with_param_grad(lg.zero_point.clone(), lg.axis, dz));
    }
    (out, qz)
}
