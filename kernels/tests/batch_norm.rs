//! The per-channel BatchNorm kernels (`statistics`, `rstd`, `shift`, `running`, `affine`)
//! against the tensor expressions they replace, values and gradients, with `x` and `∂y`
//! contiguous, channels-last and a channel slice, and the moments against an f64 computation on
//! the host: on flex over many odd shapes, and on every backend of the build (the CubeCL ones
//! run kernels of their own) over the search shapes and a few odd ones; `fold` against the four
//! functions it does at once; on the CubeCL backends, `normalize` against the primitives it
//! folds into one backward step, and `fold_normalize` against `fold` then `normalize`.

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use burn::tensor::{Device, Distribution, Tensor};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use qdarts_kernels::batch_norm::{
    affine, fold, fold_available, fold_normalize, fold_rounded, fold_rounded_available, moments,
    normalize, rstd, running, shift, statistics,
};
use qdarts_kernels::bias::int32_rounded;
use qdarts_kernels::devices::compiled as devices;
use qdarts_kernels::launches::counted;

/// Held by every test here: the launch count sees every thread of the process.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn vals<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
}

/// Largest |a − b| relative to the largest |b| (at least `floor`).
fn rel_diff(a: &[f32], b: &[f32], floor: f32) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(floor, |m, v| m.max(v.abs()));
    a.iter().zip(b).fold(0.0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

/// The expressions the kernels replace.
fn moments_expr(x: Tensor<4>) -> (Tensor<1>, Tensor<1>) {
    let [n, c, h, w] = x.dims();
    let rows = x.swap_dims(0, 1).reshape([c, n * h * w]);
    let mean = rows.clone().mean_dim(1);
    let var = rows.sub(mean.clone()).square().mean_dim(1);
    (mean.reshape([c]), var.reshape([c]))
}

fn affine_expr(x: Tensor<4>, w: Tensor<1>, b: Tensor<1>) -> Tensor<4> {
    let c = x.dims()[1];
    x.mul(w.reshape([1, c, 1, 1])).add(b.reshape([1, c, 1, 1]))
}

/// How `x` and the gradient reaching `y` lie in memory: the kernels read both through their
/// strides.
#[derive(Clone, Copy, Debug)]
enum Layout {
    /// Contiguous `[N, C, H, W]`.
    Contiguous,
    /// `[N, H, W, C]` in memory (a channels-last convolution's output); `∂y` too.
    ChannelsLast,
    /// Channels `1..1 + C` of a wider tensor (a concatenation's part); `∂y` channels-last.
    ChannelSlice,
}

impl Layout {
    /// The dims of the stored tensor that [`Layout::view`] makes `[N, C, H, W]` `dims` of.
    fn stored(self, [n, c, h, w]: [usize; 4]) -> [usize; 4] {
        match self {
            Layout::Contiguous => [n, c, h, w],
            Layout::ChannelsLast => [n, h, w, c],
            Layout::ChannelSlice => [n, c + 3, h, w],
        }
    }

    /// `[N, C, H, W]` `dims` viewed in the stored tensor `x`.
    fn view(self, x: Tensor<4>, [n, c, _, _]: [usize; 4]) -> Tensor<4> {
        match self {
            Layout::Contiguous => x,
            Layout::ChannelsLast => x.permute([0, 3, 1, 2]),
            Layout::ChannelSlice => x.slice([0..n, 1..1 + c]),
        }
    }
}

/// A BatchNorm as `QBatchNorm` computes it: `affine(x, w, b)` with `w = γ/sqrt(var + ε)` and
/// `b = β − mean·w`, the statistics folded by [`rstd`] and [`shift`] (`ours`) or by the tensor
/// expressions; its output, the gradients of x, γ and β under a fixed upstream gradient, and
/// the running statistics after one update.
fn batch_norm(
    device: &Device,
    dims: [usize; 4],
    seed: u64,
    ours: bool,
    layout: Layout,
) -> [Vec<f32>; 8] {
    let d = device.clone().autodiff();
    let [n, c, h, w] = dims;
    // Drawn on the host (flex's generator) and copied: every backend gets the same numbers.
    let host = Device::flex();
    let (x, gamma, beta) = qdarts_kernels::devices::seeded(&host, seed, || {
        // An offset mean, so that centring matters.
        let normal = Distribution::Normal(1.5, 2.0);
        let stored = layout.stored(dims);
        (
            Tensor::<4>::random(stored, normal, &host),
            Tensor::<1>::random([c], Distribution::Normal(1.0, 0.3), &host),
            Tensor::<1>::random([c], Distribution::Normal(0.0, 0.3), &host),
        )
    });
    let x = Tensor::<4>::from_data(x.into_data(), &d);
    let x = layout.view(x, dims);
    let gamma = Tensor::<1>::from_data(gamma.into_data(), &d);
    let beta = Tensor::<1>::from_data(beta.into_data(), &d);
    let (x, gamma, beta) = (x.require_grad(), gamma.require_grad(), beta.require_grad());
    // The running statistics before the update.
    let (rm, rv) = (gamma.clone().detach().mul_scalar(0.7), beta.clone().detach().exp());
    let count = n * h * w;
    let (mean, var, w, b, running) = if ours {
        // As QBatchNorm folds them: the statistics as `[2, C]`, straight into rstd and shift.
        let m = statistics(x.clone());
        let w = rstd(m.clone(), 1e-5).mul(gamma.clone());
        let b = shift(m.clone(), w.clone()).add(beta.clone());
        let running = running(rm, rv, m.clone(), 0.1, count);
        (
            m.clone().slice([0..1, 0..c]).reshape([c]),
            m.slice([1..2, 0..c]).reshape([c]),
            w,
            b,
            running,
        )
    } else {
        let (mean, var) = moments_expr(x.clone());
        let w = var.clone().add_scalar(1e-5).sqrt().recip().mul(gamma.clone());
        let b = mean.clone().mul(w.clone()).neg().add(beta.clone());
        let unbiased = var.clone().detach().mul_scalar(count as f64 / (count as f64 - 1.0));
        let running = (
            rm.mul_scalar(0.9).add(mean.clone().detach().mul_scalar(0.1)),
            rv.mul_scalar(0.9).add(unbiased.mul_scalar(0.1)),
        );
        (mean, var, w, b, running)
    };
    let y = if ours { affine(x.clone(), w, b) } else { affine_expr(x.clone(), w, b) };
    let up = y.clone().detach().mul_scalar(0.9).add_scalar(0.2).sin();
    // Through a permutation, ∂y reaches the kernels as a strided view.
    let weighted = match layout {
        Layout::Contiguous => y.clone().mul(up),
        _ => y.clone().permute([0, 2, 3, 1]).mul(up.permute([0, 2, 3, 1])),
    };
    // The moments also feed the loss directly (as the running statistics do not): both of
    // their gradients are exercised.
    let loss = weighted
        .sum()
        .add(mean.clone().sum().mul_scalar(0.3))
        .add(var.clone().sum().mul_scalar(0.2));
    let g = loss.backward();
    [
        vals(mean),
        vals(var),
        vals(y),
        vals(x.grad(&g).unwrap()),
        vals(gamma.grad(&g).unwrap()),
        vals(beta.grad(&g).unwrap()),
        vals(running.0),
        vals(running.1),
    ]
}

/// The kernels on `device` against the expressions on flex, on the same inputs; and, as a note
/// only (they are Burn's, not ours), the expressions on `device` against flex's.
fn check_on(
    name: &str,
    device: &Device,
    dims: [usize; 4],
    seed: u64,
    layout: Layout,
) -> Result<(), String> {
    let ours = batch_norm(device, dims, seed, true, layout);
    let reference = batch_norm(&Device::flex(), dims, seed, false, layout);
    let names =
        ["mean", "variance", "output", "∂x", "∂γ", "∂β", "running mean", "running variance"];
    let first_off = |values: &[Vec<f32>]| {
        names.iter().zip(values).zip(&reference).find_map(|((name, a), b)| {
            let e = rel_diff(a, b, 1.0);
            (e >= 5e-5).then(|| format!("{dims:?} {layout:?} seed {seed}: {name} differs by {e}"))
        })
    };
    if name != "flex"
        && let Some(e) = first_off(&batch_norm(device, dims, seed, false, layout))
    {
        eprintln!("note: Burn's expressions on {name} against flex's: {e}");
    }
    first_off(&ours).map_or(Ok(()), |e| Err(format!("the kernels against flex's expressions: {e}")))
}

fn check(dims: [usize; 4], seed: u64) -> Result<(), String> {
    check_on("flex", &Device::flex(), dims, seed, Layout::Contiguous)
}

#[test]
fn the_kernels_match_the_tensor_expressions_on_every_backend() {
    let _serial = serial();
    let shapes = [[32, 4, 28, 28], [32, 16, 7, 7], [1, 3, 5, 7], [5, 7, 1, 1], [3, 2, 11, 4]];
    for (name, device) in devices() {
        for (k, dims) in shapes.into_iter().enumerate() {
            for layout in [Layout::Contiguous, Layout::ChannelsLast, Layout::ChannelSlice] {
                check_on(name, &device, dims, k as u64 + 21, layout)
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
            }
        }
    }
}

#[test]
fn the_kernels_match_the_tensor_expressions_on_the_search_shapes() {
    let _serial = serial();
    for (k, dims) in
        [[32, 4, 28, 28], [32, 8, 14, 14], [32, 16, 7, 7], [8, 16, 32, 32]].into_iter().enumerate()
    {
        check(dims, k as u64 + 1).unwrap();
    }
}

#[test]
fn the_kernels_match_the_tensor_expressions_on_odd_shapes() {
    let _serial = serial();
    // Planes shorter than one 8-lane block, sizes that leave remainders, one image, one
    // channel.
    let strategy = ((1usize..=5, 1usize..=7), (1usize..=11, 1usize..=11), any::<u64>(), 0usize..3);
    let config = Config { cases: 80, failure_persistence: None, ..Config::default() };
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[11; 32]);
    TestRunner::new_with_rng(config, rng)
        .run(&strategy, |((n, c), (h, w), seed, layout)| {
            prop_assume!(n * h * w > 1);
            let layout = [Layout::Contiguous, Layout::ChannelsLast, Layout::ChannelSlice][layout];
            check_on("flex", &Device::flex(), [n, c, h, w], seed, layout)
                .map_err(TestCaseError::fail)
        })
        .unwrap();
}

