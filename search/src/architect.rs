//! The architect: the gradient of the validation loss with respect to α.
//!
//! First order: `∇α L_val(w, α)`, on the network as it is (in training mode, as pt.darts:
//! BatchNorm uses the batch and updates its running statistics, observers update).
//!
//! Second order (DARTS eq. 7–8, `cnn/architect.py`): with the virtual step
//! `w' = w − ξ(μ·v + ∇w L_trn(w, α) + λw)` (`v` the weight optimizer's momentum buffer, μ its
//! momentum, λ its weight decay, ξ the current weight learning rate),
//!
//! `∇α L_val(w', α) − ξ · ∇²_{α,w} L_trn(w, α) · ∇w' L_val(w', α)`,
//!
//! where the Hessian-vector product is the central difference
//! `(∇α L_trn(w⁺, α) − ∇α L_trn(w⁻, α)) / (2ε)`, `w± = w ± ε·∇w' L_val(w', α)`,
//! `ε = 0.01 / ‖∇w' L_val(w', α)‖` (divided by 2ε, as DARTS does; pt.darts multiplies by ε).
//!
//! Under fake quantization. The second-order gradient runs on a copy of the network with its
//! own BatchNorm statistics (normalising with the batch, as in training) and observers. The
//! pass at `w` on the training batch updates the copy's observers (as pt.darts' network in
//! this pass would); after it every observer is frozen, so `w'` and `w±` are quantized on one
//! set of grids and none of them moves an observer. The `w±` passes hold each quantizer's
//! rounding and clipping as it was in the pass at `w` (see [`qdarts_ops::quant::hold`]), so
//! the central difference is the mixed Hessian of the straight-through surrogate the gradients
//! already use, not a count of rounding flips divided by 2ε. The ReLUs and max pools that read
//! a held tensor keep the mask and the maxima they had at `w` as well (the step to `w±` moves
//! activations by a few grid steps, and a value at exactly 0 or a tie would otherwise add an
//! O(1)/2ε term): the difference is then the Hessian-vector product of the piece autograd
//! differentiates at `w`, and it converges as ε shrinks. Weights are quantized on their own
//! current values throughout. With the `float` preset this is DARTS' computation exactly.
//!
//! Nothing is mutated: `w'` and `w±` are new modules; the real network's weights, BatchNorm
//! statistics and observers are untouched.

use std::collections::HashMap;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::{Int, Tensor};
use qdarts_engine::Sgd;
use qdarts_engine::grads::{cross_entropy, grad_norm};
use qdarts_kernels::optim::{Move, Moves};
use qdarts_ops::buffer::adopt_buffers;
use qdarts_ops::quant::{Hold, HoldTape, QuantPass, freeze_observers};

use crate::supernet::{Alphas, SearchNetwork};

/// Every parameter of a module with a direction in `grads`, added to `moves` (with its
/// momentum buffer from `optim` where there is one): each one's index there.
struct Collect<'a> {
    grads: &'a GradientsParams,
    optim: Option<&'a Sgd>,
    moves: Moves,
    index: HashMap<ParamId, usize>,
}

impl ModuleVisitor for Collect<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let Some(g) = self.grads.get::<D>(param.id) else { return };
        let w = param.val();
        let v = self.optim.and_then(|o| o.velocity::<D>(param.id, w.dims()));
        let i = self.moves.add(w, g, v.map(|v| v.reshape([-1])));
        self.index.insert(param.id, i);
    }
}

/// Each moved parameter's result in its place (tracked where the parameter was).
struct Apply {
    moves: Moves,
    index: HashMap<ParamId, usize>,
}

impl ModuleMapper for Apply {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let Some(&i) = self.index.get(&param.id) else { return param };
        let out = Tensor::from_inner(self.moves.take::<D>(i));
        param.map(|w| if w.is_require_grad() { out.require_grad() } else { out })
    }
}

/// `rule` on every parameter of `module` with a direction in `grads`, as a new module (on the
/// CubeCL backends eight parameters a launch: [`Moves`]).
fn moved<M: Module>(module: &M, grads: &GradientsParams, rule: Move, optim: Option<&Sgd>) -> M {
    let mut collect = Collect { grads, optim, moves: Moves::new(rule), index: HashMap::new() };
    module.visit(&mut collect);
    let Collect { mut moves, index, .. } = collect;
    moves.finish();
    module.clone().map(&mut Apply { moves, index })
}

/// `keep·w + step·g` for every parameter that has a gradient, as a new module (with its own
/// copy of `module`'s BatchNorm statistics and observer state: a clone owns its
/// [`Buffer`](qdarts_ops::buffer::Buffer)s).
pub fn axpy<M: Module>(module: &M, grads: &GradientsParams, keep: f32, step: f32) -> M {
    moved(module, grads, Move::Axpy { keep, step }, None)
}

