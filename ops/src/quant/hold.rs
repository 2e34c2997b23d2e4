//! Held rounding: what a quantizer's output is in the finite-difference passes of DARTS'
//! second-order architecture gradient.
//!
//! The Hessian-vector product is `(∇α L(w⁺) − ∇α L(w⁻)) / 2ε` with `w± = w ± ε·v` and ε of
//! about 0.01/‖v‖, far below one quantization step per weight. Quantized as usual, most
//! weights and activations round the same way at `w⁺` and `w⁻` and a few flip to the
//! neighbouring integer; each flip adds about one step / 2ε to the difference, so the product
//! is mostly those flips. With the rounding held, each quantizer keeps the rounding (and the
//! clipping) it made at `w`: in a pass at `w` it records `out = x·m + o` (`m` the in-range
//! mask, `o = out − x·m`), and in the passes at `w±` it returns `x·m + o` for the new `x`.
//! That is the straight-through surrogate the gradients already use (derivative 1 inside the
//! range, 0 outside), so the central difference is the surrogate's mixed Hessian times `v`,
//! without rounding flips; under the `float` preset nothing changes. The roundings that are not
//! a quantizer's, an average pool's integer average and a BatchNorm bias's int32 rounding,
//! follow a held grid ([`Grid::held`]) and are left out in those passes.
//!
//! The kinks that read a held tensor keep their choices too ([`relu_held`],
//! [`max_pool2d_held`]). On a grid many values are exactly 0 (everything within half a step of
//! it) and the values of a pooling window often tie, and the step from `w` to `w±` moves
//! activations by a few grid steps. Unheld, a ReLU passes at `w⁺` what it blocks at `w⁻`, or a
//! pool routes the gradient to another element: each such value adds an O(1) change to `∇α L`
//! divided by 2ε, and which side wins follows the last bits of the arithmetic (one-ulp changes
//! of the weights moved PyTorch's own Hessian-vector product by up to 21 %, of the input images
//! by up to 0.9 %). Held, the
//! ReLU keeps the mask and the pool the element it had at `w`, read off the held grid's
//! [`Grid::held`]: that is the piece autograd differentiates at `w`, and the central difference
//! then agrees with the exact Hessian-vector product of that piece (double backward).

use std::cell::RefCell;
use std::collections::HashMap;

use burn::tensor::module::max_pool2d_with_indices;
use burn::tensor::ops::MaxPoolOptions;
use burn::tensor::{Bool, Tensor};
use qdarts_kernels::fake_quant::FusedLayout;
use qdarts_kernels::hold::{gate, held_fake_quant, hold_available, max_pool2d_at};
use qdarts_kernels::pool2d::max_pool2d;
use qdarts_kernels::relu::relu;

use super::fake_quant::{Grid, quantize};
use super::pass::SiteKey;
use super::spec::RoundMode;

/// What the quantizers of one forward pass do with their rounding: passed through `forward`,
/// never set on a module, so two passes over copies of one network cannot see each other's
/// setting.
#[derive(Debug, Clone, Copy, Default)]
pub enum Hold<'a> {
    /// Quantize as usual (whatever a tape holds stays there).
    #[default]
    Off,
    /// Quantize as usual and keep each quantizer's output, input and grid on the tape.
    Record(&'a HoldTape),
    /// Return `x·mask + offset` on the grid the tape holds for the quantizer (as usual where it
    /// holds nothing for a tensor of this size).
    Replay(&'a HoldTape),
}

impl Hold<'_> {
    /// Whether the pass replays a recording.
    pub fn replays(&self) -> bool {
        matches!(self, Hold::Replay(_))
    }
}

/// What a quantizer kept at `w`: its output there, flattened, and the grid, with its input in
/// one of two forms.
#[derive(Debug)]
struct Kept {
    at_w: Tensor<1>,
    grid: Grid,
    input: Input,
}

/// A held quantizer's input at `w`.
#[derive(Debug)]
enum Input {
    /// The input itself, flattened: what the kernels of [`qdarts_kernels::hold`] read.
    AtW(Box<Tensor<1>>),
    /// The expressions' form, derived from [`Input::AtW`] at the first replay where the kernels
    /// do not run: the in-range mask (one byte per value, not a float: the second-order step
    /// holds one per quantized tensor of the network) and the offset `at_w − x_w·mask`,
    /// flattened.
    Masked(Box<(Tensor<1, Bool>, Tensor<1>)>),
}

/// The roundings one second-order step holds: what each quantizer kept in the pass at `w`,
/// owned by the step and dropped with it.
#[derive(Debug, Default)]
pub struct HoldTape {
    kept: RefCell<HashMap<SiteKey, Kept>>,
}