#[test]
fn the_moments_match_an_f64_computation() {
    let _serial = serial();
    for (name, device) in devices() {
        eprintln!("{name}");
        moments_match_f64(&device);
    }
}

fn moments_match_f64(d: &Device) {
    // A large common offset: a one-pass E[x²] − E[x]² in f32 would lose the variance.
    let d = d.clone();
    let x = qdarts_kernels::devices::seeded(&d, 5, || {
        Tensor::<4>::random([16, 3, 20, 20], Distribution::Normal(0.0, 0.01), &d).add_scalar(100.0)
    });
    let xs = vals(x.clone());
    let (mean, var) = moments(x);
    let (mean, var) = (vals(mean), vals(var));
    let plane = 400;
    for c in 0..3 {
        let values: Vec<f64> = (0..16)
            .flat_map(|n| xs[(n * 3 + c) * plane..][..plane].iter().map(|&v| f64::from(v)))
            .collect();
        let m = values.iter().sum::<f64>() / values.len() as f64;
        let v = values.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / values.len() as f64;
        assert!((f64::from(mean[c]) - m).abs() < 1e-5, "channel {c}: mean {} vs {m}", mean[c]);
        assert!(
            (f64::from(var[c]) - v).abs() < 1e-3 * v,
            "channel {c}: variance {} vs {v}",
            var[c]
        );
    }
}

