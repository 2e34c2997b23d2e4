//! The pooling kernels against Burn's own pools (output and input gradient) over the DARTS
//! candidates' geometries and odd ones around them, on continuous inputs and on inputs with
//! many ties (as fake-quantized activations have), where the max pool's gradient must go to
//! the same element as Burn's and PyTorch's.

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use burn::tensor::ops::{AvgPoolOptions, MaxPoolOptions};
use burn::tensor::{DType, Device, Distribution, Int, Tensor, module};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use qdarts_kernels::pool2d::{avg_pool2d, max_pool2d, pool_available};

fn vals<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
}

/// Largest |a − b| relative to the largest |b| (at least 1).
fn rel_diff(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    a.iter().zip(b).fold(0.0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Max,
    /// Average; `true` counts the padding in the divisor.
    Avg(bool),
}

#[derive(Debug, Clone, Copy)]
struct Case {
    kind: Kind,
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    k: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    /// Inputs rounded to halves in [−2, 2]: most windows hold ties.
    ties: bool,
    seed: u64,
}

type Pool = fn(Tensor<4>, &Case) -> Tensor<4>;

fn ours(x: Tensor<4>, c: &Case) -> Tensor<4> {
    match c.kind {
        Kind::Max => {
            max_pool2d(x, MaxPoolOptions::new(c.k).with_stride(c.stride).with_padding(c.padding))
        }
        Kind::Avg(inc) => avg_pool2d(
            x,
            AvgPoolOptions::new(c.k)
                .with_stride(c.stride)
                .with_padding(c.padding)
                .with_count_include_pad(inc),
        ),
    }
}

fn burns(x: Tensor<4>, c: &Case) -> Tensor<4> {
    match c.kind {
        Kind::Max => module::max_pool2d(
            x,
            MaxPoolOptions::new(c.k).with_stride(c.stride).with_padding(c.padding),
        ),
        Kind::Avg(inc) => module::avg_pool2d(
            x,
            AvgPoolOptions::new(c.k)
                .with_stride(c.stride)
                .with_padding(c.padding)
                .with_count_include_pad(inc),
        ),
    }
}

/// Output and ∂x of `pool` on `case`'s seeded input, with an upstream gradient that differs
/// from output to output (so where each one goes shows).
fn run(case: Case, pool: Pool) -> [Vec<f32>; 2] {
    let d = Device::flex().autodiff();
    let x = qdarts_kernels::devices::seeded(&d, case.seed, || {
        let dist = Distribution::Normal(0.0, 1.0);
        Tensor::<4>::random([case.n, case.c, case.h, case.w], dist, &d)
    });
    let x = if case.ties { x.mul_scalar(2.0).round().clamp(-4.0, 4.0).div_scalar(2.0) } else { x };
    let x = x.detach().require_grad();
    let y = pool(x.clone(), &case);
    let [n, c, oh, ow] = y.dims();
    let up = Tensor::<1, Int>::arange(0..(n * c * oh * ow) as i64, &d)
        .float()
        .reshape([n, c, oh, ow])
        .mul_scalar(0.37)
        .sin();
    let grads = y.clone().mul(up).sum().backward();
    [vals(y), vals(x.grad(&grads).unwrap())]
}

/// Runs `case` through both pools and compares output and ∂x. The max pool's output is
/// compared exactly; sums may differ in rounding only.
fn check(case: Case) -> Result<(), String> {
    let (a, b) = (run(case, ours), run(case, burns));
    for (what, a, b) in [("output", &a[0], &b[0]), ("∂x", &a[1], &b[1])] {
        if a.len() != b.len() {
            return Err(format!("{case:?}: {what} has {} values, Burn's {}", a.len(), b.len()));
        }
        let exact = case.kind == Kind::Max && what == "output";
        let e = rel_diff(a, b);
        if (exact && a != b) || e >= 2e-6 {
            return Err(format!("{case:?}: {what} differs by {e} (relative to the largest value)"));
        }
    }
    Ok(())
}

#[test]
fn the_kernels_are_used_on_flex_f32() {
    assert!(pool_available(&Device::flex(), DType::F32));
    assert!(pool_available(&Device::flex().autodiff(), DType::F32));
    assert!(!pool_available(&Device::flex(), DType::F64));
}

#[test]
fn the_darts_pools_match_burns() {
    // max_pool_3x3 and avg_pool_3x3 at stride 1 and 2 on the default and DARTS sizes, and the
    // 2×2 max pool of partial channels.
    let mut seed = 1;
    for (h, c) in [(28, 4), (14, 8), (7, 16), (32, 3)] {
        for kind in [Kind::Max, Kind::Avg(false), Kind::Avg(true)] {
            for (k, stride, p) in [(3, 1, 1), (3, 2, 1), (2, 2, 0)] {
                for ties in [false, true] {
                    seed += 1;
                    let (k, stride, padding) = ([k; 2], [stride; 2], [p; 2]);
                    let case = Case { kind, n: 3, c, h, w: h, k, stride, padding, ties, seed };
                    check(case).unwrap();
                }
            }
        }
    }
}

#[test]
fn other_geometries_match_burns() {
    // Non-square planes, windows and strides, padding up to half the window, planes smaller
    // than the window.
    let strategy = (
        (0usize..3, any::<bool>()),
        (1usize..=3, 1usize..=5),
        (1usize..=9, 1usize..=9),
        (1usize..=5, 1usize..=5),
        (1usize..=3, 1usize..=3),
        (0usize..=2, 0usize..=2),
        any::<u64>(),
    );
    let config = Config { cases: 160, failure_persistence: None, ..Config::default() };
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[11; 32]);
    let mut runner = TestRunner::new_with_rng(config, rng);
    runner
        .run(&strategy, |((kind, ties), (n, c), (h, w), (kh, kw), (sh, sw), (ph, pw), seed)| {
            let kind = [Kind::Max, Kind::Avg(false), Kind::Avg(true)][kind];
            prop_assume!(2 * ph <= kh && 2 * pw <= kw && h + 2 * ph >= kh && w + 2 * pw >= kw);
            let (k, stride, padding) = ([kh, kw], [sh, sw], [ph, pw]);
            let case = Case { kind, n, c, h, w, k, stride, padding, ties, seed };
            check(case).map_err(TestCaseError::fail)
        })
        .unwrap();
}

