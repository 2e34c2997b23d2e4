//! `FakeQuantizer`: one quantization site (a weight or an activation) as a Burn module.
//!
//! It owns its observer state (checkpointed with the model), its LSQ parameters, a training flag
//! (`valid()` freezes the observer) and a stable layer path. What one forward pass asks of it
//! beyond quantizing (held rounding, error statistics, the kernel) comes with the pass
//! ([`QuantPass`]), and what it keeps for the pass goes on the pass's tapes, by its key.

use burn::module::{Flag, Module, Param};
use burn::tensor::{Device, Int, Tensor};

use super::error::SpecError;
use super::fake_quant::{self, Grid, Quantized};
use super::lsq::LsqParams;
use super::observer::ObserverState;
use super::pass::{QuantPass, SiteKey};
use super::spec::{Granularity, ObserverKind, QuantSpec};
use super::stats::{ErrorTape, QuantError, Row, RowLayout, TensorRole};

mod many;

/// A fake quantizer: observer (or LSQ step) + fake-quant kernel.
#[derive(Module, Debug)]
pub struct FakeQuantizer {
    #[module(skip)]
    spec: QuantSpec,
    #[module(skip)]
    path: String,
    #[module(skip)]
    role: TensorRole,
    #[module(skip)]
    channels: usize,
    /// Observers update only while this flag is on (off after `valid()`).
    pub training: Param<Flag>,
    /// Observer state (`None` for LSQ).
    pub observer: Option<ObserverState>,
    /// LSQ parameters, for `observer = lsq`.
    pub lsq: Option<LsqParams>,
    /// Which quantizer a tape's entry belongs to (held rounding, error statistics); kept by
    /// copies.
    #[module(skip)]
    key: SiteKey,
    /// The sites this quantizer stands for when it quantizes several side by side
    /// ([`FakeQuantizer::stacked`]); empty for a quantizer of one site.
    #[module(skip)]
    rows: Vec<Row>,
}

/// Integer values of a tensor with the grid that dequantizes them (Paddle's `fake_quantize_*`
/// outputs; what freeze stores).
#[derive(Debug, Clone)]
pub struct IntTensor<const D: usize> {
    /// The integers.
    pub values: Tensor<D, Int>,
    /// Step per channel (`[C]`, or `[1]`).
    pub scale: Tensor<1>,
    /// Zero point per channel.
    pub zero_point: Tensor<1>,
    /// Channel axis, if per-channel.
    pub axis: Option<usize>,
}

impl FakeQuantizer {
    /// A quantizer at `path` for tensors with `channels` channels along the spec's axis (ignored
    /// per tensor).
    pub fn new(
        spec: QuantSpec,
        path: impl Into<String>,
        role: TensorRole,
        channels: usize,
        device: &Device,
    ) -> Result<Self, SpecError> {
        let channels = if spec.granularity().axis().is_some() { channels.max(1) } else { 1 };
        let lsq = matches!(spec.observer(), ObserverKind::Lsq)
            .then(|| LsqParams::new(&spec, channels, device));
        Ok(FakeQuantizer {
            observer: ObserverState::new(&spec, channels, device),
            spec,
            path: path.into(),
            role,
            channels,
            training: Param::from_bool(true),
            lsq,
            key: SiteKey::fresh(),
            rows: Vec::new(),
        })
    }

    /// One quantizer standing for `sites` (of one spec and role, none of them LSQ), each a
    /// row: their tensors side by side along the spec's channel axis, and for a per-tensor
    /// spec laid out as `[…, rows, …]` along axis 1 (the caller's view, one channel per row).
    /// Row `r` is quantized as `sites[r]` would quantize its own tensor, from a copy of its
    /// observer state; its error statistics keep its path. The batched cell's waves quantize
    /// every edge's site in one launch chain so.
    ///
    /// # Errors
    /// If `sites` is empty, mixes specs or roles, or is LSQ (its gradient factor counts the
    /// values of the whole tensor).
    pub fn stacked(sites: &[&FakeQuantizer], path: impl Into<String>) -> Result<Self, SpecError> {
        let path = path.into();
        let stacking = |why: &str| SpecError::Stacked(format!("{path}: {why}"));
        let first = sites.first().ok_or_else(|| stacking("no sites"))?;
        if sites.iter().any(|q| q.spec != first.spec || q.role != first.role) {
            return Err(stacking("the sites differ in spec or role"));
        }
        let states: Option<Vec<&ObserverState>> =
            sites.iter().map(|q| q.observer.as_ref()).collect();
        let states = states.ok_or_else(|| stacking("LSQ sites do not stack"))?;
        let (spec, channels) = match first.spec.granularity().axis() {
            Some(_) => (first.spec, sites.iter().map(|q| q.channels).sum()),
            None => {
                (first.spec.with_granularity(Granularity::PerChannel { axis: 1 })?, sites.len())
            }
        };
        Ok(FakeQuantizer {
            spec,
            path,
            role: first.role,
            channels,
            training: Param::from_bool(first.training.is_enabled()),
            observer: Some(ObserverState::stacked(&states)),
            lsq: None,
            key: SiteKey::fresh(),
            rows: sites.iter().map(|q| Row::new(q.path.clone())).collect(),
        })
    }