/// A training BatchNorm without affine parameters, composed of the primitives with the
/// statistics differentiated (`one_step` false) or as [`normalize`] (`one_step` true), a
/// constant added to the shift (an int32 bias's rounding); its output and `∂x` under a fixed
/// upstream gradient, and the launches of the backward pass.
fn folded(
    device: &Device,
    dims: [usize; 4],
    seed: u64,
    layout: Layout,
    one_step: bool,
) -> [Vec<f32>; 3] {
    let d = device.clone().autodiff();
    let c = dims[1];
    let host = Device::flex();
    let (x, residual) = qdarts_kernels::devices::seeded(&host, seed, || {
        let stored = layout.stored(dims);
        (
            Tensor::<4>::random(stored, Distribution::Normal(1.5, 2.0), &host),
            Tensor::<1>::random([c], Distribution::Normal(0.0, 0.01), &host),
        )
    });
    let x = Tensor::<4>::from_data(x.into_data(), &d);
    let x = layout.view(x, dims);
    let x = x.require_grad();
    let residual = Tensor::<1>::from_data(residual.into_data(), &d);
    let y = if one_step {
        let m = statistics(x.clone().detach());
        let w = rstd(m.clone(), 1e-5);
        let b = shift(m.clone(), w.clone()).add(residual);
        normalize(x.clone(), m, w, b)
    } else {
        let m = statistics(x.clone());
        let w = rstd(m.clone(), 1e-5);
        let b = shift(m, w.clone()).add(residual);
        affine(x.clone(), w, b)
    };
    let up = y.clone().detach().mul_scalar(0.9).add_scalar(0.2).sin();
    let loss = match layout {
        Layout::Contiguous => y.clone().mul(up),
        _ => y.clone().permute([0, 2, 3, 1]).mul(up.permute([0, 2, 3, 1])),
    }
    .sum();
    let (g, launches) = counted(&d, || loss.backward());
    let dx = vals(x.grad(&g).unwrap());
    [vals(y), dx, launches.map(|l| l as f32).into_iter().collect()]
}

