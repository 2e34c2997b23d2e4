//! The depthwise convolution kernels against Burn's own `conv2d` (forward, input gradient and
//! weight gradient) over the geometries of the DARTS candidates and odd ones around them.

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use burn::tensor::ops::ConvOptions;
use burn::tensor::{DType, Device, Distribution, Tensor, module};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use qdarts_kernels::depthwise_conv::{conv2d, depthwise_available};

fn vals<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
}

/// Largest |a − b| relative to the largest |b| (at least 1).
fn rel_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    a.iter().zip(b).fold(0.0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

#[derive(Debug, Clone, Copy)]
struct Case {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    k: [usize; 2],
    stride: usize,
    padding: [usize; 2],
    dilation: usize,
    seed: u64,
}

/// Output, ∂x and ∂w of `conv` on `case`'s seeded input and weight, with a fixed upstream
/// gradient that is not all ones (so every tap's weighting shows).
fn run(
    case: Case,
    conv: impl Fn(Tensor<4>, Tensor<4>, ConvOptions<2>) -> Tensor<4>,
) -> [Vec<f32>; 3] {
    run_tracking(case, conv, [true, true])
}

/// [`run`] with only the inputs marked in `track` (`[x, w]`) requiring a gradient; an
/// untracked one's gradient comes back empty.
fn run_tracking(
    case: Case,
    conv: impl Fn(Tensor<4>, Tensor<4>, ConvOptions<2>) -> Tensor<4>,
    track: [bool; 2],
) -> [Vec<f32>; 3] {
    let d = Device::flex().autodiff();
    let (x, w) = qdarts_kernels::devices::seeded(&d, case.seed, || {
        let normal = Distribution::Normal(0.0, 1.0);
        (
            Tensor::<4>::random([case.n, case.c, case.h, case.w], normal, &d),
            Tensor::<4>::random([case.c, 1, case.k[0], case.k[1]], normal, &d),
        )
    });
    let options = ConvOptions::new([case.stride; 2], case.padding, [case.dilation; 2], case.c);
    let x = if track[0] { x.require_grad() } else { x };
    let w = if track[1] { w.require_grad() } else { w };
    let y = conv(x.clone(), w.clone(), options);
    let up = y.clone().detach().mul_scalar(0.7).add_scalar(0.3).sin();
    let grads = y.clone().mul(up).sum().backward();
    let grad = |t: &Tensor<4>| t.grad(&grads).map(vals).unwrap_or_default();
    [vals(y), grad(&x), grad(&w)]
}

/// Runs `case` through both convolutions and compares output, ∂x and ∂w.
fn check(case: Case) -> Result<(), String> {
    let burn = run(case, |x, w, o| module::conv2d(x, w, None, o));
    let ours = run(case, conv2d);
    for (what, a, b) in
        ["output", "∂x", "∂w"].iter().zip(&ours).zip(&burn).map(|((w, a), b)| (w, a, b))
    {
        if a.len() != b.len() {
            return Err(format!("{case:?}: {what} has {} values, Burn's {}", a.len(), b.len()));
        }
        let e = rel_diff(a, b);
        if e >= 2e-5 {
            return Err(format!("{case:?}: {what} differs by {e} (relative to the largest value)"));
        }
    }
    Ok(())
}

#[test]
fn the_kernels_are_used_on_flex_f32() {
    assert!(depthwise_available(&Device::flex(), DType::F32));
    assert!(depthwise_available(&Device::flex().autodiff(), DType::F32));
    assert!(!depthwise_available(&Device::flex(), DType::F64));
}

#[test]
fn the_darts_candidates_match_burns_convolution() {
    // sep_conv_3x3 / 5x5 and dil_conv_3x3 / 5x5, stride 1 and 2, on the default and DARTS sizes.
    let mut seed = 1;
    for (h, c) in [(28, 4), (14, 8), (7, 16), (32, 3)] {
        for stride in [1, 2] {
            for (k, dilation) in [(3, 1), (5, 1), (3, 2), (5, 2)] {
                let p = dilation * (k - 1) / 2;
                seed += 1;
                let case =
                    Case { n: 3, c, h, w: h, k: [k, k], stride, padding: [p, p], dilation, seed };
                check(case).unwrap();
            }
        }
    }
}

/// Bit patterns, so that a test can ask for equality bit for bit.
fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn both_gradients_at_once_are_each_alone_bitwise() {
    // With x and w both tracked the backward computes the two gradients in one kernel; with
    // one of them tracked, that gradient's own kernel runs.
    let mut seed = 100;
    for (h, c) in [(28, 4), (8, 16), (5, 2)] {
        for stride in [1, 2, 3] {
            for (k, dilation) in [(3, 1), (5, 1), (3, 2), (5, 2), (1, 1)] {
                let p = dilation * (k - 1) / 2;
                seed += 1;
                let case =
                    Case { n: 2, c, h, w: h, k: [k, k], stride, padding: [p, p], dilation, seed };
                let [y, dx, dw] = run_tracking(case, conv2d, [true, true]);
                let [y_x, dx_alone, none_w] = run_tracking(case, conv2d, [true, false]);
                let [y_w, none_x, dw_alone] = run_tracking(case, conv2d, [false, true]);
                assert!(none_w.is_empty() && none_x.is_empty(), "{case:?}");
                assert_eq!(bits(&y), bits(&y_x), "{case:?}: output");
                assert_eq!(bits(&y), bits(&y_w), "{case:?}: output");
                assert_eq!(bits(&dx), bits(&dx_alone), "{case:?}: ∂x");
                assert_eq!(bits(&dw), bits(&dw_alone), "{case:?}: ∂w");
            }
        }
    }
}

#[test]
fn other_geometries_match_burns_convolution() {
    // Non-square planes and kernels, padding wider and narrower than the kernel's reach,
    // strides and dilations up to 3, planes smaller than the kernel's span.
    let strategy = (
        (1usize..=3, 2usize..=5),
        (1usize..=9, 1usize..=9),
        (1usize..=5, 1usize..=5),
        (1usize..=3, 1usize..=3),
        (0usize..=4, 0usize..=4),
        any::<u64>(),
    );
    let config = Config { cases: 120, failure_persistence: None, ..Config::default() };
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[7; 32]);
    let mut runner = TestRunner::new_with_rng(config, rng);
    runner
        .run(&strategy, |((n, c), (h, w), (kh, kw), (stride, dilation), (ph, pw), seed)| {
            let case = Case { n, c, h, w, k: [kh, kw], stride, padding: [ph, pw], dilation, seed };
            // Only geometries with at least one output.
            let fits = |size: usize, k: usize, p: usize| size + 2 * p > dilation * (k - 1);
            prop_assume!(fits(h, kh, ph) && fits(w, kw, pw));
            check(case).map_err(TestCaseError::fail)
        })
        .unwrap();
}

#[test]
fn a_non_depthwise_convolution_is_burns() {
    // groups = 1 and a channel multiplier of 2 go to Burn's conv2d: same values bit for bit.
    let d = Device::flex();
    let (x, w1, w2) = qdarts_kernels::devices::seeded(&d, 3, || {
        let normal = Distribution::Normal(0.0, 1.0);
        (
            Tensor::<4>::random([2, 4, 9, 9], normal, &d),
            Tensor::<4>::random([6, 4, 3, 3], normal, &d),
            Tensor::<4>::random([8, 1, 3, 3], normal, &d),
        )
    });
    for (w, groups) in [(w1, 1), (w2, 4)] {
        let o = ConvOptions::new([1, 1], [1, 1], [1, 1], groups);
        let ours = vals(conv2d(x.clone(), w.clone(), o.clone()));
        let burn = vals(module::conv2d(x.clone(), w, None, o));
        assert_eq!(ours, burn, "groups {groups}");
    }
}