    /// The same stacked quantizer with row `r` counting `numel` values in its error statistics
    /// (its run holds padding besides).
    pub fn with_row_numel(mut self, r: usize, numel: usize) -> Self {
        self.rows[r].numel = Some(numel);
        self
    }

    /// The same stacked quantizer with row `r` standing also for the sites at `paths`
    /// ([`Row::also`]).
    pub fn with_row_aliases(mut self, r: usize, paths: Vec<String>) -> Self {
        self.rows[r].also = paths;
        self
    }

    /// The sites of a stacked quantizer ([`stacked`](Self::stacked)); empty otherwise.
    pub fn rows(&self) -> &[Row] {
        &self.rows
    }

    /// Row `r`'s observer state into `site`, the quantizer of that row's site (or one like
    /// it): the inverse of [`stacked`](Self::stacked) for one site.
    ///
    /// # Panics
    /// If `site` observes otherwise (another kind, or LSQ).
    pub fn row_into(&self, r: usize, site: &FakeQuantizer) {
        if let (Some(all), Some(to)) = (&self.observer, &site.observer) {
            all.row_into(to, r * site.channels, site.channels);
        }
    }

    /// On `qp`'s error tape, the error of `out` against `x` (see [`ErrorTape::record`]).
    pub(crate) fn record_error<const D: usize>(
        &self,
        qp: QuantPass,
        x: &Tensor<D>,
        out: &Tensor<D>,
        qz: Option<&Quantized<D>>,
        grid: &Grid,
    ) {
        if let Some(tape) = qp.errors {
            tape.record(self.key, x, out, qz, grid, self.row_layout());
        }
    }

    /// Where the rows lie in the tensors this quantizer sees (none for one site).
    fn row_layout(&self) -> Option<RowLayout> {
        let axis = self.spec.granularity().axis()?;
        (!self.rows.is_empty()).then_some(RowLayout { axis, rows: self.rows.len() })
    }

    /// The spec.
    pub fn spec(&self) -> &QuantSpec {
        &self.spec
    }

    /// The stable layer path, e.g. `cells.3.edges.5.sep_conv_3x3.op1.pw.weight`.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Weight or activation.
    pub fn role(&self) -> TensorRole {
        self.role
    }

    /// Error statistics of the last tensor this quantizer quantized in a pass recording on
    /// `tape`.
    pub fn last_stats(&self, tape: &ErrorTape) -> Result<Option<QuantError>, SpecError> {
        let row = [Row::new(self.path.clone())];
        Ok(tape.read_rows(self.key, &row, self.role, &self.spec)?.pop())
    }

    /// The error rows of the last tensor this quantizer quantized in a pass recording on
    /// `tape`: one, or one per site of a stacked quantizer ([`stacked`](Self::stacked)); none
    /// if it recorded nothing there.
    pub fn error_rows(&self, tape: &ErrorTape) -> Result<Vec<QuantError>, SpecError> {
        if self.rows.is_empty() {
            return Ok(self.last_stats(tape)?.into_iter().collect());
        }
        tape.read_rows(self.key, &self.rows, self.role, &self.spec)
    }

    fn check<const D: usize>(&self, x: &Tensor<D>) -> Result<(), SpecError> {
        self.spec.check_rank(D)?;
        if let Some(axis) = self.spec.granularity().axis() {
            let c = x.dims()[axis];
            if c != self.channels {
                return Err(SpecError::Channels { expected: self.channels, got: c, axis });
            }
        }
        Ok(())
    }

