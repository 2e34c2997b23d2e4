//! The architect's finite-difference Hessian-vector product on a quadratic whose mixed Hessian
//! is known in closed form, and the global gradient-norm clip.

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use burn::module::{Module, Param};
use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor, TensorData};
use qdarts_engine::grads::{clip_grad_norm, grad_norm};
use qdarts_search::architect::hessian_vector;

mod common;
use common::tiny_shape;

#[derive(Module, Debug)]
struct W {
    w: Param<Tensor<1>>,
}

const B: [[f32; 3]; 2] = [[1.0, -2.0, 0.5], [3.0, 0.25, -1.0]];

fn dev() -> Device {
    Device::flex().autodiff()
}

fn vals(t: Tensor<1>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
}

/// ∇α of L(w, α) = αᵀBw + ½(wᵀw)(αᵀα), by autodiff, at α.
fn grad_alpha(m: &W, alpha: &[f32; 2]) -> Vec<f32> {
    let d = dev();
    let a = Tensor::<1>::from_floats(*alpha, &d).require_grad();
    let b = Tensor::<2>::from_data(TensorData::new(B.concat(), [2, 3]), &d);
    let w = m.w.val();
    let bw = b.matmul(w.clone().reshape([3, 1])).reshape([2]);
    let l =
        a.clone().mul(bw).sum().add(w.square().sum().mul(a.clone().square().sum()).mul_scalar(0.5));
    vals(a.grad(&l.backward()).unwrap())
}

#[test]
fn central_difference_recovers_the_mixed_hessian_times_a_vector() {
    // ∇α L = Bw + α(wᵀw), so ∂(∇α L)/∂w · v = Bv + 2α(wᵀv): exact for central differences,
    // since ∇α L is quadratic in w. (pt.darts' `(p - n) / 2.*eps` would return ε²/4 of it.)
    let (w0, v, alpha) = ([0.3f32, -1.2, 2.0], [0.7f32, 0.1, -0.4], [0.6f32, -0.9]);
    let m = W { w: Param::from_tensor(Tensor::from_floats(w0, &dev())) };
    let mut g = GradientsParams::new();
    g.register(m.w.id, Tensor::<1>::from_floats(v, &Device::flex()));
    let hv = hessian_vector(
        &m,
        &g,
        qdarts_search::architect::RADIUS,
        |m| grad_alpha(m, &alpha),
        |a, x, b, y| a.iter().zip(b).map(|(p, q)| p * x + q * y).collect::<Vec<f32>>(),
    );
    let wv: f32 = w0.iter().zip(&v).map(|(a, b)| a * b).sum();
    for i in 0..2 {
        let want = B[i].iter().zip(&v).map(|(b, x)| b * x).sum::<f32>() + 2.0 * alpha[i] * wv;
        // ε = 0.01/‖v‖ makes the f32 difference quotient lose ~1e-3 relative.
        assert!((hv[i] - want).abs() < 2e-3 * want.abs().max(1.0), "row {i}: {} vs {want}", hv[i]);
    }
}

#[test]
fn the_global_norm_clip_scales_all_gradients_together() {
    let m = W { w: Param::from_tensor(Tensor::from_floats([1.0, 2.0], &dev())) };
    let mut g = GradientsParams::new();
    g.register(m.w.id, Tensor::<1>::from_floats([3.0, 4.0], &Device::flex()));
    assert!((grad_norm(&g, &m) - 5.0).abs() < 1e-6);
    let before = clip_grad_norm(&mut g, &m, 1.0);
    assert!((before - 5.0).abs() < 1e-6);
    let after = vals(g.get::<1>(m.w.id).unwrap());
    assert!((after[0] - 0.6).abs() < 1e-5 && (after[1] - 0.8).abs() < 1e-5, "{after:?}");
}

/// The first-order architect takes the weights untracked to skip their gradients: its α
/// gradient must equal the one of a plain backward with tracked weights, and the network it
/// was given must still train (its weights keep their gradients).
#[test]
fn first_order_alpha_gradient_skips_weights_without_changing_alpha_or_the_network() {
    use burn::tensor::{Distribution, Int};
    use qdarts_ops::qconfig::QuantConfig;
    use qdarts_search::architect::first_order;
    use qdarts_search::supernet::{Alphas, SearchNetwork};

    let d = dev();
    let shape = tiny_shape(2);
    // Float: stateful observers would see two different batches histories between the calls.
    let (mut net, alphas, x) = qdarts_ops::seeded(&d, 19, || {
        let net = SearchNetwork::new(&shape, &QuantConfig::float(), &d).unwrap();
        let alphas = Alphas::new(2, 8, &d);
        let x = Tensor::<4>::random([4, 1, 12, 12], Distribution::Normal(0.0, 1.0), &d);
        (net, alphas, x)
    });
    let y = Tensor::<1, Int>::from_ints([1, 3, 5, 7], &d);
    let loss = |n: &SearchNetwork| {
        let (wn, wr) = alphas.weights();
        burn::nn::loss::CrossEntropyLossConfig::new()
            .init(&d)
            .forward(n.forward(x.clone(), wn, wr), y.clone())
    };
    let mut plain = loss(&net).backward();
    let want = GradientsParams::from_module(&mut plain, &alphas);
    let got = first_order(&mut net, &alphas, &(x.clone(), y.clone()));
    let normal: Tensor<2> = want.get(alphas.normal.id).unwrap();
    let a = vals(normal.reshape([-1]));
    let b = vals(got.normal.reshape([-1]));
    let diff = a.iter().zip(&b).fold(0f32, |m, (p, q)| m.max((p - q).abs()));
    let scale = a.iter().fold(0f32, |m, p| m.max(p.abs()));
    assert!(scale > 0.0 && diff <= 1e-5 * scale, "α gradient moved by {diff} (scale {scale})");

    let mut g = loss(&net).backward();
    let gw = GradientsParams::from_module(&mut g, &net);
    let mut n_params = 0;
    net.visit(&mut CountParams(&mut n_params));
    assert!(n_params > 0 && gw.len() >= n_params, "{} gradients for {n_params} weights", gw.len());
}

