//! `scale`, `scale_at` and `add_scaled` (a mixed op's `Σ w_i · op_i(x)`) on every CubeCL backend
//! of the build against Burn's broadcast product and add on flex: the product, `∂y` and `∂acc`
//! bit for bit, a running sum within the one rounding a fused multiply-add saves, `∂w` zero but
//! at the index read and there within float rounding of an f64 sum of `∂out ⊙ y`; for
//! contiguous and channels-last inputs, upstream gradients that are contiguous (scaled in place)
//! or strided, a running sum that is owned (summed in place) or shared (left as it was), and each
//! input tracked alone.

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use burn::tensor::{DType, Device, Tensor, TensorData};
use qdarts_kernels::devices::compiled;
use qdarts_kernels::launches::counted;
use qdarts_kernels::scale::{add_scaled, scale, scale_at, scale_available};

/// The launch counter sees every thread's launches: the tests of this file run one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The CubeCL devices of this build (none in a flex-only build), with the lock that runs this
/// file's tests one at a time.
fn cube_devices() -> (std::sync::MutexGuard<'static, ()>, Vec<(&'static str, Device)>) {
    let serial = SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let devices = compiled().into_iter().filter(|(_, d)| scale_available(d, DType::F32)).collect();
    (serial, devices)
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

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[derive(Debug, Clone, Copy)]
struct Case {
    shape: [usize; 4],
    /// `y` as a channels-last view.
    y_channels_last: bool,
    /// The upstream gradient arrives as a channels-last view.
    grad_strided: bool,
    /// `[y, w]` require a gradient.
    track: [bool; 2],
    /// Length of `w` and the index read (`[1]`, 0 for [`scale`]).
    weights: (usize, usize),
    /// The running sum `acc` of [`add_scaled`]: `None` when the function does not read it.
    acc: Option<Acc>,
    seed: u64,
}

/// How [`add_scaled`]'s `acc` arrives.
#[derive(Debug, Clone, Copy)]
struct Acc {
    /// As a channels-last view.
    channels_last: bool,
    /// Requires a gradient.
    tracked: bool,
    /// Another handle to it is held across the call (its buffer must not be written).
    shared: bool,
}

/// A `Case` for [`scale`].
fn scale_case(
    shape: [usize; 4],
    (y_channels_last, grad_strided): (bool, bool),
    track: [bool; 2],
    seed: u64,
) -> Case {
    Case { shape, y_channels_last, grad_strided, track, weights: (1, 0), acc: None, seed }
}

/// A host tensor of `shape`'s values drawn with `seed`, on `device`, as a channels-last view
/// when asked.
fn input(shape: [usize; 4], seed: u64, channels_last: bool, device: &Device) -> Tensor<4> {
    let [n, c, h, w] = shape;
    let v = values(n * c * h * w, seed);
    if channels_last {
        Tensor::<4>::from_data(TensorData::new(v, [n, h, w, c]), device).permute([0, 3, 1, 2])
    } else {
        Tensor::<4>::from_data(TensorData::new(v, shape), device)
    }
}

/// `(out, ∂acc, ∂y, ∂w)` of `f(acc, y, w)` under the loss `Σ out ⊙ up` on `device` (an
/// untracked input's gradient empty); with a shared `acc`, also checks that its values survived.
fn run(
    case: Case,
    device: &Device,
    f: impl Fn(Tensor<4>, Tensor<4>, Tensor<1>) -> Tensor<4>,
) -> [Vec<f32>; 4] {
    let d = device.clone().autodiff();
    let [n, c, h, w] = case.shape;
    let count = n * c * h * w;
    let y = input(case.shape, case.seed, case.y_channels_last, &d);
    let (len, _) = case.weights;
    let wt = Tensor::<1>::from_data(TensorData::new(values(len, case.seed + 1), [len]), &d);
    let y = if case.track[0] { y.require_grad() } else { y };
    let wt = if case.track[1] { wt.require_grad() } else { wt };
    let spec = case.acc.unwrap_or(Acc { channels_last: false, tracked: false, shared: false });
    let acc = input(case.shape, case.seed + 3, spec.channels_last, &d);
    let acc = if spec.tracked { acc.require_grad() } else { acc };
    // A buffer of its own (`+ 0` is exact), so that an unshared sum reaches `f` owned.
    let sum = acc.clone().add_scalar(0.0);
    let before = spec.shared.then(|| (sum.clone(), vals(sum.clone())));
    let out = f(sum, y.clone(), wt.clone());
    if let Some((held, values)) = before {
        assert_eq!(bits(&vals(held)), bits(&values), "{case:?}: a shared sum was overwritten");
    }
    let up = values(count, case.seed + 2);
    let loss = if case.grad_strided {
        // The loss reads `out` channels-last: its gradient comes back as a permuted view.
        let up = Tensor::<4>::from_data(TensorData::new(up, [n, h, w, c]), &d);
        out.clone().permute([0, 2, 3, 1]).mul(up).sum()
    } else {
        out.clone().mul(Tensor::<4>::from_data(TensorData::new(up, case.shape), &d)).sum()
    };
    let grads = loss.backward();
    let grad = |t: Tensor<4>| t.grad(&grads).map(vals).unwrap_or_default();
    let dacc = if spec.tracked { grad(acc) } else { Vec::new() };
    let dy = grad(y);
    let dw = wt.grad(&grads).map(vals).unwrap_or_default();
    [vals(out), dacc, dy, dw]
}

/// `Σ ∂out ⊙ y` in f64 and `Σ |∂out ⊙ y|`, from the same host values as [`run`].
fn weight_grad_f64(case: Case) -> (f64, f64) {
    let [n, c, h, w] = case.shape;
    let count = n * c * h * w;
    let (yv, up) = (values(count, case.seed), values(count, case.seed + 2));
    let (mut sum, mut abs) = (0.0f64, 0.0f64);
    for b in 0..n {
        for ch in 0..c {
            for r in 0..h {
                for q in 0..w {
                    let nchw = ((b * c + ch) * h + r) * w + q;
                    let nhwc = ((b * h + r) * w + q) * c + ch;
                    let yi = if case.y_channels_last { yv[nhwc] } else { yv[nchw] };
                    let gi = if case.grad_strided { up[nhwc] } else { up[nchw] };
                    let p = f64::from(yi) * f64::from(gi);
                    sum += p;
                    abs += p.abs();
                }
            }
        }
    }
    (sum, abs)
}

/// `w[i]` broadcast as Burn's expressions give it.
fn burn_weight(w: Tensor<1>, i: usize) -> Tensor<4> {
    w.slice(i..i + 1).reshape([1, 1, 1, 1])
}

/// Burn's expressions on flex against `ours` on `device`: the product or sum and `∂y` (and
/// `∂acc`) bit for bit, except a sum, which may round once less (a fused multiply-add); `∂w`
/// zero but at the index, that value within float rounding of an f64 sum of `∂out ⊙ y`.
fn check(
    name: &str,
    device: &Device,
    case: Case,
    ours: impl Fn(Tensor<4>, Tensor<4>, Tensor<1>) -> Tensor<4>,
) {
    let i = case.weights.1;
    let reference = |case: Case| {
        run(case, &Device::flex(), |acc, y, w| {
            let term = y.mul(burn_weight(w, i));
            if case.acc.is_some() { acc.add(term) } else { term }
        })
    };
    let burn = reference(case);
    let ours = run(case, device, ours);
    if case.acc.is_some() {
        // One rounding of `acc + y·w` apart at most: the product's.
        let [product, ..] = reference(Case { acc: None, ..case });
        for (k, ((o, b), p)) in ours[0].iter().zip(&burn[0]).zip(&product).enumerate() {
            let bound = f32::EPSILON * (b.abs() + p.abs());
            assert!((o - b).abs() <= bound, "{name} {case:?}: sum {k}: {o} against Burn's {b}");
        }
    } else {
        assert_eq!(bits(&ours[0]), bits(&burn[0]), "{name} {case:?}: the product");
    }
    assert_eq!(bits(&ours[1]), bits(&burn[1]), "{name} {case:?}: ∂acc");
    assert_eq!(bits(&ours[2]), bits(&burn[2]), "{name} {case:?}: ∂y");
    assert_eq!(ours[3].len(), burn[3].len(), "{name} {case:?}: ∂w tracked on one side only");
    if case.track[1] {
        let (exact, abs) = weight_grad_f64(case);
        for (k, &v) in ours[3].iter().enumerate() {
            if k != i {
                assert_eq!(v.to_bits(), 0, "{name} {case:?}: ∂w[{k}] of an unread weight");
                continue;
            }
            let err = (f64::from(v) - exact).abs();
            assert!(
                err <= 1e-6 * abs + 1e-30,
                "{name} {case:?}: ∂w {v} against {exact} (Burn's {}), error {err:e} of Σ|·| {abs:e}",
                burn[3][k]
            );
        }
    }
}

#[test]
fn the_kernels_run_on_the_cubecl_backends_only() {
    assert!(!scale_available(&Device::flex(), DType::F32));
    let (_serial, devices) = cube_devices();
    for (name, d) in devices {
        assert!(scale_available(&d.clone().autodiff(), DType::F32), "{name}");
        assert!(!scale_available(&d, DType::F64), "{name}");
    }
}

#[test]
fn product_and_gradients_match_burns_broadcast_product() {
    let (_serial, devices) = cube_devices();
    let mut seed = 1;
    for (name, d) in devices {
        // One chunk, several with a partial last one, and the DARTS shape's first cells.
        for shape in [[2, 3, 5, 7], [2, 4, 33, 17], [8, 16, 32, 32]] {
            for (y_channels_last, grad_strided) in
                [(false, false), (true, false), (false, true), (true, true)]
            {
                for track in [[true, true], [false, true], [true, false]] {
                    seed += 3;
                    let case = scale_case(shape, (y_channels_last, grad_strided), track, seed);
                    check(name, &d, case, |_, y, w| scale(y, w));
                }
            }
        }
    }
}

/// The track patterns of `[y, w]`.
const TRACKS: [[bool; 2]; 3] = [[true, true], [false, true], [true, false]];

/// The layouts of `(y, ∂out)`: both contiguous, both channels-last.
const LAYOUTS: [(bool, bool); 2] = [(false, false), (true, true)];

#[test]
fn one_weight_of_a_vector_scales_and_only_it_gets_a_gradient() {
    let (_serial, devices) = cube_devices();
    let mut seed = 500;
    for (name, d) in devices {
        for (layout, track, i) in LAYOUTS
            .into_iter()
            .flat_map(|l| TRACKS.into_iter().flat_map(move |t| [0, 4].map(|i| (l, t, i))))
        {
            seed += 3;
            let case = Case { weights: (5, i), ..scale_case([2, 4, 33, 17], layout, track, seed) };
            check(name, &d, case, move |_, y, w| scale_at(y, w, i));
        }
    }
}

#[test]
fn a_running_sum_matches_burns_add_of_a_product() {
    let (_serial, devices) = cube_devices();
    // Owned and contiguous (summed in place), shared (left as it was), channels-last.
    let accs = [
        Acc { channels_last: false, tracked: true, shared: false },
        Acc { channels_last: false, tracked: false, shared: false },
        Acc { channels_last: false, tracked: true, shared: true },
        Acc { channels_last: true, tracked: true, shared: false },
    ];
    let mut seed = 900;
    for (name, d) in devices {
        for shape in [[2, 3, 5, 7], [2, 4, 33, 17]] {
            for (layout, track, acc) in LAYOUTS
                .into_iter()
                .flat_map(|l| TRACKS.into_iter().flat_map(move |t| accs.map(|a| (l, t, a))))
            {
                for i in [0, 7] {
                    seed += 5;
                    let base = scale_case(shape, layout, track, seed);
                    let case = Case { weights: (8, i), acc: Some(acc), ..base };
                    check(name, &d, case, move |acc, y, w| add_scaled(Some(acc), y, w, i));
                }
            }
        }
    }
}

#[test]
fn without_a_sum_the_running_sum_is_the_product() {
    let (_serial, devices) = cube_devices();
    for (name, d) in devices {
        let case =
            Case { weights: (3, 1), ..scale_case([2, 3, 5, 7], (false, false), [true; 2], 77) };
        check(name, &d, case, |_, y, w| add_scaled(None, y, w, 1));
    }
}

#[test]
fn a_forward_is_one_launch() {
    let (_serial, devices) = cube_devices();
    for (name, d) in devices {
        let y = Tensor::<4>::from_data(TensorData::new(values(2 * 3 * 4 * 5, 7), [2, 3, 4, 5]), &d);
        let w = Tensor::<1>::from_data(TensorData::new(vec![0.5f32], [1]), &d);
        let (out, launches) = counted(&d, || scale(y.clone(), w.clone()));
        assert_eq!(launches, Some(1), "{name}: launches of a contiguous forward");
        assert_eq!(out.dims(), [2, 3, 4, 5], "{name}");
        let w = Tensor::<1>::from_data(TensorData::new(values(4, 8), [4]), &d);
        let acc = Tensor::<4>::from_data(TensorData::new(values(120, 9), [2, 3, 4, 5]), &d);
        let (_, launches) = counted(&d, || add_scaled(Some(acc), y.clone(), w.clone(), 3));
        assert_eq!(launches, Some(1), "{name}: launches of a running sum, in place");
        let acc = Tensor::<4>::from_data(TensorData::new(values(120, 9), [2, 5, 4, 3]), &d);
        let acc = acc.permute([0, 3, 2, 1]);
        let (_, launches) = counted(&d, || add_scaled(Some(acc), y.clone(), w.clone(), 3));
        assert_eq!(launches, Some(1), "{name}: launches of a running sum over a strided one");
    }
}