#[test]
fn normalize_is_the_folded_batch_norm_in_one_backward_step() {
    let _serial = serial();
    for (name, device) in devices() {
        if !fold_available(&device, burn::tensor::DType::F32) {
            continue;
        }
        for (k, dims) in
            [[32, 4, 28, 28], [8, 16, 7, 7], [1, 3, 5, 7], [3, 2, 11, 4]].into_iter().enumerate()
        {
            for layout in [Layout::Contiguous, Layout::ChannelsLast, Layout::ChannelSlice] {
                let what = format!("{name} {dims:?} {layout:?}");
                let [y1, dx1, l1] = folded(&device, dims, k as u64 + 5, layout, true);
                let [y0, dx0, l0] = folded(&device, dims, k as u64 + 5, layout, false);
                assert_eq!(y1, y0, "{what}: output");
                // The same operations in the same order; on CUDA a product and a sum may be
                // contracted into one fused multiply-add in one kernel and not across two.
                let e = rel_diff(&dx1, &dx0, 1e-30);
                assert!(e <= 1e-6, "{what}: ∂x differs by {e}");
                if !name.starts_with("cuda") {
                    assert_eq!(dx1, dx0, "{what}: ∂x");
                }
                // The sums and ∂x, against the composition's eight or more: its five
                // gradients, the three sums of the gradients meeting at `x`, `m` and `w`, and
                // (at some channel counts) copies of the `[2, C]` sums' rows that the shift's
                // and rstd's gradients read. The loss's own launches are on both sides.
                assert!(l0[0] - l1[0] >= 6.0, "{what}: launches {l1:?} against {l0:?}");
            }
        }
    }
}

/// `fold` of a batch `dims` laid out as `layout` and seeded running statistics, or the four
/// functions it stands for; the five results and the launches they took.
fn folded_batch(
    device: &Device,
    dims: [usize; 4],
    seed: u64,
    layout: Layout,
    at_once: bool,
) -> ([Vec<f32>; 5], Option<u64>) {
    let d = device.clone().autodiff();
    let [n, c, h, w] = dims;
    let host = Device::flex();
    let (x, mean, var) = qdarts_kernels::devices::seeded(&host, seed, || {
        let stored = layout.stored(dims);
        (
            Tensor::<4>::random(stored, Distribution::Normal(-0.7, 3.0), &host),
            Tensor::<1>::random([c], Distribution::Normal(0.0, 1.0), &host),
            Tensor::<1>::random([c], Distribution::Uniform(0.5, 2.0), &host),
        )
    });
    let x = Tensor::<4>::from_data(x.into_data(), &d);
    let x = layout.view(x, dims).require_grad();
    let mean = Tensor::<1>::from_data(mean.into_data(), &d);
    let var = Tensor::<1>::from_data(var.into_data(), &d);
    let (outs, launches) = counted(&d, || {
        if at_once {
            let f = fold(x.clone(), mean, var, 1e-5, 0.1);
            [f.statistics.reshape([2 * c]), f.weight, f.shift, f.mean, f.var]
        } else {
            let m = statistics(x.clone().detach());
            let wt = rstd(m.clone(), 1e-5);
            let b = shift(m.clone(), wt.clone());
            let (rm, rv) = running(mean, var, m.clone(), 0.1, n * h * w);
            [m.reshape([2 * c]), wt, b, rm, rv]
        }
    });
    for o in &outs {
        assert!(!o.is_require_grad(), "fold's results are constants");
    }
    (outs.map(vals), launches)
}

