//! Losses and gradient utilities shared by the search and training steps: cross-entropy,
//! top-1 counts, the global gradient norm and its clip (as `torch.nn.utils.clip_grad_norm_`),
//! and the guarded backward pass that reports non-finite losses and gradients.

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::{Int, Tensor};
use qdarts_kernels::optim::SquaredSum;
use qdarts_record::NanSite;

use crate::config::InjectSite;

/// Mean cross-entropy of logits `[N, K]` against labels `[N]`.
pub fn cross_entropy(logits: Tensor<2>, labels: Tensor<1, Int>) -> Tensor<1> {
    let [n, _] = logits.dims();
    let logp = burn::tensor::activation::log_softmax(logits, 1);
    logp.gather(1, labels.reshape([n, 1])).mean().neg()
}

/// Number of correct top-1 predictions.
pub fn correct(logits: Tensor<2>, labels: Tensor<1, Int>) -> usize {
    let [n, _] = logits.dims();
    let pred = logits.argmax(1).reshape([n]);
    pred.equal(labels).int().sum().into_scalar::<i64>() as usize
}

struct SquaredNorm<'a> {
    grads: &'a GradientsParams,
    /// Σ g² over the parameters seen so far, kept on the device.
    sum: SquaredSum,
}

impl ModuleVisitor for SquaredNorm<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if let Some(g) = self.grads.get::<D>(param.id) {
            self.sum.add(g);
        }
    }
}

/// The global L2 norm of a module's gradients (as `torch.nn.utils.clip_grad_norm_` computes it).
///
/// The sum stays on the device and is read back once: this runs every training step.
pub fn grad_norm<M: Module>(grads: &GradientsParams, module: &M) -> f64 {
    let mut v = SquaredNorm { grads, sum: SquaredSum::new() };
    module.visit(&mut v);
    v.sum.total().map_or(0.0, |s| (s.into_scalar::<f32>() as f64).sqrt())
}

struct Scale<'a> {
    grads: &'a mut GradientsParams,
    factor: f32,
}

impl ModuleVisitor for Scale<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if let Some(g) = self.grads.remove::<D>(param.id) {
            self.grads.register(param.id, g.mul_scalar(self.factor));
        }
    }
}

struct FirstNonFinite<'a> {
    grads: &'a GradientsParams,
    path: Vec<String>,
    found: Option<String>,
}

impl ModuleVisitor for FirstNonFinite<'_> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if self.found.is_some() {
            return;
        }
        if let Some(g) = self.grads.get::<D>(param.id)
            && !g.is_finite().all().into_scalar::<bool>()
        {
            self.found = Some(self.path.join("."));
        }
    }
}

/// The module path of the first parameter whose gradient holds a non-finite value.
pub fn first_non_finite_grad<M: Module>(grads: &GradientsParams, module: &M) -> Option<String> {
    let mut v = FirstNonFinite { grads, path: Vec::new(), found: None };
    module.visit(&mut v);
    v.found
}

/// Multiplies every gradient of `module` by `factor`.
pub fn scale_grads<M: Module>(grads: &mut GradientsParams, module: &M, factor: f32) {
    module.visit(&mut Scale { grads, factor });
}

/// Clips the global gradient norm to `max` (PyTorch's `clip_grad_norm_`); returns the norm
/// before clipping. Gradients whose norm is not finite are left as they are.
pub fn clip_grad_norm<M: Module>(grads: &mut GradientsParams, module: &M, max: f64) -> f64 {
    let norm = grad_norm(grads, module);
    if let Some(factor) = clip_factor(norm, max) {
        scale_grads(grads, module, factor);
    }
    norm
}

/// The factor `clip_grad_norm_` scales gradients of global norm `norm` by under the clip `max`:
/// `max / (norm + 1e-6)` where a finite norm exceeds `max`, else none.
pub fn clip_factor(norm: f64, max: f64) -> Option<f32> {
    (norm.is_finite() && norm > max).then(|| (max / (norm + 1e-6)) as f32)
}

/// A weight step's gradients and the factor the global-norm clip scales them by, which the
/// optimizer applies in its update ([`crate::sgd::Sgd::step`]: the same `g·s` as
/// `clip_grad_norm_`'s, without a launch per parameter of its own on a GPU).
#[derive(Debug)]
pub struct WeightGrads {
    /// The gradients, unscaled.
    pub grads: GradientsParams,
    /// The clip's factor, where the clip acts.
    pub scale: Option<f32>,
}

/// A non-finite value found during a step, before the guard decides what to do.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// Where.
    pub site: NanSite,
    /// Layer path.
    pub layer: String,
    /// The value.
    pub value: f64,
}

impl Event {
    /// An event at `site` in `layer`.
    pub fn new(site: NanSite, layer: impl Into<String>, value: f64) -> Self {
        Event { site, layer: layer.into(), value }
    }
}

/// What a guarded backward pass produced.
#[derive(Debug)]
pub struct Backward {
    /// The loss value.
    pub loss: f64,
    /// The module's gradients, with the factor that clips them to the global norm.
    pub grads: WeightGrads,
    /// A non-finite loss, or else a non-finite gradient norm (with the first layer at fault).
    pub events: Vec<Event>,
}

/// Backward of `loss` through `module`: its gradients clipped to the global norm `clip`, and
/// any non-finite loss or gradient reported. `inject` makes the loss or the gradients NaN
/// (tests of the guard).
pub fn guarded_backward<M: Module>(
    module: &M,
    loss: Tensor<1>,
    inject: Option<InjectSite>,
    clip: f64,
) -> Backward {
    let loss = if inject == Some(InjectSite::Loss) { loss.mul_scalar(f32::NAN) } else { loss };
    let value = loss.clone().into_scalar::<f32>() as f64;
    let mut grads = loss.backward();
    let mut gw = GradientsParams::from_module(&mut grads, module);
    if inject == Some(InjectSite::Grad) {
        scale_grads(&mut gw, module, f32::NAN);
    }
    let norm = grad_norm(&gw, module);
    let mut events = Vec::new();
    if !value.is_finite() {
        events.push(Event::new(NanSite::Loss, "loss", value));
    } else if !norm.is_finite() {
        let layer = first_non_finite_grad(&gw, module).unwrap_or_else(|| "net".into());
        events.push(Event::new(NanSite::Grad, layer, norm));
    }
    let grads = WeightGrads { grads: gw, scale: clip_factor(norm, clip) };
    Backward { loss: value, grads, events }
}
