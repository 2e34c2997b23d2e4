//! SGD with momentum and L2 weight decay, as PyTorch's `torch.optim.SGD(momentum=μ,
//! weight_decay=λ)` (dampening 0, not Nesterov) that pt.darts uses for the weights:
//!
//! `d = g + λ·w;  v ← d (first step) or μ·v + d;  w ← w − lr·v`.
//!
//! It does what Burn's `SgdConfig` with momentum and weight decay does, operation for
//! operation (on the CubeCL backends one launch per eight parameters:
//! [`qdarts_kernels::optim::SgdUpdates`]), but keeps its momentum buffers where the architect
//! can read them: DARTS' unrolled step is `w' = w − ξ(μ·v + ∇w L_trn + λw)`
//! (`cnn/architect.py`, pt.darts `virtual_step`).

use std::collections::HashMap;
use std::path::Path;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor};
use qdarts_kernels::optim::{SgdStep, SgdUpdates};

use crate::grads::WeightGrads;
use crate::{RunError, checkpoint_error, load_module, save_module};

/// The weight optimizer of the search and of training.
#[derive(Debug, Clone)]
pub struct Sgd {
    momentum: f64,
    weight_decay: f64,
    /// Momentum buffer per parameter, flattened, on the parameter's device (no autodiff).
    velocity: HashMap<ParamId, Tensor<1>>,
}

/// The updates of the parameters that have a gradient, in visit order: what [`Apply`] puts
/// in their place.
struct Collect<'a> {
    velocity: &'a mut HashMap<ParamId, Tensor<1>>,
    grads: GradientsParams,
    updates: SgdUpdates,
    /// Each updated parameter's index among `updates`.
    index: HashMap<ParamId, usize>,
}

impl ModuleVisitor for Collect<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let Some(grad) = self.grads.remove::<D>(param.id) else { return };
        let w = param.val().inner();
        let i = self.updates.add(w, grad, self.velocity.remove(&param.id));
        self.index.insert(param.id, i);
    }
}

/// Each updated parameter's new value and momentum buffer in its place.
struct Apply<'a> {
    velocity: &'a mut HashMap<ParamId, Tensor<1>>,
    updates: SgdUpdates,
    index: HashMap<ParamId, usize>,
}

impl ModuleMapper for Apply<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let Some(&i) = self.index.get(&param.id) else { return param };
        let (out, v) = self.updates.take::<D>(i);
        self.velocity.insert(param.id, v);
        param.map(|w| {
            let out = Tensor::from_inner(out);
            if w.is_require_grad() { out.require_grad() } else { out }
        })
    }
}

/// The parameters of a module in visit order: id, element count, device.
struct Params(Vec<(ParamId, usize, Device)>);

impl ModuleVisitor for Params {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let t = param.val();
        self.0.push((param.id, t.dims().iter().product(), t.device()));
    }
}

fn params_of<M: Module>(module: &M) -> Vec<(ParamId, usize, Device)> {
    let mut p = Params(Vec::new());
    module.visit(&mut p);
    p.0
}

/// The momentum buffers as a checkpoint file: one flattened buffer per parameter of the
/// network, in its visit order, and which of them exist (a parameter that never had a
/// gradient has none).
#[derive(Module, Debug)]
struct VelocityRecord {
    buffers: Vec<Param<Tensor<1>>>,
    present: Param<Tensor<1>>,
}

impl Sgd {
    /// An optimizer with no momentum buffers yet.
    pub fn new(momentum: f64, weight_decay: f64) -> Self {
        Sgd { momentum, weight_decay, velocity: HashMap::new() }
    }

    /// μ.
    pub fn momentum(&self) -> f64 {
        self.momentum
    }

    /// λ.
    pub fn weight_decay(&self) -> f64 {
        self.weight_decay
    }

    /// One step at learning rate `lr` on the parameters that have a gradient in `grads`, each
    /// gradient scaled by the clip's factor where it has one.
    pub fn step<M: Module>(&mut self, lr: f64, module: M, grads: WeightGrads) -> M {
        let WeightGrads { grads, scale } = grads;
        let step =
            SgdStep { decay: self.weight_decay, momentum: self.momentum, lr, grad_scale: scale };
        let updates = SgdUpdates::new(step);
        let velocity = &mut self.velocity;
        let mut collect = Collect { velocity, grads, updates, index: HashMap::new() };
        module.visit(&mut collect);
        let Collect { mut updates, index, .. } = collect;
        updates.finish();
        module.map(&mut Apply { velocity: &mut self.velocity, updates, index })
    }

    /// The momentum buffer of parameter `id` with the shape `dims` (`None` before its first
    /// step).
    pub fn velocity<const D: usize>(&self, id: ParamId, dims: [usize; D]) -> Option<Tensor<D>> {
        self.velocity.get(&id).map(|v| v.clone().reshape(dims))
    }

    /// Sets the momentum buffer of parameter `id` (a state read from elsewhere).
    pub fn set_velocity<const D: usize>(&mut self, id: ParamId, v: Tensor<D>) {
        self.velocity.insert(id, v.inner().reshape([-1]));
    }

    /// Saves the momentum buffers of `module`'s parameters.
    pub fn save<M: Module>(&self, module: &M, path: &Path) -> Result<(), RunError> {
        let params = params_of(module);
        let mut present = Vec::with_capacity(params.len());
        let mut buffers = Vec::with_capacity(params.len());
        for (id, n, device) in &params {
            let v = self.velocity.get(id);
            present.push(if v.is_some() { 1.0f32 } else { 0.0 });
            let t = v.cloned().unwrap_or_else(|| Tensor::zeros([*n], device));
            buffers.push(Param::from_tensor(t));
        }
        let device = params.first().map_or_else(Device::default, |p| p.2.clone());
        let present =
            Param::from_tensor(Tensor::<1>::from_floats(present.as_slice(), &device).inner());
        save_module(&VelocityRecord { buffers, present }, path)
    }

    /// Loads the momentum buffers of `module`'s parameters saved by [`Sgd::save`].
    pub fn load<M: Module>(mut self, module: &M, path: &Path) -> Result<Self, RunError> {
        let params = params_of(module);
        let device = params.first().map_or_else(Device::default, |p| p.2.clone());
        let empty = VelocityRecord {
            buffers: params
                .iter()
                .map(|(_, n, d)| Param::from_tensor(Tensor::<1>::zeros([*n], d).inner()))
                .collect(),
            present: Param::from_tensor(Tensor::<1>::zeros([params.len()], &device).inner()),
        };
        let record = load_module(empty, path)?;
        let present = crate::read_f32(record.present.val(), "the momentum buffers' mask")
            .map_err(|e| checkpoint_error(path, e))?;
        self.velocity.clear();
        for ((id, _, _), (buf, p)) in params.iter().zip(record.buffers.iter().zip(&present)) {
            if *p > 0.5 {
                self.velocity.insert(*id, buf.val());
            }
        }
        Ok(self)
    }
}
