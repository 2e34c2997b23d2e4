//! Observers: the state that turns tensors seen in training into a quantization grid.
//!
//! The state lives in the module as [`Buffer`] tensors, so it is saved and restored with
//! checkpoints. In training mode an observer folds the current tensor into its state and
//! returns the grid for it; in eval mode (`valid()`) the stored state is used unchanged.
//!
//! | observer | state | grid |
//! |---|---|---|
//! | `AbsMax`, `ChannelWiseAbsMax` | last threshold | `T = max|x|` of this tensor |
//! | `RangeAbsMax { window }` | the last `window` batch maxima | `T = max` of the window |
//! | `MovingAverageAbsMax { rate }` | `state`, `accum` (Paddle starts both at 1) | `T = accum/state` |
//! | `MinMax` | running min, max | torch.ao `calculate_qparams` |
//! | `MovingAverageMinMax { c }` | moving min, max | torch.ao `calculate_qparams` |

use std::sync::{Arc, Mutex};

use burn::module::Module;
use burn::tensor::{Device, Tensor};

use super::fake_quant::Grid;
pub use super::range::{abs_max, channel_rows, qparams_from_min_max};
use super::range::{min_max, symmetric_zero_point};
use super::spec::{ObserverKind, QuantSpec, RoundMode};
use crate::buffer::Buffer;
use qdarts_kernels::cat::cat;
use qdarts_kernels::observe::{
    GridRule, Observed, Rule, observe, observe_available, observe_fake_quant,
};

mod stack;

/// The inputs of one observer launch for a state (see [`ObserverState::plan`]).
pub(crate) struct KernelPlan {
    /// The state's first and second values (see [`Rule`]).
    pub a: Tensor<1>,
    pub b: Tensor<1>,
    /// How the kernels update the state.
    pub rule: Rule,
    /// How they derive the grid.
    pub grid: GridRule,
}

/// The stored state of an observer; see the module docs.
#[derive(Module, Debug)]
pub enum ObserverState {
    /// `AbsMax` / `ChannelWiseAbsMax`: the last threshold.
    AbsMax(AbsMaxState),
    /// `RangeAbsMax`: the window of batch maxima, `[window, C]`, and the current threshold.
    RangeAbsMax(RangeAbsMaxState),
    /// `MovingAverageAbsMax`.
    MovingAverageAbsMax(MovingAverageAbsMaxState),
    /// `MinMax` / `MovingAverageMinMax`.
    MinMax(MinMaxState),
    /// `Fixed`: no state.
    Fixed(FixedRange),
}

/// A fixed range (no state).
#[derive(Module, Debug)]
pub struct FixedRange {
    /// Smallest value.
    pub min: f32,
    /// Largest value.
    pub max: f32,
    /// The grid last derived from the range: it never changes, and deriving it is about 15
    /// launches on a GPU (torch.ao's `calculate_qparams` as tensor expressions) at every forward
    /// of every mixing-weight quantizer.
    #[module(skip)]
    grid: FixedGrid,
}

impl FixedRange {
    /// The range `min..max`.
    pub fn new(min: f32, max: f32) -> Self {
        FixedRange { min, max, grid: FixedGrid::default() }
    }

    /// The grid of `c` channels on `device`, derived once per device and channel count.
    fn grid(&self, spec: &QuantSpec, c: usize, axis: Option<usize>, device: &Device) -> Grid {
        let mut cached = self.grid.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((d, n, g)) = &*cached
            && d == device
            && *n == c
        {
            return g.clone();
        }
        let lo = Tensor::<1>::full([c], self.min, device);
        let hi = Tensor::<1>::full([c], self.max, device);
        let (scale, zp) = qparams_from_min_max(lo, hi, spec);
        let grid = Grid::from_step(scale, zp, spec.quant_range(), spec.round(), axis);
        *cached = Some((device.clone(), c, grid.clone()));
        grid
    }
}

/// [`FixedRange`]'s derived grid with the device and channel count it is for; shared by the
/// module's clones (the same range and spec give the same grid).
#[derive(Debug, Clone, Default)]
struct FixedGrid(Arc<Mutex<Option<(Device, usize, Grid)>>>);

/// The threshold of the last tensor seen.
#[derive(Module, Debug)]
pub struct AbsMaxState {
    /// Threshold, `[C]`.
    pub threshold: Buffer<1>,
}

/// Paddle `fake_quantize_range_abs_max` state.
#[derive(Module, Debug)]
pub struct RangeAbsMaxState {
    /// The last `window` batch maxima, oldest first, `[window, C]` (zeros until filled).
    pub window: Buffer<2>,
    /// Threshold, `[C]`.
    pub threshold: Buffer<1>,
}

