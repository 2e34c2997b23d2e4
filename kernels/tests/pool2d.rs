//! The pooling kernels against Burn's own pools (output and input gradient) over the DARTS
//! candidates' geometries and odd ones around them, on continuous inputs and on inputs with
//! many ties (as fake-quantized activations have), where the max pool's gradient must go to
//! the same element as Burn's and PyTorch's.

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use std::sync::Mutex;

use burn::tensor::ops::{AvgPoolOptions, MaxPoolOptions};
use burn::tensor::{DType, Device, Distribution, Int, Tensor, module};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use qdarts_kernels::devices::compiled as devices;
use qdarts_kernels::launches::counted;
use qdarts_kernels::pool2d::{avg_pool2d, avg_pool2d_rounded, max_pool2d, pool_available};

/// Held by every test here that launches kernels: the launch count sees every thread of the
/// process.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

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

/// `case`'s seeded input on `d`, tracked.
fn input(case: &Case, d: &Device) -> Tensor<4> {
    let x = qdarts_kernels::devices::seeded(d, case.seed, || {
        let dist = Distribution::Normal(0.0, 1.0);
        qdarts_kernels::devices::random([case.n, case.c, case.h, case.w], dist, d)
    });
    let x = if case.ties { x.mul_scalar(2.0).round().clamp(-4.0, 4.0).div_scalar(2.0) } else { x };
    x.detach().require_grad()
}

/// An upstream gradient for `y` that differs from output to output (so where each one goes
/// shows): `sin(0.37·k)` at flat index `k`.
fn upstream(y: &Tensor<4>) -> Tensor<4> {
    let [n, c, oh, ow] = y.dims();
    Tensor::<1, Int>::arange(0..(n * c * oh * ow) as i64, &y.device())
        .float()
        .reshape([n, c, oh, ow])
        .mul_scalar(0.37)
        .sin()
}

/// Output and ∂x of `pool` on `case`'s seeded input on `d`.
fn run(case: Case, pool: Pool, d: &Device) -> [Vec<f32>; 2] {
    let x = input(&case, d);
    let y = pool(x.clone(), &case);
    let grads = y.clone().mul(upstream(&y)).sum().backward();
    [vals(y), vals(x.grad(&grads).unwrap())]
}

