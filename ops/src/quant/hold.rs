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

use std::sync::{Arc, Mutex, PoisonError};

use burn::tensor::{Bool, Tensor};

use super::fake_quant::{Grid, quantize};

/// What a quantizer does with its rounding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HoldMode {
    /// Quantize as usual.
    #[default]
    Off,
    /// Quantize as usual and keep the in-range mask, the offset and the grid.
    Record,
    /// Quantize as usual, keeping what was recorded (passes between recording and replay).
    Kept,
    /// Return `x·mask + offset` on the recorded grid (as usual if nothing was recorded for a
    /// tensor of this size).
    Replay,
}

#[derive(Debug, Default)]
struct Held {
    mode: HoldMode,
    /// In-range mask (one byte per value, not a float: the second-order step holds one per
    /// quantized tensor of the network) and offset, flattened, and the grid.
    kept: Option<(Tensor<1, Bool>, Tensor<1>, Grid)>,
}

/// The held rounding of one quantizer, shared by the copies of its module.
#[derive(Debug, Clone, Default)]
pub struct Hold {
    state: Arc<Mutex<Held>>,
}

impl Hold {
    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sets the mode; `Off` forgets what was recorded.
    pub fn set_mode(&self, mode: HoldMode) {
        let mut h = self.lock();
        h.mode = mode;
        if mode == HoldMode::Off {
            h.kept = None;
        }
    }

    /// The mode.
    pub fn mode(&self) -> HoldMode {
        self.lock().mode
    }

    /// In `Record` mode, keeps the rounding of `out`, the fake-quantized `x` on `grid`.
    pub fn record<const D: usize>(&self, x: &Tensor<D>, out: &Tensor<D>, grid: &Grid) {
        let mut h = self.lock();
        if h.mode != HoldMode::Record {
            return;
        }
        let x = x.clone().detach();
        let mask = quantize(x.clone(), grid).in_range;
        let offset = out.clone().detach().sub(x.mul(mask.clone().float()));
        // Detached: the pass that recorded them has run its backward.
        let grid = Grid {
            mult: grid.mult.clone().detach(),
            step: grid.step.clone().detach(),
            zero_point: grid.zero_point.clone().detach(),
            ..grid.clone()
        };
        h.kept = Some((mask.reshape([-1]), offset.reshape([-1]).detach(), grid));
    }

    /// In `Replay` mode with a recording for `x`'s size: `x·mask + offset` and the recorded
    /// grid.
    pub fn replay<const D: usize>(&self, x: &Tensor<D>) -> Option<(Tensor<D>, Grid)> {
        let h = self.lock();
        if h.mode != HoldMode::Replay {
            return None;
        }
        let (mask, offset, grid) = h.kept.as_ref()?;
        let dims = x.dims();
        if mask.dims()[0] != dims.iter().product::<usize>() {
            return None;
        }
        let mask = mask.clone().reshape(dims).float();
        let out = x.clone().mul(mask).add(offset.clone().reshape(dims));
        Some((out, Grid { held: true, ..grid.clone() }))
    }
}