/// Paddle `fake_quantize_moving_average_abs_max` state.
#[derive(Module, Debug)]
pub struct MovingAverageAbsMaxState {
    /// Moving rate.
    pub rate: f32,
    /// `state`, `[C]`.
    pub state: Buffer<1>,
    /// `accum`, `[C]`.
    pub accum: Buffer<1>,
    /// Threshold `accum/state`, `[C]`.
    pub threshold: Buffer<1>,
}

/// torch.ao min/max observer state (`+inf`/`-inf` before the first tensor).
#[derive(Module, Debug)]
pub struct MinMaxState {
    /// Averaging constant of `MovingAverageMinMax`; `None` for `MinMax`.
    pub averaging_constant: Option<f32>,
    /// Running minimum, `[C]`.
    pub min: Buffer<1>,
    /// Running maximum, `[C]`.
    pub max: Buffer<1>,
}

fn state(v: Tensor<1>) -> Buffer<1> {
    Buffer::new(v)
}

fn read<const D: usize>(s: &Buffer<D>, device: &Device) -> Tensor<D> {
    s.value().detach().to_device(device)
}

impl ObserverState {
    /// Fresh state for `channels` channels (1 per tensor); `None` for LSQ, whose step is a
    /// parameter of the quantizer.
    pub fn new(spec: &QuantSpec, channels: usize, device: &Device) -> Option<Self> {
        let full = |v: f32| Tensor::<1>::full([channels], v, device);
        Some(match spec.observer() {
            ObserverKind::AbsMax | ObserverKind::ChannelWiseAbsMax => {
                ObserverState::AbsMax(AbsMaxState { threshold: state(full(0.0)) })
            }
            ObserverKind::RangeAbsMax { window } => ObserverState::RangeAbsMax(RangeAbsMaxState {
                window: Buffer::new(Tensor::zeros([window, channels], device)),
                threshold: state(full(0.0)),
            }),
            // Paddle's FakeQuantMovingAverageAbsMax layer starts state and accum at 1.
            ObserverKind::MovingAverageAbsMax { rate } => {
                ObserverState::MovingAverageAbsMax(MovingAverageAbsMaxState {
                    rate,
                    state: state(full(1.0)),
                    accum: state(full(1.0)),
                    threshold: state(full(0.001)),
                })
            }
            ObserverKind::MinMax => ObserverState::MinMax(MinMaxState {
                averaging_constant: None,
                min: state(full(f32::INFINITY)),
                max: state(full(f32::NEG_INFINITY)),
            }),
            ObserverKind::MovingAverageMinMax { averaging_constant } => {
                ObserverState::MinMax(MinMaxState {
                    averaging_constant: Some(averaging_constant),
                    min: state(full(f32::INFINITY)),
                    max: state(full(f32::NEG_INFINITY)),
                })
            }
            ObserverKind::Fixed { min, max } => ObserverState::Fixed(FixedRange::new(min, max)),
            ObserverKind::Lsq => return None,
        })
    }

    /// [`grid`](Self::grid) by the observer kernels, where the observer reads `x`.
    fn observed<const D: usize>(
        &self,
        spec: &QuantSpec,
        x: &Tensor<D>,
        update: bool,
        current: bool,
    ) -> Option<Grid> {
        let run = |a, b, rule, grid| {
            (observe(x.clone(), spec.granularity().axis(), [a, b], rule, grid), ())
        };
        self.observed_by(spec, x, update, current, run).map(|(grid, ())| grid)
    }

    /// The observer kernels' update and grid, run by `run(a, b, rule, grid)` on the stored
    /// state, with what `run` returns besides; a state that is not updated (eval mode, a
    /// frozen observer) as it is stored ([`Rule::Stored`]). `None` for `Fixed` and for the
    /// update of `RangeAbsMax`, whose window stays tensor expressions.
    fn observed_by<const D: usize, R>(
        &self,
        spec: &QuantSpec,
        x: &Tensor<D>,
        update: bool,
        current: bool,
        run: impl FnOnce(Tensor<1>, Tensor<1>, Rule, GridRule) -> (Observed, R),
    ) -> Option<(Grid, R)> {
        let plan = self.plan(spec, &x.device(), update, current)?;
        let (observed, extra) = run(plan.a, plan.b, plan.rule, plan.grid);
        Some((self.settle(spec, observed, update), extra))
    }

