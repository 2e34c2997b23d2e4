//! The architect: the gradient of the validation loss with respect to α.
//!
//! First order: `∇α L_val(w, α)`.
//!
//! Second order (DARTS eq. 7–8): with the virtual step `w' = w − ξ(∇w L_trn(w, α) + λw)`,
//!
//! `∇α L_val(w', α) − ξ · ∇²_{α,w} L_trn(w, α) · ∇w' L_val(w', α)`,
//!
//! where the Hessian-vector product is the central difference
//! `(∇α L_trn(w⁺, α) − ∇α L_trn(w⁻, α)) / (2ε)`, `w± = w ± ε·∇w' L_val(w', α)`,
//! `ε = 0.01 / ‖∇w' L_val(w', α)‖` (divided by 2ε, as DARTS does; pt.darts multiplies by ε).
//! The virtual step ignores the momentum buffer (the paper's formula).
//!
//! Nothing is mutated: `w'` and `w±` are new modules with their own BatchNorm statistics and
//! observer state, so the virtual forwards leave the real network untouched.

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::{Int, Tensor};

use crate::supernet::{Alphas, SearchNetwork};

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
    sum: Option<Tensor<1>>,
}

impl ModuleVisitor for SquaredNorm<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if let Some(g) = self.grads.get::<D>(param.id) {
            let sq = g.square().sum();
            self.sum = Some(match self.sum.take() {
                Some(acc) => acc.add(sq),
                None => sq,
            });
        }
    }
}

/// The global L2 norm of a module's gradients (as `torch.nn.utils.clip_grad_norm_` computes it).
///
/// The sum stays on the device and is read back once: this runs every training step.
pub fn grad_norm<M: Module>(grads: &GradientsParams, module: &M) -> f64 {
    let mut v = SquaredNorm { grads, sum: None };
    module.visit(&mut v);
    v.sum.map_or(0.0, |s| (s.into_scalar::<f32>() as f64).sqrt())
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
/// before clipping.
pub fn clip_grad_norm<M: Module>(grads: &mut GradientsParams, module: &M, max: f64) -> f64 {
    let norm = grad_norm(grads, module);
    if norm.is_finite() && norm > max {
        scale_grads(grads, module, (max / (norm + 1e-6)) as f32);
    }
    norm
}

struct Axpy<'a> {
    grads: &'a GradientsParams,
    keep: f32,
    step: f32,
}

impl ModuleMapper for Axpy<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let Some(g) = self.grads.get::<D>(param.id) else { return param };
        let (keep, step) = (self.keep, self.step);
        param.map(|w| {
            let w = w.detach();
            let tracked = w.is_require_grad();
            let out = w.mul_scalar(keep).add(g.mul_scalar(step)).detach();
            if tracked { out.require_grad() } else { out }
        })
    }
}

/// A copy of `module` with fresh BatchNorm statistics and observer state (same values), so that
/// forwards through it do not touch the original.
pub fn isolated<M: Module>(module: &M) -> M {
    module.valid().train()
}

/// `keep·w + step·g` for every parameter that has a gradient, as a new module.
pub fn axpy<M: Module>(module: &M, grads: &GradientsParams, keep: f32, step: f32) -> M {
    isolated(module).map(&mut Axpy { grads, keep, step })
}

/// The gradient of α as two tensors `(normal, reduce)`.
#[derive(Debug, Clone)]
pub struct AlphaGrads {
    /// `[edges, K]`.
    pub normal: Tensor<2>,
    /// `[edges, K]`.
    pub reduce: Tensor<2>,
}

impl AlphaGrads {
    fn take(grads: &mut burn::tensor::Gradients, alphas: &Alphas) -> Self {
        let g = GradientsParams::from_module(grads, alphas);
        let pick = |id| g.get::<2>(id).unwrap_or_else(|| alphas.normal.val().zeros_like().inner());
        AlphaGrads { normal: pick(alphas.normal.id), reduce: pick(alphas.reduce.id) }
    }