#[test]
fn fold_is_the_statistics_rstd_shift_and_running_update_in_one_launch() {
    let _serial = serial();
    for (name, device) in devices() {
        for (k, dims) in [[32, 4, 28, 28], [8, 16, 7, 7], [1, 3, 5, 7], [3, 2, 11, 4], [1, 5, 1, 1]]
            .into_iter()
            .enumerate()
        {
            for layout in [Layout::Contiguous, Layout::ChannelsLast, Layout::ChannelSlice] {
                let what = format!("{name} {dims:?} {layout:?}");
                let (at_once, l1) = folded_batch(&device, dims, k as u64 + 40, layout, true);
                let (apart, l0) = folded_batch(&device, dims, k as u64 + 40, layout, false);
                let parts = ["statistics", "weight", "shift", "running mean", "running var"];
                for ((a, b), part) in at_once.iter().zip(&apart).zip(parts) {
                    // The same functions of the same values; on CUDA a product and a sum may
                    // be contracted into one fused multiply-add in one kernel and not in
                    // another.
                    let e = rel_diff(a, b, 1e-30);
                    assert!(e <= 1e-6, "{what}: {part} differs by {e}");
                    if !name.starts_with("cuda") {
                        assert_eq!(a, b, "{what}: {part}");
                    }
                }
                if fold_available(&device, burn::tensor::DType::F32) {
                    // One, against the moments, rstd, shift and running kernels (and, on
                    // some backends, slices of the running update's two rows).
                    assert_eq!(l1, Some(1), "{what}: launches");
                    assert!(l0 >= Some(4), "{what}: launches apart {l0:?}");
                }
            }
        }
    }
}