impl HoldTape {
    /// How many quantizers have a recording.
    pub fn len(&self) -> usize {
        self.kept.borrow().len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Hold<'_> {
    /// In a `Record` pass, keeps `x` and `out`, the fake-quantized `x` on `grid`, for the
    /// quantizer `key` (no launch: the mask and offset are derived where they are needed).
    pub fn record<const D: usize>(
        &self,
        key: SiteKey,
        x: &Tensor<D>,
        out: &Tensor<D>,
        grid: &Grid,
    ) {
        let Hold::Record(tape) = self else { return };
        // Untracked: `detach` keeps a tensor's `require_grad`, and the values at `w` only
        // decide masks and maxima in the passes at `w±`.
        let untracked = |t: &Tensor<D>| t.clone().detach().set_require_grad(false).reshape([-1]);
        // Detached: the pass that recorded them has run its backward.
        let grid = Grid {
            mult: grid.mult.clone().detach(),
            step: grid.step.clone().detach(),
            zero_point: grid.zero_point.clone().detach(),
            ..grid.clone()
        };
        let kept = Kept { at_w: untracked(out), grid, input: Input::AtW(Box::new(untracked(x))) };
        tape.kept.borrow_mut().insert(key, kept);
    }

    /// In a `Replay` pass with a recording of the quantizer `key` for `x`'s size:
    /// `x·mask + offset` and the recorded grid, where `mask` is 1 where the input at `w` rounded
    /// inside the range and `offset` is the output at `w` less the input there times the mask.
    /// One launch each way where [`hold_available`]; elsewhere the mask and offset are derived
    /// at the first replay and kept for the next.
    pub fn replay<const D: usize>(&self, key: SiteKey, x: &Tensor<D>) -> Option<(Tensor<D>, Grid)> {
        let Hold::Replay(tape) = self else { return None };
        let mut tape = tape.kept.borrow_mut();
        let kept = tape.get_mut(&key)?;
        let dims = x.dims();
        if kept.at_w.dims()[0] != dims.iter().product::<usize>() {
            return None;
        }
        let (at_w, grid) = (&kept.at_w, &kept.grid);
        let held = Grid { held: Some(at_w.clone()), ..grid.clone() };
        if let Input::AtW(x_w) = &kept.input {
            if hold_available(&x.device(), x.dtype()) {
                let ties_away = grid.round == RoundMode::TiesAwayFromZero;
                let layout = FusedLayout::new(&dims, grid.axis, grid.qmin, grid.qmax, ties_away);
                let out = held_fake_quant(
                    x.clone(),
                    (**x_w).clone().reshape(dims),
                    at_w.clone().reshape(dims),
                    &grid.mult,
                    &grid.zero_point,
                    layout,
                );
                return Some((out, held));
            }
            // In `x`'s shape: a per-channel grid broadcasts along its axis.
            let x_w = (**x_w).clone().reshape(dims);
            let mask = quantize(x_w.clone(), grid).in_range;
            let offset = at_w.clone().reshape(dims).sub(x_w.mul(mask.clone().float()));
            kept.input = Input::Masked(Box::new((mask.reshape([-1]), offset.reshape([-1]))));
        }
        let Input::Masked(masked) = &kept.input else {
            unreachable!("the expressions' form was just derived");
        };
        let (mask, offset) = &**masked;
        let mask = mask.clone().reshape(dims).float();
        let out = x.clone().mul(mask).add(offset.clone().reshape(dims));
        Some((out, held))
    }
}

/// ReLU of an activation on `grid`. On a held grid (the `w±` passes) the mask is the one at
/// `w`, `x·[x_w > 0]`: a value at exactly 0 at `w` stays blocked on both sides of the difference
/// (as ReLU's derivative at 0 is), one that was positive stays open; otherwise `relu(x)`.
pub fn relu_held(x: Tensor<4>, grid: Option<&Grid>) -> Tensor<4> {
    match grid {
        Some(Grid { held: Some(at_w), .. }) => {
            let key = at_w.clone().reshape(x.dims());
            if hold_available(&x.device(), x.dtype()) {
                return gate(x, key);
            }
            x.mul(key.greater_elem(0.0).float())
        }
        _ => relu(x),
    }
}

/// Max pooling of an activation on `grid`. On a held grid each window takes the element that
/// was its maximum at `w` (the first in row-major order among equal values, as the pool's
/// strict `>` scan picks), with that element's value now (one launch each way where the
/// kernels run); otherwise the max pool.
pub fn max_pool2d_held(x: Tensor<4>, grid: Option<&Grid>, options: MaxPoolOptions<2>) -> Tensor<4> {
    match grid {
        Some(Grid { held: Some(at_w), .. }) => {
            let key = at_w.clone().reshape(x.dims());
            if let Some(out) = max_pool2d_at(x.clone(), key.clone(), &options) {
                return out;
            }
            let (_, idx) = max_pool2d_with_indices(key, options);
            let [n, c, h, w] = x.dims();
            let [_, _, oh, ow] = idx.dims();
            x.reshape([n, c, h * w]).gather(2, idx.reshape([n, c, oh * ow])).reshape([n, c, oh, ow])
        }
        _ => max_pool2d(x, options),
    }
}

/// The grid of channels `start..start + len` of a `[N, C, H, W]` tensor on `grid`: held, its
/// values at `w` cut the same way (a per-tensor grid is the same for every channel).
pub fn narrow_channels(
    grid: Option<&Grid>,
    dims: [usize; 4],
    start: usize,
    len: usize,
) -> Option<Grid> {
    let g = grid?;
    let held = g.held.as_ref().map(|v| v.clone().reshape(dims).narrow(1, start, len).reshape([-1]));
    Some(Grid { held, ..g.clone() })
}