/// Counts float parameters that require gradients.
struct CountParams<'a>(&'a mut usize);

impl burn::module::ModuleVisitor for CountParams<'_> {
    fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
        if p.val().is_require_grad() {
            *self.0 += 1;
        }
    }
}

/// A tiny supernet under `quant`, one weight step taken (observers and momentum have state),
/// α, and a training and a validation batch of the embedded data.
fn trained_tiny(
    quant: qdarts_ops::qconfig::Preset,
) -> (
    qdarts_search::supernet::SearchNetwork,
    qdarts_search::supernet::Alphas,
    qdarts_engine::Sgd,
    qdarts_search::architect::Batch,
    qdarts_search::architect::Batch,
) {
    use qdarts_ops::qconfig::QuantConfig;
    use qdarts_search::config::SearchConfig;
    use qdarts_search::step::{build_optimizers, weight_step};
    use qdarts_search::supernet::{Alphas, SearchNetwork};

    let d = dev();
    let shape = tiny_shape(1);
    let (net, alphas) = qdarts_ops::seeded(&d, 29, || {
        let net = SearchNetwork::new(&shape, &QuantConfig::preset(quant), &d).unwrap();
        (net, Alphas::new(2, 8, &d))
    });
    let set = qdarts_data::embedded(true).unwrap();
    let kind = qdarts_data::DatasetKind::FashionMnist;
    let train = qdarts_data::batch(&set, kind, &(0..16).collect::<Vec<_>>(), None, &d);
    let val = qdarts_data::batch(&set, kind, &(16..32).collect::<Vec<_>>(), None, &d);
    let s = SearchConfig::with_defaults(1, 16);
    let (mut w_optim, _) = build_optimizers(&s);
    let (net, _) = weight_step(net, &alphas, &mut w_optim, &train, 0.025, &s);
    (net, alphas, w_optim, train, val)
}

fn flat(g: &qdarts_search::architect::AlphaGrads) -> Vec<f32> {
    let mut v = vals(g.normal.clone().reshape([-1]));
    v.extend(vals(g.reduce.clone().reshape([-1])));
    v
}

#[test]
fn the_second_order_gradient_is_finite_under_fake_quant() {
    use qdarts_ops::qconfig::Preset;
    use qdarts_search::architect::second_order_parts;

    for preset in [Preset::Float, Preset::Tensorrt] {
        let (net, alphas, w_optim, train, val) = trained_tiny(preset);
        let (d, h) = second_order_parts(&net, &alphas, (&train, &val), 0.025, &w_optim);
        let (d, h) = (flat(&d), flat(&h));
        assert!(d.iter().chain(&h).all(|v| v.is_finite()), "{preset:?}");
        assert!(h.iter().any(|v| *v != 0.0), "{preset:?}: no Hessian term");
    }
}

#[test]
fn the_second_order_gradient_leaves_the_real_network_as_it_was() {
    use qdarts_ops::qconfig::Preset;
    use qdarts_search::architect::second_order;

    let (net, alphas, w_optim, train, val) = trained_tiny(Preset::Tensorrt);
    let probe = |n: &qdarts_search::supernet::SearchNetwork| {
        let (wn, wr) = alphas.valid().weights();
        vals(n.valid().forward(val.0.clone().inner(), wn, wr).reshape([-1]))
    };
    let before = probe(&net);
    let _ = second_order(&net, &alphas, &train, &val, 0.025, &w_optim);
    assert_eq!(probe(&net), before, "BatchNorm statistics or observers moved");
}

/// Under fake quantization the central difference holds every rounding, clipping, ReLU mask and
/// max-pool choice as it was at `w`, so it is the Hessian-vector product of one smooth piece
/// and stays put as the radius shrinks (PyTorch's reference, held the same way: 1.9e-3 from
/// radius 0.01 to 0.0025, and it agrees with its double-backward product to 2e-3). Left
/// unheld, every activation at exactly 0 before a ReLU, or tied in a pooling window, adds
/// O(1)/2ε: the reference's product grew 1.7× from radius 0.01 to 0.0025 and 3.6× to 0.000625.
#[test]
fn the_held_hessian_vector_product_converges_as_the_radius_shrinks() {
    use qdarts_ops::qconfig::Preset;
    use qdarts_search::architect::second_order_parts_at;

    let (net, alphas, w_optim, train, val) = trained_tiny(Preset::Tensorrt);
    let at =
        |r: f64| flat(&second_order_parts_at(&net, &alphas, (&train, &val), 0.025, &w_optim, r).1);
    let (wide, narrow) = (at(0.01), at(0.0025));
    let scale = wide.iter().fold(0f32, |m, v| m.max(v.abs()));
    let diff = wide.iter().zip(&narrow).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(scale > 0.0, "no Hessian term");
    assert!(
        diff <= 2e-2 * scale,
        "radius 0.01 → 0.0025 moved the product by {} of its largest value",
        diff / scale
    );
}