/// `fold_rounded` against `fold` and then `bias::int32_rounded` of its shift with the unit
/// `factors·weight`: the same five results in one launch where those are two; and the rounded
/// shift is what an int32 bias is, a whole number of units within half a unit of the shift.
#[test]
fn fold_rounded_is_the_fold_then_the_bias_rounding_in_one_launch() {
    let _serial = serial();
    let host = Device::flex();
    let mut ran = 0;
    for (name, device) in devices() {
        let d = device.clone().autodiff();
        for (k, dims) in [[8, 16, 7, 7], [1, 3, 5, 7], [3, 2, 11, 4]].into_iter().enumerate() {
            let c = dims[1];
            // Rows of channels, each with a factor of its own (a stacked quantizer's rows).
            let rows = if c % 4 == 0 { 4 } else { 1 };
            let (x, mean, var, step, per_channel, per_row) =
                qdarts_kernels::devices::seeded(&host, k as u64 + 60, || {
                    (
                        Tensor::<4>::random(dims, Distribution::Normal(-0.7, 3.0), &host),
                        Tensor::<1>::random([c], Distribution::Normal(0.0, 1.0), &host),
                        Tensor::<1>::random([c], Distribution::Uniform(0.5, 2.0), &host),
                        Tensor::<1>::random([1], Distribution::Uniform(0.02, 0.05), &host),
                        Tensor::<1>::random([c], Distribution::Uniform(0.5, 4.0), &host),
                        Tensor::<1>::random([rows], Distribution::Uniform(0.02, 0.05), &host),
                    )
                });
            let on = |t: Tensor<1>| Tensor::<1>::from_data(t.into_data(), &d);
            let x = Tensor::<4>::from_data(x.into_data(), &d).require_grad();
            // A per-tensor input step and per-channel weight steps (a convolution's unit);
            // one factor alone; a vanishing unit, which leaves the shift as it is; and the
            // per-channel weight steps with one input step per row of channels.
            let cases = [
                vec![on(step.clone()), on(per_channel.clone())],
                vec![on(per_channel.clone().mul_scalar(0.01))],
                vec![on(step.clone().mul_scalar(0.0)), on(per_channel.clone())],
                vec![on(per_channel.clone()), on(per_row.clone())],
            ];
            for (j, factors) in cases.into_iter().enumerate() {
                if !fold_rounded_available(&x, &factors) {
                    continue;
                }
                ran += 1;
                // Each factor per channel (`int32_rounded` takes `[1]` or `[C]`).
                let per_channel_factors: Vec<Tensor<1>> = factors
                    .iter()
                    .map(|t| match t.dims()[0] {
                        l if l == 1 || l == c => t.clone(),
                        l => t.clone().reshape([l, 1]).expand([l, c / l]).reshape([c]),
                    })
                    .collect();
                for ties_away in [false, true] {
                    let what = format!("{name} {dims:?} case {j} ties away {ties_away}");
                    let ((f, at_once), l1) = counted(&d, || {
                        let f = fold_rounded(
                            x.clone(),
                            on(mean.clone()),
                            on(var.clone()),
                            1e-5,
                            0.1,
                            &factors,
                            ties_away,
                        );
                        let at_once = [
                            f.statistics.clone().reshape([2 * c]),
                            f.weight.clone(),
                            f.shift.clone(),
                            f.mean.clone(),
                            f.var.clone(),
                        ];
                        (f, at_once)
                    });
                    let ((plain, apart), l0) = counted(&d, || {
                        let f = fold(x.clone(), on(mean.clone()), on(var.clone()), 1e-5, 0.1);
                        let mut unit = per_channel_factors.clone();
                        unit.push(f.weight.clone());
                        let b = int32_rounded(f.shift.clone(), &unit, ties_away);
                        let apart = [
                            f.statistics.clone().reshape([2 * c]),
                            f.weight.clone(),
                            b,
                            f.mean.clone(),
                            f.var.clone(),
                        ];
                        (f, apart)
                    });
                    assert_eq!(l1, Some(1), "{what}: launches");
                    assert_eq!(l0, Some(2), "{what}: launches apart");
                    let parts = ["statistics", "weight", "shift", "running mean", "running var"];
                    for ((a, b), part) in at_once.into_iter().zip(apart).zip(parts) {
                        assert!(!a.is_require_grad(), "{what}: {part} is a constant");
                        let (a, b) = (vals(a), vals(b));
                        let e = rel_diff(&a, &b, 1e-30);
                        assert!(e <= 1e-6, "{what}: {part} differs by {e}");
                        if !name.starts_with("cuda") {
                            assert_eq!(a, b, "{what}: {part}");
                        }
                    }
                    // The definition, on the host in f64: the shift is the nearest multiple
                    // of the unit (or the shift itself where the unit vanishes).
                    let unit: Vec<f64> = {
                        let mut u = vec![1.0f64; c];
                        for t in factors.iter().cloned().chain([f.weight.clone()]) {
                            let v = vals(t);
                            for (i, ui) in u.iter_mut().enumerate() {
                                *ui *= f64::from(v[i / (c / v.len())]);
                            }
                        }
                        u
                    };
                    let (rounded, shift) = (vals(f.shift), vals(plain.shift));
                    let mut moved = 0;
                    for i in 0..c {
                        let (r, s, u) = (f64::from(rounded[i]), f64::from(shift[i]), unit[i].abs());
                        if u < 1e-30 {
                            assert_eq!(r, s, "{what}: channel {i} with a vanishing unit");
                            continue;
                        }
                        let q = r / u;
                        assert!((q - q.round()).abs() < 1e-3, "{what}: channel {i}: {q} units");
                        assert!((r - s).abs() <= u * 0.5 * (1.0 + 1e-5), "{what}: channel {i}");
                        moved += usize::from(r != s);
                    }
                    if j != 2 {
                        assert!(moved > 0, "{what}: no shift was rounded");
                    }
                }
            }
        }
    }
    // The kernel runs on the CubeCL backends; a build with one of them must have run it.
    if cfg!(feature = "wgpu") {
        assert!(ran > 0, "fold_rounded ran on no device");
    }
}

