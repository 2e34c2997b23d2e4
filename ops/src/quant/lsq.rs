//! LSQ (Esser et al., ICLR 2020): a learned step size per tensor or per channel, and for affine
//! specs a learned zero point (LSQ+), initialised from the first tensor the quantizer sees:
//! `s = 2·mean|x|/sqrt(Qp)` (symmetric), or the min/max grid (affine).
//!
//! How the data reaches the parameters. The parameters are created with step 0, which means
//! "not initialised" (a real step is at least [`MIN_SCALE`]) and is saved as such in a
//! checkpoint. The first forward computes the initial values from its input and keeps them
//! pending; every forward until the next optimizer step uses them (their value, with the
//! gradient going to the parameter), and the training step writes them into the parameters just
//! before the optimizer step ([`apply_init`]), so that step 1 updates the data-initialised
//! values, as MQBench's in-place initialisation on the first training forward does. Nothing
//! here is lazy: copying, saving or `valid()` before the first forward keeps the "not
//! initialised" step 0, and freezing a quantizer that never saw data is an error.
//!
//! Gradient scale: `g = 1/sqrt(N·Qp)` with N the elements that share one step (the tensor's
//! numel; numel/C per channel), as torch.ao's `_LearnableFakeQuantize` and MQBench's
//! `LearnableFakeQuantize` compute it. (The LSQ paper counts the features of one sample for
//! activations; with a batch of B that is a step gradient √B times larger.)

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use burn::module::{Module, ModuleMapper, Param, ParamId};
use burn::tensor::{Device, Tensor};

use super::fake_quant::{LearnableGrid, MIN_SCALE};
use super::observer::{channel_rows, qparams_from_min_max};
use super::spec::QuantSpec;
use crate::candidates::QuantSites;
use qdarts_kernels::reduce::{row_max, row_mean, row_min};

/// Where an LSQ quantizer's parameters are in their initialisation.
#[derive(Debug, Clone, Default)]
enum InitState {
    /// Loaded from a record: the step may or may not be initialised (read it once).
    #[default]
    Unknown,
    /// Step 0: the next forward initialises from its input.
    Uninitialised,
    /// Computed from data, not yet written into the parameters: `(step, zero point)`.
    Pending(Box<(Tensor<1>, Tensor<1>)>),
    /// The parameters hold the values to use.
    Initialised,
}

type SharedState = Arc<Mutex<InitState>>;

/// The learnable step size and zero point of an LSQ quantizer.
#[derive(Module, Debug)]
pub struct LsqParams {
    /// Step size `s`, `[C]` (0 until initialised from data).
    pub scale: Param<Tensor<1>>,
    /// Zero point, `[C]`; learnable only for affine specs (LSQ+).
    pub zero_point: Param<Tensor<1>>,
    /// Shared by the copies of this module (`valid()`, clones), so that one initialisation
    /// serves the forwards of one training step.
    #[module(skip)]
    state: SharedState,
}

fn lock(state: &SharedState) -> std::sync::MutexGuard<'_, InitState> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

impl LsqParams {
    /// Parameters of `channels` steps, not initialised.
    pub fn new(spec: &QuantSpec, channels: usize, device: &Device) -> Self {
        let zeros = || Tensor::<1>::zeros([channels], device);
        let zp = Param::from_tensor(zeros());
        LsqParams {
            scale: Param::from_tensor(zeros()),
            zero_point: if spec.is_symmetric() { zp.set_require_grad(false) } else { zp },
            state: Arc::new(Mutex::new(InitState::Uninitialised)),
        }
    }

    /// The initial (step, zero point) of `x`: `2·mean|x|/sqrt(Qp)` per channel (symmetric),
    /// or the min/max grid (affine).
    fn initial<const D: usize>(spec: &QuantSpec, x: &Tensor<D>) -> (Tensor<1>, Tensor<1>) {
        let rows = channel_rows(x.clone().detach(), spec.granularity().axis());
        if spec.is_symmetric() {
            let qp = spec.quant_range().1 as f32;
            let s = row_mean(rows.abs()).mul_scalar(2.0 / qp.sqrt()).clamp_min(MIN_SCALE);
            (s.clone(), s.zeros_like())
        } else {
            qparams_from_min_max(row_min(rows.clone()), row_max(rows), spec)
        }
    }