/// The gradient of α as two tensors `(normal, reduce)`, and of PC-DARTS' β when edges are
/// normalized.
#[derive(Debug, Clone)]
pub struct AlphaGrads {
    /// `[edges, K]`.
    pub normal: Tensor<2>,
    /// `[edges, K]`.
    pub reduce: Tensor<2>,
    /// `[edges]`, with edge normalization.
    pub edge_normal: Option<Tensor<1>>,
    /// `[edges]`, with edge normalization.
    pub edge_reduce: Option<Tensor<1>>,
    /// With a bit-width search, of the bit-width parameters, in [`crate::supernet::BitAlphas::params`]' order.
    pub bits: Option<[Tensor<3>; 4]>,
}

fn lin<const D: usize>(x: &Tensor<D>, a: f32, y: &Tensor<D>, b: f32) -> Tensor<D> {
    x.clone().mul_scalar(a).add(y.clone().mul_scalar(b))
}

impl AlphaGrads {
    /// The gradients of `alphas`' parameters in `grads` (zero where there is none).
    pub fn take(grads: &mut burn::tensor::Gradients, alphas: &Alphas) -> Self {
        let g = GradientsParams::from_module(grads, alphas);
        let pick = |id| g.get::<2>(id).unwrap_or_else(|| alphas.normal.val().zeros_like().inner());
        let edge = |b: &Option<Param<Tensor<1>>>| {
            b.as_ref().map(|b| g.get::<1>(b.id).unwrap_or_else(|| b.val().zeros_like().inner()))
        };
        let bits = alphas.bits.as_ref().map(|b| {
            b.params().map(|p| g.get::<3>(p.id).unwrap_or_else(|| p.val().zeros_like().inner()))
        });
        AlphaGrads {
            normal: pick(alphas.normal.id),
            reduce: pick(alphas.reduce.id),
            edge_normal: edge(&alphas.edge_normal),
            edge_reduce: edge(&alphas.edge_reduce),
            bits,
        }
    }

    /// `a·self + b·other`.
    pub fn combine(&self, a: f32, other: &AlphaGrads, b: f32) -> AlphaGrads {
        let edge = |x: &Option<Tensor<1>>, y: &Option<Tensor<1>>| match (x, y) {
            (Some(x), Some(y)) => Some(lin(x, a, y, b)),
            _ => None,
        };
        AlphaGrads {
            normal: lin(&self.normal, a, &other.normal, b),
            reduce: lin(&self.reduce, a, &other.reduce, b),
            edge_normal: edge(&self.edge_normal, &other.edge_normal),
            edge_reduce: edge(&self.edge_reduce, &other.edge_reduce),
            bits: match (&self.bits, &other.bits) {
                (Some(x), Some(y)) => Some(std::array::from_fn(|i| lin(&x[i], a, &y[i], b))),
                _ => None,
            },
        }
    }

    /// As optimizer gradients of `alphas`.
    pub fn into_params(self, alphas: &Alphas) -> GradientsParams {
        let mut g = GradientsParams::new();
        g.register(alphas.normal.id, self.normal);
        g.register(alphas.reduce.id, self.reduce);
        for (p, t) in
            [(&alphas.edge_normal, self.edge_normal), (&alphas.edge_reduce, self.edge_reduce)]
        {
            if let (Some(p), Some(t)) = (p, t) {
                g.register(p.id, t);
            }
        }
        if let (Some(p), Some(t)) = (&alphas.bits, self.bits) {
            for (p, t) in p.params().into_iter().zip(t) {
                g.register(p.id, t);
            }
        }
        g
    }
}

/// DARTS' radius of the central difference: `ε = RADIUS/‖v‖`.
pub const RADIUS: f64 = 0.01;

/// The central finite difference of the mixed Hessian `∇²_{α,w} L` along `v`:
/// `(∇α L(w + εv) − ∇α L(w − εv)) / (2ε)` with `ε = radius/‖v‖` (DARTS: [`RADIUS`]), where
/// `grad_alpha_at(m)` is `∇α L` at the weights of `m`.
pub fn hessian_vector<M: Module, G>(
    model: &M,
    v: &GradientsParams,
    radius: f64,
    grad_alpha_at: impl Fn(&M) -> G,
    combine: impl Fn(&G, f32, &G, f32) -> G,
) -> G {
    let norm = grad_norm(v, model);
    let eps = if norm > 0.0 { radius / norm } else { 0.0 } as f32;
    let plus = grad_alpha_at(&axpy(model, v, 1.0, eps));
    let minus = grad_alpha_at(&axpy(model, v, 1.0, -eps));
    if eps == 0.0 {
        return combine(&plus, 0.0, &minus, 0.0);
    }
    combine(&plus, 1.0 / (2.0 * eps), &minus, -1.0 / (2.0 * eps))
}