    /// What the observer kernels take for this state (see [`observed_by`](Self::observed_by)):
    /// `None` where they do not run it.
    pub(crate) fn plan(
        &self,
        spec: &QuantSpec,
        device: &Device,
        update: bool,
        current: bool,
    ) -> Option<KernelPlan> {
        let (qmin, qmax) = spec.quant_range();
        let minmax = GridRule::MinMax {
            qmin,
            qmax,
            symmetric: spec.is_symmetric(),
            zero_point: symmetric_zero_point(spec),
        };
        let threshold = GridRule::Threshold { bin_cnt: spec.bin_cnt() };
        let plan = |a: Tensor<1>, b: Tensor<1>, rule, grid| Some(KernelPlan { a, b, rule, grid });
        match self {
            // The rule has no memory: the stored threshold only stands in for the state.
            ObserverState::AbsMax(s) if update || current => {
                let t = s.threshold.value().to_device(device);
                plan(t.clone(), t, Rule::AbsMax, threshold)
            }
            ObserverState::MovingAverageAbsMax(s) if update => {
                let rule = Rule::MovingAverageAbsMax { rate: s.rate };
                plan(read(&s.state, device), read(&s.accum, device), rule, threshold)
            }
            ObserverState::MinMax(s) if update => {
                let rule = match s.averaging_constant {
                    Some(averaging_constant) => Rule::MovingAverageMinMax { averaging_constant },
                    None => Rule::MinMax,
                };
                plan(read(&s.min, device), read(&s.max, device), rule, minmax)
            }
            // The stored state, not updated (eval mode, a frozen observer).
            ObserverState::MinMax(s) => {
                plan(read(&s.min, device), read(&s.max, device), Rule::Stored, minmax)
            }
            ObserverState::AbsMax(AbsMaxState { threshold: t })
            | ObserverState::RangeAbsMax(RangeAbsMaxState { threshold: t, .. })
            | ObserverState::MovingAverageAbsMax(MovingAverageAbsMaxState {
                threshold: t, ..
            }) if !update => {
                let t = read(t, device);
                plan(t.clone(), t, Rule::Stored, threshold)
            }
            _ => None,
        }
    }

    /// The state after the kernels' run of this state's [`plan`](Self::plan) (stored where
    /// `update`), and the grid they derived.
    pub(crate) fn settle(&self, spec: &QuantSpec, o: Observed, update: bool) -> Grid {
        let range = match self {
            ObserverState::AbsMax(s) => {
                if update {
                    s.threshold.set(o.state[2].clone());
                }
                spec.grid_range()
            }
            ObserverState::MovingAverageAbsMax(s) => {
                if update {
                    s.state.set(o.state[0].clone());
                    s.accum.set(o.state[1].clone());
                    s.threshold.set(o.state[2].clone());
                }
                spec.grid_range()
            }
            ObserverState::MinMax(s) => {
                if update {
                    s.min.set(o.state[0].clone());
                    s.max.set(o.state[1].clone());
                }
                spec.quant_range()
            }
            ObserverState::RangeAbsMax(_) | ObserverState::Fixed(_) => spec.grid_range(),
        };
        let Observed { mult, step, zero_point, .. } = o;
        Grid::new([mult, step, zero_point], range, spec.round(), spec.granularity().axis())
    }

    /// [`grid`](Self::grid) and the fused fake quantization of `x` on it
    /// ([`super::fake_quant::fake_quant_fused`]) in one kernel launch
    /// ([`qdarts_kernels::observe::observe_fake_quant`]): the same grid, state, output and
    /// straight-through gradient, one launch fewer. `None` where the two are not both kernels
    /// (another backend, an observer that does not read `x`): the caller then runs them apart.
    pub fn grid_and_fake_quant<const D: usize>(
        &self,
        spec: &QuantSpec,
        x: &Tensor<D>,
        update: bool,
        current: bool,
    ) -> Option<(Tensor<D>, Grid)> {
        let (device, dtype) = (x.device(), x.dtype());
        if !observe_available(&device, dtype) || !super::fake_quant::fused_available(&device, dtype)
        {
            return None;
        }
        let axis = spec.granularity().axis();
        // The integer range of every grid `observed_by` returns.
        let (range, ties_away) = (spec.grid_range(), spec.round() == RoundMode::TiesAwayFromZero);
        let run = |a, b, rule, grid| {
            observe_fake_quant(x.clone(), axis, [a, b], rule, grid, range, ties_away)
        };
        let (grid, out) = self.observed_by(spec, x, update, current, run)?;
        debug_assert_eq!((grid.qmin, grid.qmax), range, "fused on another range than the grid's");
        Some((out, grid))
    }

