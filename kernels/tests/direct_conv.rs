//! The CubeCL backends' convolution kernels against Burn's own `conv2d` on flex (forward, input
//! gradient and weight gradient), on every CubeCL backend of the build, over the geometries of
//! the DARTS candidates (depthwise, dilated, pointwise, strided), the stem's full convolution,
//! grouped ones and odd sizes; inputs drawn on the host, so both sides see the same values;
//! groups that read shared inputs against Burn's convolution of the copies, a ReLU taken
//! on read against the ReLU and then the convolution, and filters padded to a larger kernel
//! whose padding the kernels skip against the padded convolution.

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use burn::tensor::ops::ConvOptions;
use burn::tensor::{DType, Device, Tensor, TensorData, module};
use qdarts_kernels::depthwise_conv::conv2d;
use qdarts_kernels::devices::compiled;
use qdarts_kernels::direct_conv::{
    GroupInputs, Inset, conv2d_reading, conv2d_reading_inset, conv2d_reading_relu, direct_available,
};
use qdarts_kernels::launches::{counted, counted_by_kernel};
use qdarts_kernels::relu::relu;

/// The launch counter sees every thread's launches: the tests of this file run one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The CubeCL devices of this build (none in a flex-only build), with the lock that runs this
/// file's tests one at a time.
fn cube_devices() -> (std::sync::MutexGuard<'static, ()>, Vec<(&'static str, Device)>) {
    let serial = SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    (serial, cube_devices_now())
}

fn cube_devices_now() -> Vec<(&'static str, Device)> {
    compiled().into_iter().filter(|(_, d)| direct_available(d, DType::F32)).collect()
}

/// Host-drawn normal values (xorshift, Box–Muller).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut uniform = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        ((s >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    (0..n)
        .map(|_| {
            let (u, v) = (uniform(), uniform());
            ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
        })
        .collect()
}

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
    ci: usize,
    co: usize,
    h: usize,
    w: usize,
    k: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    groups: usize,
    seed: u64,
}

impl Case {
    fn options(&self) -> ConvOptions<2> {
        ConvOptions::new(self.stride, self.padding, self.dilation, self.groups)
    }
}

/// Output, ∂x and ∂w of `conv` on `device` for `case`'s host-drawn input, weight and upstream
/// gradient; `channels_last`: the input is a channels-last view rather than contiguous, and
/// the weight a view with its taps transposed.
fn run(
    case: Case,
    device: &Device,
    channels_last: bool,
    conv: impl Fn(Tensor<4>, Tensor<4>, ConvOptions<2>) -> Tensor<4>,
) -> [Vec<f32>; 3] {
    let d = device.clone().autodiff();
    let xs = [case.n, case.ci, case.h, case.w];
    let ws = [case.co, case.ci / case.groups, case.k[0], case.k[1]];
    let x = if channels_last {
        let v = values(xs.iter().product(), case.seed);
        let nhwc = Tensor::<4>::from_data(TensorData::new(v, [xs[0], xs[2], xs[3], xs[1]]), &d);
        nhwc.permute([0, 3, 1, 2])
    } else {
        Tensor::<4>::from_data(TensorData::new(values(xs.iter().product(), case.seed), xs), &d)
    };
    let wv = values(ws.iter().product(), case.seed + 1);
    let w = if channels_last {
        // The weight as a strided view too: its taps transposed in memory.
        let t = Tensor::<4>::from_data(TensorData::new(wv, [ws[0], ws[1], ws[3], ws[2]]), &d);
        t.swap_dims(2, 3)
    } else {
        Tensor::<4>::from_data(TensorData::new(wv, ws), &d)
    };
    let (x, w) = (x.require_grad(), w.require_grad());
    let y = conv(x.clone(), w.clone(), case.options());
    let up = Tensor::<4>::from_data(
        TensorData::new(values(y.dims().iter().product(), case.seed + 2), y.dims()),
        &d,
    );
    let grads = y.clone().mul(up).sum().backward();
    [vals(y), vals(x.grad(&grads).unwrap()), vals(w.grad(&grads).unwrap())]
}