/// Runs `case` through both pools on every backend of the build and compares output and ∂x.
/// On flex the max pool's output is compared exactly and sums may differ in rounding only
/// (other summation order); on the CubeCL backends everything is Burn's bit for bit (same
/// order).
fn check(case: Case) -> Result<(), String> {
    for (name, d) in devices() {
        let d = d.autodiff();
        let (a, b) = (run(case, ours, &d), run(case, burns, &d));
        for (what, a, b) in [("output", &a[0], &b[0]), ("∂x", &a[1], &b[1])] {
            if a.len() != b.len() {
                return Err(format!(
                    "{name} {case:?}: {what} has {} values, Burn's {}",
                    a.len(),
                    b.len()
                ));
            }
            let exact = name != "flex" || (case.kind == Kind::Max && what == "output");
            let e = rel_diff(a, b);
            if (exact && bits(a) != bits(b)) || e >= 2e-6 {
                return Err(format!(
                    "{name} {case:?}: {what} differs by {e} (relative to the largest value)"
                ));
            }
        }
    }
    Ok(())
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn the_kernels_are_used_on_flex_and_the_cubecl_backends_f32() {
    let _serial = serial();
    assert!(pool_available(&Device::flex(), DType::F32));
    assert!(pool_available(&Device::flex().autodiff(), DType::F32));
    assert!(!pool_available(&Device::flex(), DType::F64));
    for (name, d) in devices() {
        let ours = name != "tch";
        assert_eq!(pool_available(&d, DType::F32), ours, "{name}");
        assert_eq!(pool_available(&d.autodiff(), DType::F32), ours, "{name}");
    }
}

/// A pooling of a captured input.
type Make<'a> = Box<dyn Fn() -> Tensor<4> + 'a>;

#[test]
fn on_the_cubecl_backends_a_pool_is_one_launch_each_way() {
    let _serial = serial();
    // Burn's CubeCL pools copy the input to channels-last first, and backward the input, the
    // gradient (and the max pool's indices) too.
    for (name, d) in devices().into_iter().filter(|(_, d)| pool_available(d, DType::F32)) {
        let d = d.autodiff();
        let x = input(
            &Case {
                kind: Kind::Max,
                n: 2,
                c: 3,
                h: 9,
                w: 9,
                k: [3; 2],
                stride: [2; 2],
                padding: [1; 2],
                ties: true,
                seed: 3,
            },
            &d,
        );
        let o = MaxPoolOptions::new([3, 3]).with_stride([2, 2]).with_padding([1, 1]);
        let a = AvgPoolOptions::new([3, 3]).with_stride([2, 2]).with_padding([1, 1]);
        let one = Tensor::<1>::ones([1], &d);
        let pools: [(&str, Make); 3] = [
            ("max", Box::new(|| max_pool2d(x.clone(), o.clone()))),
            ("avg", Box::new(|| avg_pool2d(x.clone(), a.clone()))),
            (
                "rounded avg",
                Box::new(|| {
                    avg_pool2d_rounded(x.clone(), one.clone(), one.clone(), false, a.clone())
                        .unwrap()
                }),
            ),
        ];
        // The backward launches of the product with an upstream gradient and the sum, alone.
        let up = upstream(&x);
        let (_, around) = counted(&d, || x.clone().mul(up).sum().backward());
        for (what, pool) in pools {
            let (y, forward) = counted(&d, pool);
            let up = upstream(&y);
            let (_, backward) = counted(&d, || y.mul(up).sum().backward());
            if let (Some(f), Some(b), Some(around)) = (forward, backward, around) {
                assert_eq!(f, 1, "{name} {what}: forward launches");
                assert_eq!(b, around + 1, "{name} {what}: backward launches");
            }
        }
    }
}

/// `v` rounded with ties to even or away from zero, as tensor expressions (`QPoolBN`'s).
fn round_with(v: Tensor<4>, ties_away: bool) -> Tensor<4> {
    if !ties_away {
        return v.round();
    }
    let t = v.clone().trunc();
    let up = v.clone().sub(t.clone()).abs().greater_equal_elem(0.5);
    t.clone().mask_where(up, t.add(v.sign()))
}

/// The tensor expressions [`avg_pool2d_rounded`] replaces (`QPoolBN` on a grid), with this
/// module's pools.
fn rounded_expressions(
    x: Tensor<4>,
    [mult, step]: [Tensor<1>; 2],
    ties_away: bool,
    o: AvgPoolOptions<2>,
) -> Tensor<4> {
    let shape = [1, mult.dims()[0], 1, 1];
    let (m, s) = (mult.reshape(shape), step.reshape(shape));
    let q = round_with(x.clone().detach().mul(m), ties_away);
    let qa = round_with(avg_pool2d(q, o.clone()), ties_away);
    let avg = avg_pool2d(x, o);
    avg.clone().add(qa.mul(s).sub(avg.detach()))
}

#[test]
fn the_rounded_average_pool_is_the_expressions_bit_for_bit() {
    let _serial = serial();
    // Per tensor and per channel; grids of powers of two on inputs at half steps (every
    // rounding a tie) and a grid of 0.05 on continuous inputs; both tie rules; the DARTS
    // geometries with and without the padding in the divisor, and a strided channel slice.
    let mut seed = 40;
    for (name, d) in devices().into_iter().filter(|(_, d)| pool_available(d, DType::F32)) {
        let d = d.autodiff();
        for per_channel in [false, true] {
            for (ties, step) in [(true, 0.0625f32), (false, 0.05)] {
                for ties_away in [false, true] {
                    for (k, stride, p, inc) in
                        [(3, 1, 1, false), (3, 2, 1, false), (3, 1, 1, true), (2, 2, 0, false)]
                    {
                        seed += 1;
                        let c = 4;
                        let case = Case {
                            kind: Kind::Avg(inc),
                            n: 2,
                            c: c + 2,
                            h: 7,
                            w: 6,
                            k: [k; 2],
                            stride: [stride; 2],
                            padding: [p; 2],
                            ties: false,
                            seed,
                        };
                        let steps: Vec<f32> = if per_channel {
                            (0..c).map(|i| step * [1.0, 0.5, 2.0, 0.25][i]).collect()
                        } else {
                            vec![step]
                        };
                        let mults: Vec<f32> = steps.iter().map(|s| 1.0 / s).collect();
                        let grid = [
                            Tensor::<1>::from_floats(mults.as_slice(), &d),
                            Tensor::<1>::from_floats(steps.as_slice(), &d),
                        ];
                        let x = input(&case, &d).detach();
                        // Two channels more, then sliced away: a strided input.
                        let x = x.narrow(1, 1, c);
                        let x = if ties {
                            let shape = [1, grid[0].dims()[0], 1, 1];
                            let m2 = grid[0].clone().reshape(shape).mul_scalar(2.0);
                            x.clone().mul(m2.clone()).round().div(m2)
                        } else {
                            x
                        };
                        let o = AvgPoolOptions::new([k; 2])
                            .with_stride([stride; 2])
                            .with_padding([p; 2])
                            .with_count_include_pad(inc);
                        let what = format!(
                            "{name} per channel {per_channel} ties {ties} away {ties_away} {o:?}"
                        );
                        let mut seen = Vec::new();
                        for fused in [true, false] {
                            let x = x.clone().detach().require_grad();
                            let y = if fused {
                                avg_pool2d_rounded(
                                    x.clone(),
                                    grid[0].clone(),
                                    grid[1].clone(),
                                    ties_away,
                                    o.clone(),
                                )
                                .unwrap()
                            } else {
                                rounded_expressions(x.clone(), grid.clone(), ties_away, o.clone())
                            };
                            let grads = y.clone().mul(upstream(&y)).sum().backward();
                            seen.push([vals(y), vals(x.grad(&grads).unwrap())]);
                        }
                        assert_eq!(bits(&seen[0][0]), bits(&seen[1][0]), "{what}: output");
                        assert_eq!(bits(&seen[0][1]), bits(&seen[1][1]), "{what}: ∂x");
                    }
                }
            }
        }
    }
}

#[test]
fn the_rounded_average_pool_lies_on_the_grid_within_a_step_of_the_average() {
    let _serial = serial();
    // The value is the dequantized integer average: a multiple of the step (up to the last
    // bit of `avg + (qa·step − avg)`) within half a step (plus the inputs' own rounding) of the
    // float average.
    for (name, d) in devices().into_iter().filter(|(_, d)| pool_available(d, DType::F32)) {
        let d = d.autodiff();
        let case = Case {
            kind: Kind::Avg(false),
            n: 2,
            c: 3,
            h: 8,
            w: 8,
            k: [3; 2],
            stride: [1; 2],
            padding: [1; 2],
            ties: false,
            seed: 77,
        };
        let x = input(&case, &d).detach();
        let step = 0.1f32;
        let grid =
            [Tensor::<1>::from_floats([1.0 / step], &d), Tensor::<1>::from_floats([step], &d)];
        let o = AvgPoolOptions::new([3, 3]).with_padding([1, 1]);
        let y = vals(
            avg_pool2d_rounded(x.clone(), grid[0].clone(), grid[1].clone(), false, o.clone())
                .unwrap(),
        );
        let avg = vals(avg_pool2d(x, o));
        let mut off_average = 0;
        for (y, a) in y.iter().zip(&avg) {
            let units = y / step;
            assert!(
                (units - units.round()).abs() < 1e-3,
                "{name}: {y} is not on the grid of {step}"
            );
            assert!((y - a).abs() <= step, "{name}: {y} is more than a step from {a}");
            off_average += usize::from(y != a);
        }
        assert!(off_average > y.len() / 2, "{name}: the values were not rounded");
    }
}

#[test]
fn the_rounded_average_pool_leaves_other_grids_and_options_to_the_caller() {
    let _serial = serial();
    let d = Device::flex();
    let x = Tensor::<4>::zeros([1, 3, 5, 5], &d);
    let o = AvgPoolOptions::new([3, 3]).with_padding([1, 1]);
    let (one, two) = (Tensor::<1>::ones([1], &d), Tensor::<1>::ones([2], &d));
    let three = Tensor::<1>::ones([3], &d);
    assert!(avg_pool2d_rounded(x.clone(), one.clone(), one.clone(), false, o.clone()).is_some());
    assert!(
        avg_pool2d_rounded(x.clone(), three.clone(), three.clone(), false, o.clone()).is_some()
    );
    assert!(avg_pool2d_rounded(x.clone(), two.clone(), two, false, o.clone()).is_none());
    assert!(avg_pool2d_rounded(x.clone(), one.clone(), three, false, o.clone()).is_none());
    let ceil = o.with_ceil_mode(true);
    assert!(avg_pool2d_rounded(x, one.clone(), one, false, ceil).is_none());
}

#[test]
fn the_darts_pools_match_burns() {
    let _serial = serial();
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
    let _serial = serial();
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
    let _serial = serial();
    for (name, d) in devices().into_iter().filter(|(name, _)| *name != "tch") {
        let d = d.autodiff();
        let mut v: Vec<f32> = (0..16).map(|i| i as f32).collect();
        v[5] = f32::NAN;
        let x = Tensor::<1>::from_floats(v.as_slice(), &d).reshape([1, 1, 4, 4]).require_grad();
        let o = MaxPoolOptions::new([3, 3]).with_stride([1, 1]).with_padding([1, 1]);
        let y = max_pool2d(x.clone(), o);
        let g = vals(x.grad(&y.clone().sum().backward()).unwrap());
        // Element (1, 1) lies in the windows of outputs (0..3, 0..3); those pass no gradient.
        for (i, v) in vals(y).iter().enumerate() {
            let (r, c) = (i / 4, i % 4);
            assert_eq!(v.is_nan(), r <= 2 && c <= 2, "{name}: output ({r}, {c}) = {v}");
        }
        // The other windows' maxima: (3, 3) for outputs (2..4, 2..4) outside those, (3, c+1)
        // and (r+1, 3) at the edges.
        let mut expected = vec![0.0f32; 16];
        for (r, c) in [(0, 3), (1, 3), (2, 3), (3, 3), (3, 0), (3, 1), (3, 2)] {
            let (mr, mc) = ((r + 1).min(3), (c + 1).min(3));
            expected[mr * 4 + mc] += 1.0;
        }
        assert_eq!(g, expected, "{name}: ∂x");
    }
}

#[test]
fn other_options_fall_back_to_burns_pools() {
    let _serial = serial();
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

#[test]
fn a_plane_smaller_than_the_window_pools_to_nothing_as_on_flex() {
    let _serial = serial();
    // A 1×1 plane under PC-DARTS' 2×2 stride-2 max pool, a 1×2 one under a 3×3 average
    // without padding: no outputs, and a zero gradient.
    for (name, d) in devices().into_iter().filter(|(name, _)| *name != "tch") {
        let d = d.autodiff();
        for (h, w, k) in [(1, 1, 2), (1, 2, 3)] {
            let x = Tensor::<4>::ones([2, 3, h, w], &d).require_grad();
            let m = max_pool2d(x.clone(), MaxPoolOptions::new([k; 2]).with_stride([2, 2]));
            let a = avg_pool2d(x.clone(), AvgPoolOptions::new([k; 2]));
            assert_eq!(m.dims(), [2, 3, 0, 0], "{name}: max of {h}×{w} under {k}×{k}");
            assert_eq!(a.dims(), [2, 3, 0, 0], "{name}: average of {h}×{w} under {k}×{k}");
            let g = x.grad(&m.sum().add(a.sum()).backward()).unwrap();
            assert_eq!(vals(g), vec![0.0; 6 * h * w], "{name}: ∂x of {h}×{w}");
        }
    }
}
