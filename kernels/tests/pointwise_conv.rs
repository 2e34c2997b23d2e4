//! The 1×1 convolutions as matrix products against Burn's own `conv2d` (forward, input
//! gradient and weight gradient), at the candidates' geometries and odd ones.

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use burn::tensor::ops::ConvOptions;
use burn::tensor::{Device, Distribution, Tensor, module};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use qdarts_kernels::pointwise_conv::{conv2d, is_pointwise};

fn vals<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
}

/// Output, ∂x and ∂w of `conv` on a seeded `[n, ci, h, w]` input and `[co, ci, 1, 1]` weight at
/// `stride`, with an upstream gradient that differs from output to output.
fn run(
    [n, ci, co, h, w]: [usize; 5],
    stride: [usize; 2],
    seed: u64,
    conv: impl Fn(Tensor<4>, Tensor<4>, ConvOptions<2>) -> Tensor<4>,
) -> [Vec<f32>; 3] {
    let d = Device::flex().autodiff();
    let (x, wt) = qdarts_kernels::devices::seeded(&d, seed, || {
        let normal = Distribution::Normal(0.0, 1.0);
        (
            Tensor::<4>::random([n, ci, h, w], normal, &d),
            Tensor::<4>::random([co, ci, 1, 1], normal, &d),
        )
    });
    let (x, wt) = (x.require_grad(), wt.require_grad());
    let y = conv(x.clone(), wt.clone(), ConvOptions::new(stride, [0, 0], [1, 1], 1));
    let up = y.clone().detach().mul_scalar(0.7).add_scalar(0.3).sin();
    let grads = y.clone().mul(up).sum().backward();
    [vals(y), vals(x.grad(&grads).unwrap()), vals(wt.grad(&grads).unwrap())]
}

fn check(dims: [usize; 5], stride: [usize; 2], seed: u64) -> Result<(), String> {
    let ours = run(dims, stride, seed, conv2d);
    let burn = run(dims, stride, seed, |x, w, o| module::conv2d(x, w, None, o));
    for (what, a, b) in [("output", 0), ("∂x", 1), ("∂w", 2)].map(|(w, i)| (w, &ours[i], &burn[i]))
    {
        if a.len() != b.len() {
            return Err(format!(
                "{dims:?} s{stride:?}: {what} has {} values, Burn's {}",
                a.len(),
                b.len()
            ));
        }
        let scale = b.iter().fold(1.0f32, |m, v| m.max(v.abs()));
        let e = a.iter().zip(b).fold(0.0f32, |m, (x, y)| m.max((x - y).abs())) / scale;
        if e >= 2e-5 {
            return Err(format!("{dims:?} s{stride:?}: {what} differs by {e} (relative)"));
        }
    }
    Ok(())
}

#[test]
fn the_candidates_pointwise_convolutions_match_burns() {
    // Separable stages (C → C, stride 1), FactorizedReduce halves (C → C/2 at stride 2, on the
    // even plane and on the plane shifted by one), and the preprocessing ReLUConvBN.
    let mut seed = 0;
    for (c, h) in [(4, 28), (8, 14), (16, 32), (16, 15)] {
        for (co, s) in [(c, 1), (c / 2, 2), (2 * c, 1)] {
            seed += 1;
            check([3, c, co, h, h], [s, s], seed).unwrap();
        }
    }
}

#[test]
fn odd_shapes_and_strides_match_burns() {
    let strategy = (
        (1usize..=3, 1usize..=7, 1usize..=7),
        (1usize..=9, 1usize..=9),
        (1usize..=3, 1usize..=3),
        any::<u64>(),
    );
    let config = Config { cases: 80, failure_persistence: None, ..Config::default() };
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[13; 32]);
    TestRunner::new_with_rng(config, rng)
        .run(&strategy, |((n, ci, co), (h, w), (sh, sw), seed)| {
            check([n, ci, co, h, w], [sh, sw], seed).map_err(TestCaseError::fail)
        })
        .unwrap();
}

#[test]
fn only_ungrouped_unpadded_1x1_convolutions_are_matrix_products() {
    let d = Device::flex();
    let w1 = Tensor::<4>::zeros([4, 4, 1, 1], &d);
    let w3 = Tensor::<4>::zeros([4, 4, 3, 3], &d);
    let wg = Tensor::<4>::zeros([4, 2, 1, 1], &d);
    assert!(is_pointwise(&w1, &ConvOptions::new([2, 2], [0, 0], [1, 1], 1)));
    assert!(!is_pointwise(&w1, &ConvOptions::new([1, 1], [1, 1], [1, 1], 1)));
    assert!(!is_pointwise(&w3, &ConvOptions::new([1, 1], [0, 0], [1, 1], 1)));
    assert!(!is_pointwise(&wg, &ConvOptions::new([1, 1], [0, 0], [1, 1], 2)));
    // Those go to Burn: bit for bit its values.
    let x = qdarts_kernels::devices::seeded(&d, 2, || {
        Tensor::<4>::random([2, 4, 6, 5], Distribution::Normal(0.0, 1.0), &d)
    });
    let w = qdarts_kernels::devices::seeded(&d, 3, || {
        Tensor::<4>::random([4, 4, 1, 1], Distribution::Normal(0.0, 1.0), &d)
    });
    let o = ConvOptions::new([1, 1], [1, 1], [1, 1], 1);
    assert_eq!(vals(conv2d(x.clone(), w.clone(), o.clone())), vals(module::conv2d(x, w, None, o)));
}