/// `case` through the kernels on `device` against Burn's `conv2d` on flex.
fn check(name: &str, device: &Device, case: Case, channels_last: bool) {
    let burn = run(case, &Device::flex(), channels_last, |x, w, o| module::conv2d(x, w, None, o));
    let ours = run(case, device, channels_last, conv2d);
    for ((what, a), b) in ["output", "∂x", "∂w"].iter().zip(&ours).zip(&burn) {
        assert_eq!(
            a.len(),
            b.len(),
            "{name} {case:?}: {what} has {} values, Burn's {}",
            a.len(),
            b.len()
        );
        let e = rel_diff(a, b);
        assert!(e < 2e-5, "{name} {case:?}: {what} differs by {e} (relative to the largest value)");
    }
}

#[test]
fn the_kernels_run_on_the_cubecl_backends_only() {
    assert!(!direct_available(&Device::flex(), DType::F32));
    let (_serial, devices) = cube_devices();
    for (name, d) in devices {
        assert!(direct_available(&d.clone().autodiff(), DType::F32), "{name}");
        assert!(!direct_available(&d, DType::F64), "{name}");
    }
}

#[test]
fn the_darts_candidates_match_burns_convolution() {
    let mut seed = 1;
    let (_serial, devices) = cube_devices();
    for (name, d) in devices {
        // sep_conv / dil_conv's depthwise halves and their 1×1 convolutions, stride 1 and 2,
        // on the default and DARTS sizes.
        for (h, c) in [(28, 4), (7, 16), (32, 3)] {
            for stride in [1, 2] {
                for (k, dilation) in [(1, 1), (3, 1), (5, 1), (3, 2), (5, 2)] {
                    let p = dilation * (k - 1) / 2;
                    let groups = if k == 1 { 1 } else { c };
                    seed += 1;
                    let case = Case {
                        n: 3,
                        ci: c,
                        co: c,
                        h,
                        w: h,
                        k: [k, k],
                        stride: [stride; 2],
                        padding: [p, p],
                        dilation: [dilation; 2],
                        groups,
                        seed,
                    };
                    check(name, &d, case, false);
                }
            }
        }
    }
}

#[test]
fn full_grouped_and_odd_convolutions_match_burns() {
    let odd = |n, ci, co, h, w, k, stride, padding, dilation, groups, seed| Case {
        n,
        ci,
        co,
        h,
        w,
        k,
        stride,
        padding,
        dilation,
        groups,
        seed,
    };
    let cases = [
        // The stem: 3×3 over the image channels, C_out = 3·C.
        odd(2, 3, 12, 9, 9, [3, 3], [1, 1], [1, 1], [1, 1], 1, 11),
        // FactorizedReduce's strided 1×1, and a 1×1 that changes the channel count.
        odd(2, 8, 4, 8, 8, [1, 1], [2, 2], [0, 0], [1, 1], 1, 12),
        odd(1, 5, 7, 6, 4, [1, 1], [1, 1], [0, 0], [1, 1], 1, 13),
        // Groups of several channels, a channel multiplier, no padding, uneven axes.
        odd(2, 6, 9, 7, 5, [3, 3], [1, 1], [1, 1], [1, 1], 3, 14),
        odd(2, 4, 8, 6, 7, [3, 2], [2, 1], [0, 1], [1, 2], 4, 15),
        odd(3, 2, 3, 5, 9, [2, 4], [1, 3], [2, 0], [2, 1], 1, 16),
    ];
    let (_serial, devices) = cube_devices();
    for (name, d) in devices {
        for case in cases {
            check(name, &d, case, false);
        }
    }
}

#[test]
fn strided_inputs_and_weights_give_the_same_values() {
    let (_serial, devices) = cube_devices();
    for (name, d) in devices {
        let case = Case {
            n: 2,
            ci: 6,
            co: 6,
            h: 10,
            w: 10,
            k: [3, 3],
            stride: [1, 1],
            padding: [2, 2],
            dilation: [2, 2],
            groups: 6,
            seed: 21,
        };
        check(name, &d, case, true);
        let full = Case { co: 4, k: [3, 2], padding: [1, 0], dilation: [1, 1], groups: 2, ..case };
        check(name, &d, full, true);
    }
}

