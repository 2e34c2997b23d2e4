//! The observer's work by the observer kernels (`qdarts_kernels::observe`): what a state gives
//! them, the state update and grid they return, alone or with the fake quantization.

use burn::tensor::{Device, Tensor};

use super::super::fake_quant::Grid;
use super::super::range::symmetric_zero_point;
use super::super::spec::{QuantSpec, RoundMode};
use super::*;
use qdarts_kernels::observe::{
    GridRule, Observed, Rule, observe, observe_available, observe_fake_quant,
};

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

impl ObserverState {
    /// [`grid`](Self::grid) by the observer kernels, where the observer reads `x`.
    pub(super) fn observed<const D: usize>(
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
    /// ([`crate::quant::fake_quant::fake_quant_fused`]) in one kernel launch
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
        if !observe_available(&device, dtype)
            || !super::super::fake_quant::fused_available(&device, dtype)
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
}
