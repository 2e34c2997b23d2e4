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

use burn::module::Module;
use burn::tensor::{Device, Tensor};

use super::fake_quant::Grid;
use super::range::min_max;
pub use super::range::{abs_max, channel_rows, qparams_from_min_max};
use super::spec::{ObserverKind, QuantSpec};
use crate::buffer::{Buffer, Owned};
use qdarts_kernels::cat::cat;
use qdarts_kernels::observe::observe_available;

mod kernels;
mod stack;

pub(crate) use kernels::KernelPlan;

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
        let mut cached = self.grid.0.lock();
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

/// [`FixedRange`]'s derived grid with the device and channel count it is for (a clone starts
/// from the original's).
#[derive(Debug, Clone, Default)]
struct FixedGrid(Owned<Option<(Device, usize, Grid)>>);

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