#[test]
fn a_forward_is_one_launch() {
    let (_serial, devices) = cube_devices();
    for (name, d) in devices {
        let x =
            Tensor::<4>::from_data(TensorData::new(values(2 * 4 * 8 * 8, 31), [2, 4, 8, 8]), &d);
        let w = Tensor::<4>::from_data(TensorData::new(values(4 * 9, 32), [4, 1, 3, 3]), &d);
        let options = ConvOptions::new([1, 1], [1, 1], [1, 1], 4);
        let (y, launches) = counted(&d, || conv2d(x.clone(), w.clone(), options.clone()));
        assert_eq!(y.dims(), [2, 4, 8, 8], "{name}");
        assert_eq!(launches, Some(1), "{name}: launches of a contiguous forward");
    }
}

/// Output, ∂x and ∂w (empty where untracked) of a grouped 1×1 convolution on `d` whose output's
/// gradient arrives strided (the loss reads the output through a permutation), and the copy
/// kernels its backward launched.
fn strided_gradient(d: &Device, track: [bool; 2]) -> ([Vec<f32>; 3], u64) {
    let d = d.clone().autodiff();
    let x = Tensor::<4>::from_data(TensorData::new(values(2 * 8 * 6 * 6, 41), [2, 8, 6, 6]), &d);
    let w = Tensor::<4>::from_data(TensorData::new(values(8 * 4, 42), [8, 4, 1, 1]), &d);
    let x = if track[0] { x.require_grad() } else { x };
    let w = if track[1] { w.require_grad() } else { w };
    let opts = ConvOptions::new([1, 1], [0, 0], [1, 1], 2);
    let y = qdarts_kernels::direct_conv::conv2d(x.clone(), w.clone(), opts);
    let up = Tensor::<4>::from_data(TensorData::new(values(2 * 6 * 6 * 8, 43), [2, 6, 6, 8]), &d);
    let loss = y.clone().permute([0, 2, 3, 1]).mul(up).sum();
    let (grads, kinds) = counted_by_kernel(&d, || loss.backward());
    let copies =
        kinds.unwrap_or_default().iter().filter(|(k, _)| k.contains("copy")).map(|(_, n)| n).sum();
    let grad = |t: &Tensor<4>| t.grad(&grads).map(vals).unwrap_or_default();
    ([vals(y), grad(&x), grad(&w)], copies)
}

#[test]
fn both_gradients_at_once_are_each_alone_bitwise_and_copy_a_strided_gradient_once() {
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    let (_serial, devices) = cube_devices();
    for (name, d) in devices {
        let ([y, dx, dw], copies) = strided_gradient(&d, [true, true]);
        let ([_, dx_alone, _], copies_x) = strided_gradient(&d, [true, false]);
        let ([_, _, dw_alone], copies_w) = strided_gradient(&d, [false, true]);
        assert!(!dx.is_empty() && !dw.is_empty() && y.len() == dx.len(), "{name}");
        assert_eq!(bits(&dx), bits(&dx_alone), "{name}: ∂x");
        assert_eq!(bits(&dw), bits(&dw_alone), "{name}: ∂w");
        assert_eq!((copies, copies_x, copies_w), (1, 1, 1), "{name}: copies of the strided ∂y");
    }
}

/// Output, ∂x and ∂w of `conv` on `device` for host-drawn `x` `[n, ci, 6, 5]`, weights
/// `[co, C_g, 3, 3]` and upstream gradient, with `groups` groups (padding 1, dilation `dil`).
fn run_groups(
    device: &Device,
    [n, ci, co, cig]: [usize; 4],
    groups: usize,
    dil: usize,
    conv: impl Fn(Tensor<4>, Tensor<4>, ConvOptions<2>) -> Tensor<4>,
) -> [Vec<f32>; 3] {
    let d = device.clone().autodiff();
    let (xs, ws) = ([n, ci, 6, 5], [co, cig, 3, 3]);
    let x = Tensor::<4>::from_data(TensorData::new(values(xs.iter().product(), 41), xs), &d);
    let w = Tensor::<4>::from_data(TensorData::new(values(ws.iter().product(), 42), ws), &d);
    let options = ConvOptions::new([1, 1], [dil, dil], [dil, dil], groups);
    backward_of(&conv, (x, w), options, 43)
}