    /// The grid for `x` (initialising from it when the step is not initialised yet), with the
    /// LSQ gradient scale for `x`'s size.
    pub(crate) fn grid<const D: usize>(
        &self,
        spec: &QuantSpec,
        x: &Tensor<D>,
        channels: usize,
    ) -> LearnableGrid {
        let mut lg = self.current(spec);
        let mut state = lock(&self.state);
        if matches!(*state, InitState::Unknown) {
            // Read once after a load: a record saved before the first step holds step 0.
            let zero = self.scale.val().lower_equal_elem(0.0).any().into_scalar::<bool>();
            *state = if zero { InitState::Uninitialised } else { InitState::Initialised };
        }
        if matches!(*state, InitState::Uninitialised) {
            let (s, z) = Self::initial(spec, x);
            *state = InitState::Pending(Box::new((s.detach(), z.detach())));
        }
        if let InitState::Pending(pending) = &*state {
            let (s, z) = &**pending;
            // The pending value, with the gradient going to the parameter.
            let through = |p: Tensor<1>, v: &Tensor<1>| v.clone().add(p.clone().sub(p.detach()));
            lg.scale = through(lg.scale, s);
            lg.zero_point = through(lg.zero_point, z);
        }
        let n = x.dims().iter().product::<usize>() / channels;
        lg.grad_factor = 1.0 / ((n as f32) * spec.quant_range().1 as f32).sqrt();
        lg
    }

    /// The grid of the parameters as they are (no initialisation; for freeze).
    pub(crate) fn current(&self, spec: &QuantSpec) -> LearnableGrid {
        let (qmin, qmax) = spec.quant_range();
        LearnableGrid {
            scale: self.scale.val(),
            zero_point: self.zero_point.val(),
            qmin,
            qmax,
            grad_factor: 1.0,
            round: spec.round(),
            axis: spec.granularity().axis(),
        }
    }

    /// The pending initial values by parameter, to write into the parameters.
    fn take_pending(&self, out: &mut HashMap<ParamId, Tensor<1>>) {
        let mut state = lock(&self.state);
        if let InitState::Pending(pending) = &*state {
            let (s, z) = &**pending;
            out.insert(self.scale.id, s.clone());
            out.insert(self.zero_point.id, z.clone());
            *state = InitState::Initialised;
        }
    }

    /// Forgets what is known of the parameters (after they were loaded from a record).
    fn forget(&self) {
        *lock(&self.state) = InitState::Unknown;
    }
}

struct WriteInit(HashMap<ParamId, Tensor<1>>);

impl ModuleMapper for WriteInit {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let Some(v) = self.0.remove(&param.id) else { return param };
        param.map(|p| {
            let tracked = p.is_require_grad();
            let dims = p.dims();
            let out = Tensor::<D>::from_inner(v.inner().reshape(dims));
            if tracked { out.require_grad() } else { out }
        })
    }
}

/// Writes the initial values that LSQ quantizers computed from data into their parameters
/// (keeping the parameters' ids, so that the gradients of the step being taken still apply).
/// Call it before the optimizer step of every training step; it does nothing once every LSQ
/// quantizer is initialised.
pub fn apply_init<M: Module + QuantSites>(module: M) -> M {
    let mut pending = HashMap::new();
    for q in module.quantizers() {
        if let Some(lsq) = &q.lsq {
            lsq.take_pending(&mut pending);
        }
    }
    if pending.is_empty() { module } else { module.map(&mut WriteInit(pending)) }
}

/// Makes every LSQ quantizer read its parameters again before its next forward: call it after
/// loading a record into the module (a record saved before the first step is not initialised).
pub fn forget_init<M: QuantSites>(module: &M) {
    for q in module.quantizers() {
        if let Some(lsq) = &q.lsq {
            lsq.forget();
        }
    }
}