    /// The stored abs-max threshold `T` (Paddle's `OutScale`), for the abs-max family.
    pub fn threshold(&self) -> Option<Tensor<1>> {
        match self {
            ObserverState::AbsMax(s) => Some(s.threshold.value()),
            ObserverState::RangeAbsMax(s) => Some(s.threshold.value()),
            ObserverState::MovingAverageAbsMax(s) => Some(s.threshold.value()),
            ObserverState::MinMax(_) | ObserverState::Fixed(_) => None,
        }
    }

    /// Folds `x` into the state (when `update`) and returns the grid to quantize with.
    ///
    /// `current`: a weight's abs-max observer reads the tensor it quantizes also when it does not
    /// update (Paddle's weight quantizers have no state; nor has TensorRT's QAT toolkit for
    /// weights), so that inference and freeze use the weights as they are, not as they were at
    /// the last training forward.
    ///
    /// On the CubeCL backends an observer that reads `x` runs as
    /// [`qdarts_kernels::observe`]'s kernels (the same arithmetic in one or two launches);
    /// [`grid_with`](Self::grid_with) chooses.
    pub fn grid<const D: usize>(
        &self,
        spec: &QuantSpec,
        x: &Tensor<D>,
        update: bool,
        current: bool,
    ) -> Grid {
        self.grid_with(spec, x, update, current, true)
    }

    /// [`grid`](Self::grid) with the observer kernels (`kernel`, where they are available: not
    /// for `Fixed` or a `RangeAbsMax` update) or the tensor expressions. With the kernels `x`
    /// must be the tensor the grid is for (its shape gives the channels), also where a stored
    /// state is read without it.
    pub fn grid_with<const D: usize>(
        &self,
        spec: &QuantSpec,
        x: &Tensor<D>,
        update: bool,
        current: bool,
        kernel: bool,
    ) -> Grid {
        let device = x.device();
        if kernel
            && observe_available(&device, x.dtype())
            && let Some(grid) = self.observed(spec, x, update, current)
        {
            return grid;
        }
        let axis = spec.granularity().axis();
        let threshold = match self {
            ObserverState::AbsMax(s) => {
                if update {
                    let t = abs_max(x.clone(), axis);
                    s.threshold.set(t.clone());
                    t
                } else if current {
                    abs_max(x.clone(), axis)
                } else {
                    read(&s.threshold, &device)
                }
            }
            ObserverState::RangeAbsMax(s) => {
                if update {
                    let cur = abs_max(x.clone(), axis);
                    let c = cur.dims()[0];
                    let w = read(&s.window, &device);
                    let window = w.dims()[0];
                    let w = cat(vec![w.slice(1..window), cur.reshape([1, c])], 0);
                    let t = w.clone().max_dim(0).reshape([c]);
                    s.window.set(w);
                    s.threshold.set(t.clone());
                    t
                } else {
                    read(&s.threshold, &device)
                }
            }
            ObserverState::MovingAverageAbsMax(s) => {
                if update {
                    let cur = abs_max(x.clone(), axis);
                    let st = read(&s.state, &device).mul_scalar(s.rate).add_scalar(1.0);
                    let acc = read(&s.accum, &device).mul_scalar(s.rate).add(cur);
                    let t = acc.clone().div(st.clone());
                    s.state.set(st);
                    s.accum.set(acc);
                    s.threshold.set(t.clone());
                    t
                } else {
                    read(&s.threshold, &device)
                }
            }
            ObserverState::MinMax(s) => {
                let (mut lo, mut hi) = (read(&s.min, &device), read(&s.max, &device));
                if update {
                    let (xmin, xmax) = min_max(x.clone(), axis);
                    match s.averaging_constant {
                        Some(c) => {
                            // torch: the first tensor sets min/max directly.
                            let first = lo.clone().is_inf();
                            let mv = |old: Tensor<1>, new: Tensor<1>| {
                                old.clone()
                                    .add(new.clone().sub(old).mul_scalar(c))
                                    .mask_where(first.clone(), new)
                            };
                            lo = mv(lo, xmin);
                            hi = mv(hi, xmax);
                        }
                        None => {
                            lo = lo.min_pair(xmin);
                            hi = hi.max_pair(xmax);
                        }
                    }
                    s.min.set(lo.clone());
                    s.max.set(hi.clone());
                }
                let (scale, zp) = qparams_from_min_max(lo, hi, spec);
                return Grid::from_step(scale, zp, spec.quant_range(), spec.round(), axis);
            }
            ObserverState::Fixed(r) => {
                let c = x
                    .dims()
                    .get(axis.unwrap_or(0))
                    .copied()
                    .filter(|_| axis.is_some())
                    .unwrap_or(1);
                return r.grid(spec, c, axis, &device);
            }
        };
        Grid::from_threshold(threshold, spec.bin_cnt(), spec.grid_range(), spec.round(), axis)
    }
}