/// Output, ∂x and ∂w of `conv` of `x` and `w` under a host-drawn upstream gradient (`seed`).
fn backward_of(
    conv: impl Fn(Tensor<4>, Tensor<4>, ConvOptions<2>) -> Tensor<4>,
    (x, w): (Tensor<4>, Tensor<4>),
    options: ConvOptions<2>,
    seed: u64,
) -> [Vec<f32>; 3] {
    let (x, w) = (x.require_grad(), w.require_grad());
    let y = conv(x.clone(), w.clone(), options);
    let up = Tensor::<4>::from_data(
        TensorData::new(values(y.dims().iter().product(), seed), y.dims()),
        &y.device(),
    );
    let grads = y.clone().mul(up).sum().backward();
    [vals(y), vals(x.grad(&grads).unwrap()), vals(w.grad(&grads).unwrap())]
}

#[test]
fn groups_that_read_shared_inputs_match_burns_convolution_of_the_copies() {
    let (_serial, devices) = cube_devices();
    // (sources, per, inner, copies, C_g): a wave's depthwise convolutions (two states, two
    // edges each, three kinds; one source, four edges) and a grouped one with two channels
    // a group.
    for (sources, per, inner, copies, cig) in [(2, 2, 3, 3, 1), (1, 4, 2, 2, 1), (2, 1, 2, 2, 2)] {
        let inputs = GroupInputs { sources, per, inner };
        let groups = copies * sources * per * inner;
        let shape = [2, sources * inner * cig, groups, cig];
        let burn = |x: Tensor<4>, w, o: ConvOptions<2>| {
            module::conv2d(inputs.laid_out(x, o.groups), w, None, o)
        };
        let reading = |x, w, o| conv2d_reading(x, w, o, inputs);
        for dil in [1, 2] {
            let want = run_groups(&Device::flex(), shape, groups, dil, burn);
            let flex = run_groups(&Device::flex(), shape, groups, dil, reading);
            assert_eq!(flex, want, "{inputs:?}: flex is Burn's convolution of the copies");
            for (name, d) in &devices {
                let ours = run_groups(d, shape, groups, dil, reading);
                for ((what, a), b) in ["output", "∂x", "∂w"].iter().zip(&ours).zip(&want) {
                    let e = rel_diff(a, b);
                    assert!(e < 2e-5, "{name} {inputs:?} dilation {dil}: {what} differs by {e}");
                }
                let x = Tensor::<4>::zeros([2, sources * inner * cig, 6, 5], d);
                let w = Tensor::<4>::zeros([groups, cig, 3, 3], d);
                let options = ConvOptions::new([1, 1], [1, 1], [1, 1], groups);
                let (_, launches) = counted(d, || conv2d_reading(x, w, options, inputs));
                assert_eq!(launches, Some(1), "{name}: the forward reads the inputs in place");
            }
        }
    }
}

/// Output, ∂x, ∂w and the launches forward and backward of `conv` as [`run_groups`] runs it.
fn run_counted(
    device: &Device,
    shape: [usize; 4],
    groups: usize,
    conv: impl Fn(Tensor<4>, Tensor<4>, ConvOptions<2>) -> Tensor<4>,
) -> ([Vec<f32>; 3], [Option<u64>; 2]) {
    let d = device.clone().autodiff();
    let [n, ci, co, cig] = shape;
    let (xs, ws) = ([n, ci, 6, 5], [co, cig, 3, 3]);
    let x = Tensor::<4>::from_data(TensorData::new(values(xs.iter().product(), 51), xs), &d);
    let w = Tensor::<4>::from_data(TensorData::new(values(ws.iter().product(), 52), ws), &d);
    let (x, w) = (x.require_grad(), w.require_grad());
    let options = ConvOptions::new([1, 1], [1, 1], [1, 1], groups);
    let (y, forward) = counted(&d, || conv(x.clone(), w.clone(), options));
    let up = Tensor::<4>::from_data(
        TensorData::new(values(y.dims().iter().product(), 53), y.dims()),
        &d,
    );
    let loss = y.clone().mul(up).sum();
    let (grads, backward) = counted(&d, || loss.backward());
    let seen = [vals(y), vals(x.grad(&grads).unwrap()), vals(w.grad(&grads).unwrap())];
    (seen, [forward, backward])
}

