//! Several quantizers' forwards at once: the weight quantizers of a layer or a cell, whose
//! observers and fake quantizations one launch can run together.

use burn::tensor::Tensor;
use qdarts_kernels::observe::{GridRule, Rule, many_available, observe_fake_quant_many};

use super::super::fake_quant::{FakeQuantImpl, Grid};
use super::super::observer::KernelPlan;
use super::super::pass::QuantPass;
use super::super::spec::RoundMode;
use super::FakeQuantizer;

/// What tensors must share to be observed in one launch: the per-channel axis, the rule, the
/// grid, the integer range, the rounding, and the side of autodiff.
type Key = (Option<usize>, Rule, GridRule, (i32, i32), bool, bool);

impl FakeQuantizer {
    /// [`forward_with_grid`](Self::forward_with_grid) of each `(quantizer, x)` of `sites`:
    /// the same outputs, grids, observer updates and records as one call each. Where the
    /// observer kernels run a site and its fake quantization clips nothing (a weight's
    /// abs-max grid; see [`many_available`]), the sites of one rule are observed and
    /// quantized [`ARITY`](qdarts_kernels::cat::ARITY) a launch; the others (LSQ, held
    /// rounding, another observer, another backend) one by one. `qp`: as
    /// [`forward_in`](Self::forward_in).
    ///
    /// # Panics
    /// As [`forward`](Self::forward).
    pub fn forward_many<const D: usize>(
        sites: Vec<(&FakeQuantizer, Tensor<D>)>,
        qp: QuantPass,
    ) -> Vec<(Tensor<D>, Grid)> {
        let mut done: Vec<Option<(Tensor<D>, Grid)>> = sites.iter().map(|_| None).collect();
        let mut groups: Vec<(Key, Vec<(usize, KernelPlan)>)> = Vec::new();
        for (i, (q, x)) in sites.iter().enumerate() {
            match q.many_plan(x, qp) {
                Some((key, plan)) => match groups.iter_mut().find(|(k, _)| *k == key) {
                    Some((_, members)) => members.push((i, plan)),
                    None => groups.push((key, vec![(i, plan)])),
                },
                None => done[i] = Some(q.forward_in(x.clone(), qp)),
            }
        }
        for ((axis, rule, grid, range, ties_away, _), members) in groups {
            let inputs = members
                .iter()
                .map(|(i, plan)| (sites[*i].1.clone(), [plan.a.clone(), plan.b.clone()]))
                .collect();
            let outs = observe_fake_quant_many(inputs, axis, rule, grid, range, ties_away);
            for ((i, _), (observed, out)) in members.into_iter().zip(outs) {
                let (q, x) = &sites[i];
                let grid = q.observer.as_ref().expect("planned").settle(
                    &q.spec,
                    observed,
                    q.training.is_enabled(),
                );
                q.record_error(qp, x, &out, None, &grid);
                qp.hold.record(q.key, x, &out, &grid);
                done[i] = Some((out, grid));
            }
        }
        done.into_iter().map(|d| d.expect("every site is quantized")).collect()
    }

    /// This quantizer's observer plan for `x` and what it must share with others to run in
    /// one launch; `None` where it quantizes `x` on its own.
    fn many_plan<const D: usize>(&self, x: &Tensor<D>, qp: QuantPass) -> Option<(Key, KernelPlan)> {
        if let Err(e) = self.check(x) {
            panic!("quantizer {}: {e}", self.path);
        }
        if self.lsq.is_some()
            || qp.imp != FakeQuantImpl::Fused
            || qp.hold.replays()
            || !super::super::fake_quant::fused_available(&x.device(), x.dtype())
        {
            return None;
        }
        let update = self.training.is_enabled();
        let current = self.role == super::TensorRole::Weight;
        let plan = self.observer.as_ref()?.plan(&self.spec, &x.device(), update, current)?;
        let (axis, range) = (self.spec.granularity().axis(), self.spec.grid_range());
        if !many_available(x, axis, plan.rule, plan.grid, range) {
            return None;
        }
        let ties_away = self.spec.round() == RoundMode::TiesAwayFromZero;
        Some(((axis, plan.rule, plan.grid, range, ties_away, x.is_autodiff()), plan))
    }
}