    /// Fake-quantizes `x` (quantize → dequantize, straight-through gradient), updating the
    /// observer in training mode.
    ///
    /// # Shapes
    /// - x: any rank `D`; per-channel specs need `x.dims()[axis] == channels`.
    /// - output: the shape of `x`.
    pub fn try_forward<const D: usize>(&self, x: Tensor<D>) -> Result<Tensor<D>, SpecError> {
        self.try_forward_in(x, QuantPass::OFF).map(|(out, _)| out)
    }

    /// [`try_forward`](Self::try_forward) in the quantizer pass `qp`
    /// (see [`super::hold`]), also returning the grid the output lies on.
    pub fn try_forward_in<const D: usize>(
        &self,
        x: Tensor<D>,
        qp: QuantPass,
    ) -> Result<(Tensor<D>, Grid), SpecError> {
        self.check(&x)?;
        if let Some(held) = qp.hold.replay(self.key, &x) {
            return Ok(held);
        }
        let update = self.training.is_enabled();
        let (out, qz, grid) = match &self.lsq {
            Some(lsq) => {
                let lg = lsq.grid(&self.spec, &x, self.channels);
                let (out, qz) = fake_quant::fake_quant_learnable(x.clone(), &lg);
                (out, Some(qz), lg.forward_grid())
            }
            None => match self.observe_fake_quant(&x, update, qp) {
                Some((out, grid)) => (out, None, grid),
                None => {
                    let grid = self.observe(&x, update);
                    (fake_quant::fake_quant_with(x.clone(), &grid, qp.imp), None, grid)
                }
            },
        };
        self.record_error(qp, &x, &out, qz.as_ref(), &grid);
        qp.hold.record(self.key, &x, &out, &grid);
        Ok((out, grid))
    }

    /// Fake-quantizes the sum of `xs` as an integer add does: each operand rescaled onto this
    /// quantizer's grid on its own, then added (see [`fake_quant::fake_quant_sum`]). The observer
    /// sees the float sum. LSQ quantizers quantize the float sum, to keep their step gradient.
    ///
    /// # Panics
    /// If `xs` is empty, or as [`forward`](Self::forward).
    pub fn forward_sum<const D: usize>(&self, xs: Vec<Tensor<D>>) -> (Tensor<D>, Grid) {
        let Some(sum) = xs.iter().cloned().reduce(|a, b| a.add(b)) else {
            panic!("quantizer {}: an add needs at least one operand", self.path);
        };
        self.forward_summed(&xs, sum, QuantPass::OFF)
    }

    /// [`forward_sum`](Self::forward_sum) of operands whose float sum, `sum`, the caller has
    /// computed: the gradient goes through `sum` alone, and only the values of `xs` are read
    /// (they may be detached). `sum` must be `xs` added left to right. `qp`: as
    /// [`forward_in`](Self::forward_in).
    ///
    /// # Panics
    /// If `xs` is empty, or as [`forward`](Self::forward).
    pub fn forward_summed<const D: usize>(
        &self,
        xs: &[Tensor<D>],
        sum: Tensor<D>,
        qp: QuantPass,
    ) -> (Tensor<D>, Grid) {
        assert!(!xs.is_empty(), "quantizer {}: an add needs at least one operand", self.path);
        if self.lsq.is_some() || xs.len() == 1 {
            return self.forward_in(sum, qp);
        }
        if let Err(e) = self.check(&sum) {
            panic!("quantizer {}: {e}", self.path);
        }
        if let Some(held) = qp.hold.replay(self.key, &sum) {
            return held;
        }
        let grid = self.observe(&sum, self.training.is_enabled());
        let recording = qp.errors.is_some();
        let (out, qz) = fake_quant::fake_quant_sum_ste(xs, &sum, &grid, recording, qp.imp);
        self.record_error(qp, &sum, &out, qz.as_ref(), &grid);
        qp.hold.record(self.key, &sum, &out, &grid);
        (out, grid)
    }

    /// [`forward`](Self::forward), also returning the grid the output lies on.
    ///
    /// # Panics
    /// As [`forward`](Self::forward).
    pub fn forward_with_grid<const D: usize>(&self, x: Tensor<D>) -> (Tensor<D>, Grid) {
        self.forward_in(x, QuantPass::OFF)
    }

    /// [`forward_with_grid`](Self::forward_with_grid) in the quantizer pass `qp` (see
    /// [`QuantPass`]).
    ///
    /// # Panics
    /// As [`forward`](Self::forward).
    pub fn forward_in<const D: usize>(&self, x: Tensor<D>, qp: QuantPass) -> (Tensor<D>, Grid) {
        match self.try_forward_in(x, qp) {
            Ok(r) => r,
            Err(e) => panic!("quantizer {}: {e}", self.path),
        }
    }