/// A training BatchNorm on `dims` laid out as `layout`: `fold_normalize` (`at_once`) or
/// `fold` (`fold_rounded` with `rounded`) then `normalize`; the output, `∂x` under a fixed
/// upstream gradient, the fold's five results and the forward launches.
fn fold_then_normalize(
    device: &Device,
    dims: [usize; 4],
    seed: u64,
    layout: Layout,
    rounded: bool,
    at_once: bool,
) -> (Vec<Vec<f32>>, Option<u64>) {
    let d = device.clone().autodiff();
    let c = dims[1];
    let host = Device::flex();
    let (x, mean, var, unit) = qdarts_kernels::devices::seeded(&host, seed, || {
        (
            Tensor::<4>::random(layout.stored(dims), Distribution::Normal(0.4, 2.0), &host),
            Tensor::<1>::random([c], Distribution::Normal(0.0, 1.0), &host),
            Tensor::<1>::random([c], Distribution::Uniform(0.5, 2.0), &host),
            Tensor::<1>::random([c], Distribution::Uniform(0.01, 0.2), &host),
        )
    });
    let on = |t: Tensor<1>| Tensor::<1>::from_data(t.into_data(), &d);
    let x = layout.view(Tensor::<4>::from_data(x.into_data(), &d), dims).require_grad();
    let (mean, var, unit) = (on(mean), on(var), on(unit));
    let factors = [unit];
    let rounding = rounded.then_some((&factors[..], true));
    let ((folded, y), launches) = counted(&d, || match (at_once, rounding) {
        (true, _) => fold_normalize(x.clone(), [mean, var], 1e-5, 0.1, rounding),
        (false, Some((f, ties))) => {
            let folded = fold_rounded(x.clone(), mean, var, 1e-5, 0.1, f, ties);
            let (m, w, b) =
                (folded.statistics.clone(), folded.weight.clone(), folded.shift.clone());
            (folded, normalize(x.clone(), m, w, b))
        }
        (false, None) => {
            let folded = fold(x.clone(), mean, var, 1e-5, 0.1);
            let (m, w, b) =
                (folded.statistics.clone(), folded.weight.clone(), folded.shift.clone());
            (folded, normalize(x.clone(), m, w, b))
        }
    });
    let up = y.clone().detach().mul_scalar(0.7).add_scalar(0.3).sin();
    let grads = y.clone().mul(up).sum().backward();
    let dx = vals(x.grad(&grads).unwrap());
    let five =
        [folded.statistics.reshape([2 * c]), folded.weight, folded.shift, folded.mean, folded.var];
    let mut seen = vec![vals(y), dx];
    seen.extend(five.map(vals));
    (seen, launches)
}

#[test]
fn fold_normalize_is_the_fold_then_normalize_in_one_launch_forward() {
    let _serial = serial();
    for (name, device) in devices() {
        if !fold_available(&device, burn::tensor::DType::F32) {
            continue;
        }
        for (k, dims) in
            [[8, 16, 7, 7], [1, 3, 5, 7], [3, 2, 11, 4], [2, 64, 4, 4]].into_iter().enumerate()
        {
            for layout in [Layout::Contiguous, Layout::ChannelsLast, Layout::ChannelSlice] {
                for rounded in [false, true] {
                    let what = format!("{name} {dims:?} {layout:?} rounded {rounded}");
                    let seed = 70 + k as u64;
                    let (one, l1) = fold_then_normalize(&device, dims, seed, layout, rounded, true);
                    let (two, l0) =
                        fold_then_normalize(&device, dims, seed, layout, rounded, false);
                    let parts = ["y", "∂x", "statistics", "weight", "shift", "mean", "var"];
                    for ((a, b), part) in one.iter().zip(&two).zip(parts) {
                        // On CUDA a product and a sum may be contracted into one fused
                        // multiply-add in one kernel and not in another.
                        let e = rel_diff(a, b, 1e-30);
                        assert!(e <= 1e-6, "{what}: {part} differs by {e}");
                        if !name.starts_with("cuda") {
                            assert_eq!(a, b, "{what}: {part}");
                        }
                    }
                    assert_eq!((l1, l0), (Some(1), Some(2)), "{what}: forward launches");
                }
            }
        }
    }
}