/// One batch: inputs and labels.
pub type Batch = (Tensor<4>, Tensor<1, Int>);

/// The loss of `batch`, the quantizers in the pass `qp`.
fn loss_of(net: &SearchNetwork, alphas: &Alphas, batch: &Batch, qp: QuantPass) -> Tensor<1> {
    cross_entropy(net.forward_in(batch.0.clone(), alphas.arch(), qp), batch.1.clone())
}

/// `∇α L` through `untracked`, a copy of a network with its weights untracked
/// (`no_grad`): backward then skips every weight gradient (about a third of the backward
/// pass), which only α needs here.
fn alpha_grad(
    untracked: &SearchNetwork,
    alphas: &Alphas,
    batch: &Batch,
    qp: QuantPass,
) -> AlphaGrads {
    let mut g = loss_of(untracked, alphas, batch, qp).backward();
    AlphaGrads::take(&mut g, alphas)
}

/// First-order architecture gradient. The pass runs on a copy of `net` with its weights
/// untracked; its BatchNorm statistics and observer state, which saw the validation batch, are
/// handed back to `net` (as pt.darts' network sees that batch in this pass).
pub fn first_order(net: &mut SearchNetwork, alphas: &Alphas, val: &Batch) -> AlphaGrads {
    let copy = net.clone().no_grad();
    let grads = alpha_grad(&copy, alphas, val, QuantPass::OFF);
    *net = adopt_buffers(net.clone(), &copy);
    grads
}

/// Second-order (unrolled) architecture gradient: `xi` is the current weight learning rate,
/// `w_optim` the weight optimizer (its momentum buffers, momentum and weight decay).
pub fn second_order(
    net: &SearchNetwork,
    alphas: &Alphas,
    train: &Batch,
    val: &Batch,
    xi: f64,
    w_optim: &Sgd,
) -> AlphaGrads {
    let (dalpha, h) = second_order_parts(net, alphas, (train, val), xi, w_optim);
    dalpha.combine(1.0, &h, -(xi as f32))
}

/// The two parts of the second-order gradient: `∇α L_val(w', α)` and the Hessian-vector
/// product `∇²_{α,w} L_trn(w, α) · ∇w' L_val(w', α)`.
pub fn second_order_parts(
    net: &SearchNetwork,
    alphas: &Alphas,
    batches: (&Batch, &Batch),
    xi: f64,
    w_optim: &Sgd,
) -> (AlphaGrads, AlphaGrads) {
    second_order_parts_at(net, alphas, batches, xi, w_optim, RADIUS)
}

/// [`second_order_parts`] with the central difference's radius `ε·‖v‖` given (DARTS:
/// [`RADIUS`]): under fake quantization, with every rounding and kink held, the product
/// hardly moves as the radius shrinks.
pub fn second_order_parts_at(
    net: &SearchNetwork,
    alphas: &Alphas,
    (train, val): (&Batch, &Batch),
    xi: f64,
    w_optim: &Sgd,
    radius: f64,
) -> (AlphaGrads, AlphaGrads) {
    // A copy with its own BatchNorm statistics and observers (a clone owns them). At w on the
    // training batch: ∇w L_trn(w, α), and each quantizer's rounding, held for w± on a tape
    // this step owns, keyed by quantizer, so that the copies made below (frozen, moved to w±)
    // find their own. The copy's observers see this batch (as pt.darts' network does in this
    // pass, which is how they have a grid at step 1), then stay frozen.
    let tape = HoldTape::default();
    let copy = net.clone();
    let mut g = loss_of(&copy, alphas, train, QuantPass::held(Hold::Record(&tape))).backward();
    let gw = GradientsParams::from_module(&mut g, &copy);
    let frozen = freeze_observers(copy);
    // w' = w − ξ(μ·v + ∇w L_trn + λw); ∇α and ∇w' of L_val(w', α), quantized as usual.
    let (momentum, decay) = (w_optim.momentum(), w_optim.weight_decay());
    let virtual_net = moved(&frozen, &gw, Move::Virtual { momentum, decay, xi }, Some(w_optim));
    let mut g = loss_of(&virtual_net, alphas, val, QuantPass::OFF).backward();
    let dw = GradientsParams::from_module(&mut g, &virtual_net);
    let dalpha = AlphaGrads::take(&mut g, alphas);
    // The mixed Hessian times ∇w' L_val at w, with the rounding held.
    let h = hessian_vector(
        &frozen,
        &dw,
        radius,
        |m| {
            let replay = QuantPass::held(Hold::Replay(&tape));
            alpha_grad(&m.clone().no_grad(), alphas, train, replay)
        },
        |a, x, b, y| a.combine(x, b, y),
    );
    (dalpha, h)
}
