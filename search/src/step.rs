//! One search step, as the loop and the benchmarks run it: the architecture step (α's
//! gradient, first or second order, then Adam) and the weight step (forward, backward,
//! global-norm clip, SGD with momentum).

use burn::optim::decay::WeightDecayConfig;
use burn::optim::{AdamConfig, ModuleOptimizer};
use burn::tensor::Tensor;
use qdarts_engine::grads::{Backward, cross_entropy, guarded_backward};
use qdarts_engine::{InjectSite, Sgd};
use qdarts_ops::quant::{ErrorTape, QuantPass, lsq};

use crate::architect::{self, AlphaGrads, Batch};
use crate::config::{CostCharge, Order, SearchConfig};
use crate::cost::CostModel;
use crate::supernet::{Alphas, ArchWeights, SearchNetwork};

/// The optimizers of a search as configured: SGD for the weights, Adam for α.
pub fn build_optimizers(s: &SearchConfig) -> (Sgd, ModuleOptimizer) {
    let w = Sgd::new(s.w_momentum, s.w_weight_decay);
    let a = AdamConfig::new()
        .with_beta_1(s.alpha_betas[0] as f32)
        .with_beta_2(s.alpha_betas[1] as f32)
        .with_epsilon(1e-8)
        .with_weight_decay(Some(WeightDecayConfig { penalty: s.alpha_weight_decay as f32 }))
        .init();
    (w, a)
}

/// The architecture step: α's gradient on a validation batch (first or second order), plus
/// the gradient of the cost penalty when `cost` is given (`[search.cost]`; it depends on the
/// architecture parameters only), then an Adam step. `batches` is `(train, validation)`; `lr`
/// is the current weight learning rate (ξ of the second-order virtual step) and `w_optim` the
/// weight optimizer (its momentum).
///
/// `beta_decay` is β-DARTS' λ at this epoch ([`crate::config::GuardConfig::beta_decay_at`];
/// 0: off): the gradient of `λ·`[`beta_decay_loss`] is added to α's.
#[allow(clippy::too_many_arguments)]
pub fn arch_step(
    net: &mut SearchNetwork,
    alphas: Alphas,
    (optim, w_optim): (&mut ModuleOptimizer, &Sgd),
    (train, val): (&Batch, &Batch),
    lr: f64,
    s: &SearchConfig,
    cost: Option<&CostModel>,
    beta_decay: f64,
) -> Alphas {
    let mut da = match s.order {
        Order::First => architect::first_order(net, &alphas, val),
        Order::Second => architect::second_order(net, &alphas, train, val, lr, w_optim),
    };
    if beta_decay != 0.0 {
        let mut g = beta_decay_loss(&alphas).backward();
        da = da.combine(1.0, &AlphaGrads::take(&mut g, &alphas), beta_decay as f32);
    }
    if let (Some(model), Some(c)) = (cost, &s.cost) {
        let mut arch = alphas.arch();
        if c.charge == CostCharge::Bits {
            arch.normal = arch.normal.detach();
            arch.reduce = arch.reduce.detach();
        }
        let mut g = model.penalty(c.metric, &c.penalty(), &arch).backward();
        da = da.combine(1.0, &AlphaGrads::take(&mut g, &alphas), 1.0);
    }
    let grads = da.into_params(&alphas);
    optim.step(s.alpha_lr, alphas, grads)
}

/// β-DARTS' regularisation of α (Ye et al., CVPR 2022, the reference code's `mlc_loss`): the
/// mean over every edge of both cell types of `logsumexp(α_edge)`. Its gradient is
/// `softmax(α_edge)/edges` per edge, which pulls every α of an edge down by its own weight
/// and so keeps α's magnitudes (and the softmax's sharpness) from running away.
pub fn beta_decay_loss(alphas: &Alphas) -> Tensor<1> {
    let a = Tensor::cat(vec![alphas.normal.val(), alphas.reduce.val()], 0);
    let max = a.clone().max_dim(1).detach();
    let lse = a.sub(max.clone()).exp().sum_dim(1).log().add(max);
    lse.mean()
}

/// The weight step's forward and guarded backward on a training batch (α detached): the
/// clipped gradients, the loss, any non-finite loss or gradient, and the logits. `arch`:
/// the architecture weights to use instead of `alphas.arch()` (SDARTS-RS' smoothed ones).
/// `errors`: where the quantizers record their error statistics, if anywhere.
pub fn weight_backward(
    net: &SearchNetwork,
    alphas: &Alphas,
    train: &Batch,
    inject: Option<InjectSite>,
    s: &SearchConfig,
    arch: Option<ArchWeights>,
    errors: Option<&ErrorTape>,
) -> (Backward, Tensor<2>) {
    let arch = arch.unwrap_or_else(|| alphas.arch()).detach();
    let logits = net.forward_in(train.0.clone(), arch, QuantPass::recording(errors));
    let loss = cross_entropy(logits.clone(), train.1.clone());
    (guarded_backward(net, loss, inject, s.w_grad_clip), logits)
}

/// The whole weight step: [`weight_backward`], then SGD at `lr`. Returns the new network and
/// the training loss.
pub fn weight_step(
    net: SearchNetwork,
    alphas: &Alphas,
    optim: &mut Sgd,
    train: &Batch,
    lr: f64,
    s: &SearchConfig,
) -> (SearchNetwork, f64) {
    let (back, _) = weight_backward(&net, alphas, train, None, s, None, None);
    let net = lsq::apply_init(net);
    (optim.step(lr, net, back.grads), back.loss)
}
