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

use burn::module::{Module, ModuleMapper, Param};
use burn::optim::GradientsParams;
use burn::tensor::{Int, Tensor};
use qdarts_engine::grads::{cross_entropy, grad_norm};

use crate::supernet::{Alphas, SearchNetwork};

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