#[test]
fn a_relu_taken_on_read_is_the_relu_then_the_convolution_bit_for_bit() {
    let (_serial, devices) = cube_devices();
    for (sources, per, inner, copies, cig) in [(2, 2, 3, 3, 1), (1, 1, 4, 1, 1), (2, 1, 2, 2, 2)] {
        let inputs = GroupInputs { sources, per, inner };
        let groups = copies * sources * per * inner;
        let shape = [2, sources * inner * cig, groups, cig];
        let apart = |x: Tensor<4>, w, o| conv2d_reading(relu(x), w, o, inputs);
        let on_read = |x, w, o| conv2d_reading_relu(x, w, o, inputs);
        let want = run_counted(&Device::flex(), shape, groups, apart).0;
        let flex = run_counted(&Device::flex(), shape, groups, on_read).0;
        assert_eq!(flex, want, "{inputs:?}: flex is the ReLU, then the convolution");
        for (name, d) in &devices {
            let (want, [f0, b0]) = run_counted(d, shape, groups, apart);
            let (ours, [f1, b1]) = run_counted(d, shape, groups, on_read);
            for ((what, a), b) in ["output", "∂x", "∂w"].iter().zip(&ours).zip(&want) {
                assert_eq!(a, b, "{name} {inputs:?}: {what}");
            }
            // The ReLU's launch forward and its gradient's backward are gone.
            let (f0, b0, f1, b1) = (f0.unwrap(), b0.unwrap(), f1.unwrap(), b1.unwrap());
            assert_eq!((f1 + 1, b1 + 1), (f0, b0), "{name} {inputs:?}: launches");
        }
    }
}

/// Output, ∂x and ∂w of a depthwise convolution of 5×5 filters whose first `narrow` are 3×3
/// ones padded with zeros, reading shared inputs, by `conv`.
fn run_inset(
    device: &Device,
    narrow: usize,
    dil: usize,
    conv: impl Fn(Tensor<4>, Tensor<4>, ConvOptions<2>) -> Tensor<4>,
) -> [Vec<f32>; 3] {
    let d = device.clone().autodiff();
    let groups = 24;
    let (xs, ws) = ([2, 6, 7, 6], [groups, 1, 5, 5]);
    let x = Tensor::<4>::from_data(TensorData::new(values(xs.iter().product(), 61), xs), &d);
    let mut filters = values(ws.iter().product(), 62);
    for (i, v) in filters.iter_mut().enumerate() {
        let (o, ki, kj) = (i / 25, i / 5 % 5, i % 5);
        if o < narrow && (ki % 4 == 0 || kj % 4 == 0) {
            *v = 0.0;
        }
    }
    let w = Tensor::<4>::from_data(TensorData::new(filters, ws), &d);
    let options = ConvOptions::new([1, 1], [2 * dil; 2], [dil, dil], groups);
    backward_of(&conv, (x, w), options, 63)
}

#[test]
fn inset_filters_skip_their_padding_with_the_padded_filters_values() {
    let (_serial, devices) = cube_devices();
    // A wave's depthwise convolution: two states, two edges each, three channels, two kinds
    // (sep 3×3 padded to 5×5, then sep 5×5).
    let inputs = GroupInputs { sources: 2, per: 2, inner: 3 };
    let narrow = 12;
    let inset = Inset { channels: narrow, by: 1 };
    for (name, d) in &devices {
        for (dil, relu) in [(1, true), (2, true), (1, false)] {
            let padded = |x, w, o| match relu {
                true => conv2d_reading_relu(x, w, o, inputs),
                false => conv2d_reading(x, w, o, inputs),
            };
            let skipping = |x, w, o| conv2d_reading_inset(x, w, o, inputs, relu, inset);
            let want = run_inset(d, narrow, dil, padded);
            let ours = run_inset(d, narrow, dil, skipping);
            let what = format!("{name}, dilation {dil}, relu {relu}");
            assert_eq!(ours[0], want[0], "{what}: output");
            assert_eq!(ours[1], want[1], "{what}: ∂x");
            for (i, (a, b)) in ours[2].iter().zip(&want[2]).enumerate() {
                let (o, ki, kj) = (i / 25, i / 5 % 5, i % 5);
                let padding = o < narrow && (ki % 4 == 0 || kj % 4 == 0);
                let b = if padding { 0.0 } else { *b };
                assert_eq!(a.to_bits(), b.to_bits(), "{what}: ∂w[{o}, 0, {ki}, {kj}]");
            }
        }
    }
}