#[test]
fn a_nan_in_a_max_window_wins() {
    let d = Device::flex();
    let mut v: Vec<f32> = (0..16).map(|i| i as f32).collect();
    v[5] = f32::NAN;
    let x = Tensor::<1>::from_floats(v.as_slice(), &d).reshape([1, 1, 4, 4]);
    let o = MaxPoolOptions::new([3, 3]).with_stride([1, 1]).with_padding([1, 1]);
    let y = vals(max_pool2d(x, o));
    // Element (1, 1) lies in the windows of outputs (0..3, 0..3).
    for (i, v) in y.iter().enumerate() {
        let (r, c) = (i / 4, i % 4);
        assert_eq!(v.is_nan(), r <= 2 && c <= 2, "output ({r}, {c}) = {v}");
    }
}

#[test]
fn other_options_fall_back_to_burns_pools() {
    // Dilation, ceil mode and asymmetric padding go to Burn: same values bit for bit.
    let d = Device::flex();
    let x = qdarts_kernels::devices::seeded(&d, 5, || {
        Tensor::<4>::random([2, 3, 9, 8], Distribution::Normal(0.0, 1.0), &d)
    });
    let options = [
        MaxPoolOptions::new([3, 3]).with_dilation([2, 2]),
        MaxPoolOptions::new([3, 3]).with_stride([2, 2]).with_ceil_mode(true),
        MaxPoolOptions::new([3, 3]).with_padding_pairs([(1, 0), (0, 1)]),
    ];
    for o in options {
        let a = vals(max_pool2d(x.clone(), o.clone()));
        assert_eq!(a, vals(module::max_pool2d(x.clone(), o.clone())), "{o:?}");
    }
    let o = AvgPoolOptions::new([3, 3]).with_stride([2, 2]).with_ceil_mode(true);
    assert_eq!(vals(avg_pool2d(x.clone(), o.clone())), vals(module::avg_pool2d(x, o)));
}