    /// [`try_forward`](Self::try_forward) for shapes the caller has already checked.
    ///
    /// # Panics
    /// If `x` does not fit the spec (rank below the per-channel axis, or another channel count):
    /// a programming error of the op that owns this quantizer.
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        match self.try_forward(x) {
            Ok(out) => out,
            Err(e) => panic!("quantizer {}: {e}", self.path),
        }
    }

    /// The grid for `x`, folding `x` into the observer when `update`; a weight's abs-max
    /// observer reads `x` itself also when it does not update.
    fn observe<const D: usize>(&self, x: &Tensor<D>, update: bool) -> Grid {
        self.observe_with(x, update, self.role == TensorRole::Weight)
    }

    /// [`observe`](Self::observe) and the fused fake quantization in one kernel launch, where
    /// both are kernels here and this quantizer's implementation is the fused one.
    fn observe_fake_quant<const D: usize>(
        &self,
        x: &Tensor<D>,
        update: bool,
        qp: QuantPass,
    ) -> Option<(Tensor<D>, Grid)> {
        if qp.imp != fake_quant::FakeQuantImpl::Fused {
            return None;
        }
        let current = self.role == TensorRole::Weight;
        self.observer.as_ref()?.grid_and_fake_quant(&self.spec, x, update, current)
    }

    fn observe_with<const D: usize>(&self, x: &Tensor<D>, update: bool, current: bool) -> Grid {
        match &self.observer {
            Some(o) => o.grid(&self.spec, x, update, current),
            None => self.fallback_grid(&x.device()),
        }
    }

    fn fallback_grid(&self, device: &Device) -> Grid {
        let ones = Tensor::<1>::ones([self.channels], device);
        Grid::from_step(
            ones.clone(),
            ones.zeros_like(),
            self.spec.quant_range(),
            self.spec.round(),
            self.spec.granularity().axis(),
        )
    }

    /// The grid this quantizer would use now, without updating any state (for freeze).
    pub fn current_grid(&self, device: &Device) -> Grid {
        match &self.lsq {
            Some(lsq) => lsq.current(&self.spec).forward_grid(),
            None => {
                // Not a tensor of the quantizer's shape: the expressions read the stored state.
                let dummy = Tensor::<1>::zeros([self.channels], device);
                match &self.observer {
                    Some(o) => o.grid_with(&self.spec, &dummy, false, false, false),
                    None => self.fallback_grid(device),
                }
            }
        }
    }

    /// Quantize-only: the integers of `x` and their grid (observer updated in training mode, as
    /// Paddle's `fake_quantize_*` ops do).
    pub fn quantize<const D: usize>(&self, x: Tensor<D>) -> Result<IntTensor<D>, SpecError> {
        self.check(&x)?;
        let grid = match &self.lsq {
            Some(lsq) => lsq.grid(&self.spec, &x, self.channels).forward_grid(),
            None => self.observe(&x, self.training.is_enabled()),
        };
        let Quantized { q, .. } = fake_quant::quantize(x, &grid);
        Ok(IntTensor {
            values: q.int(),
            scale: grid.step,
            zero_point: grid.zero_point,
            axis: grid.axis,
        })
    }
}

impl crate::candidates::QuantSites for FakeQuantizer {
    fn quantizers(&self) -> Vec<&FakeQuantizer> {
        vec![self]
    }
}

/// Disables the observer updates of every quantizer in `module`, leaving every other training
/// flag (BatchNorm's batch statistics) as it is: forwards then use each observer's current
/// grid.
pub fn freeze_observers<M: Module>(module: M) -> M {
    module.map(&mut FreezeObservers { containers: Vec::new() })
}

struct FreezeObservers {
    /// The container type of each module entered, innermost last.
    containers: Vec<String>,
}

impl burn::module::ModuleMapper for FreezeObservers {
    fn enter_module(&mut self, _name: &str, container_type: &str) {
        self.containers.push(container_type.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.containers.pop();
    }

    fn map_flag(&mut self, flag: Param<Flag>) -> Param<Flag> {
        if self.containers.last().is_some_and(|c| c == "Struct:FakeQuantizer") {
            flag.with_value(false)
        } else {
            flag
        }
    }
}