    /// `a·self + b·other`.
    pub fn combine(&self, a: f32, other: &AlphaGrads, b: f32) -> AlphaGrads {
        AlphaGrads {
            normal: self.normal.clone().mul_scalar(a).add(other.normal.clone().mul_scalar(b)),
            reduce: self.reduce.clone().mul_scalar(a).add(other.reduce.clone().mul_scalar(b)),
        }
    }

    /// As optimizer gradients of `alphas`.
    pub fn into_params(self, alphas: &Alphas) -> GradientsParams {
        let mut g = GradientsParams::new();
        g.register(alphas.normal.id, self.normal);
        g.register(alphas.reduce.id, self.reduce);
        g
    }
}

/// The central finite difference of the mixed Hessian `∇²_{α,w} L` along `v`:
/// `(∇α L(w + εv) − ∇α L(w − εv)) / (2ε)` with `ε = 0.01/‖v‖`, where `grad_alpha_at(m)` is
/// `∇α L` at the weights of `m`.
pub fn hessian_vector<M: Module, G>(
    model: &M,
    v: &GradientsParams,
    grad_alpha_at: impl Fn(&M) -> G,
    combine: impl Fn(&G, f32, &G, f32) -> G,
) -> G {
    let norm = grad_norm(v, model);
    let eps = if norm > 0.0 { 0.01 / norm } else { 0.0 } as f32;
    let plus = grad_alpha_at(&axpy(model, v, 1.0, eps));
    let minus = grad_alpha_at(&axpy(model, v, 1.0, -eps));
    if eps == 0.0 {
        return combine(&plus, 0.0, &minus, 0.0);
    }
    combine(&plus, 1.0 / (2.0 * eps), &minus, -1.0 / (2.0 * eps))
}

/// One batch: inputs and labels.
pub type Batch = (Tensor<4>, Tensor<1, Int>);

fn loss_of(net: &SearchNetwork, alphas: &Alphas, batch: &Batch) -> Tensor<1> {
    let (wn, wr) = alphas.weights();
    cross_entropy(net.forward(batch.0.clone(), wn, wr), batch.1.clone())
}

/// `∇α L`. The weights are taken untracked: backward then skips every weight gradient (about a
/// third of the backward pass), which only α needs here.
fn alpha_grad(net: &SearchNetwork, alphas: &Alphas, batch: &Batch) -> AlphaGrads {
    let mut g = loss_of(&net.clone().no_grad(), alphas, batch).backward();
    AlphaGrads::take(&mut g, alphas)
}

/// First-order architecture gradient.
pub fn first_order(net: &SearchNetwork, alphas: &Alphas, val: &Batch) -> AlphaGrads {
    alpha_grad(net, alphas, val)
}

/// Second-order (unrolled) architecture gradient with learning rate `xi` and weight decay
/// `weight_decay` in the virtual step.
pub fn second_order(
    net: &SearchNetwork,
    alphas: &Alphas,
    train: &Batch,
    val: &Batch,
    xi: f64,
    weight_decay: f64,
) -> AlphaGrads {
    let xi = xi as f32;
    // w' = (1 − ξλ)w − ξ∇w L_trn(w, α)
    let mut g = loss_of(&isolated(net), alphas, train).backward();
    let gw = GradientsParams::from_module(&mut g, net);
    let virtual_net = axpy(net, &gw, 1.0 - xi * weight_decay as f32, -xi);
    // ∇α and ∇w' of L_val(w', α)
    let mut g = loss_of(&virtual_net, alphas, val).backward();
    let dw = GradientsParams::from_module(&mut g, &virtual_net);
    let dalpha = AlphaGrads::take(&mut g, alphas);
    let h =
        hessian_vector(net, &dw, |m| alpha_grad(m, alphas, train), |a, x, b, y| a.combine(x, b, y));
    dalpha.combine(1.0, &h, -xi)
}
