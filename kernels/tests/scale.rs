//! `scale` (a mixed op's `w_i · op_i(x)`) on every CubeCL backend of the build: the product and
//! `∂y` bit for bit those of Burn's broadcast product on flex, `∂w` within float rounding of an
//! f64 sum of `∂out ⊙ y`; for contiguous and channels-last `y`, upstream gradients that are
//! contiguous (scaled in place) or strided, and each input tracked alone.

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use burn::tensor::{DType, Device, Tensor, TensorData};
use qdarts_kernels::devices::compiled;
use qdarts_kernels::launches::counted;
use qdarts_kernels::scale::{scale, scale_available};

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
    seed: u64,
}

/// `(out, ∂y, ∂w)` of `f(y, w)` under the loss `Σ out ⊙ up` on `device` (an untracked input's
/// gradient empty).
fn run(
    case: Case,
    device: &Device,
    f: impl Fn(Tensor<4>, Tensor<1>) -> Tensor<4>,
) -> [Vec<f32>; 3] {
    let d = device.clone().autodiff();
    let [n, c, h, w] = case.shape;
    let count = n * c * h * w;
    let y = if case.y_channels_last {
        let t = Tensor::<4>::from_data(TensorData::new(values(count, case.seed), [n, h, w, c]), &d);
        t.permute([0, 3, 1, 2])
    } else {
        Tensor::<4>::from_data(TensorData::new(values(count, case.seed), case.shape), &d)
    };
    let wt = Tensor::<1>::from_data(TensorData::new(values(1, case.seed + 1), [1]), &d);
    let y = if case.track[0] { y.require_grad() } else { y };
    let wt = if case.track[1] { wt.require_grad() } else { wt };
    let out = f(y.clone(), wt.clone());
    let up = values(count, case.seed + 2);
    let loss = if case.grad_strided {
        // The loss reads `out` channels-last: its gradient comes back as a permuted view.
        let up = Tensor::<4>::from_data(TensorData::new(up, [n, h, w, c]), &d);
        out.clone().permute([0, 2, 3, 1]).mul(up).sum()
    } else {
        out.clone().mul(Tensor::<4>::from_data(TensorData::new(up, case.shape), &d)).sum()
    };
    let grads = loss.backward();
    let dy = y.grad(&grads).map(vals).unwrap_or_default();
    let dw = wt.grad(&grads).map(vals).unwrap_or_default();
    [vals(out), dy, dw]
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

fn check(name: &str, device: &Device, case: Case) {
    let burn = run(case, &Device::flex(), |y, w| y.mul(w.reshape([1, 1, 1, 1])));
    let ours = run(case, device, scale);
    assert_eq!(bits(&ours[0]), bits(&burn[0]), "{name} {case:?}: the product");
    assert_eq!(bits(&ours[1]), bits(&burn[1]), "{name} {case:?}: ∂y");
    assert_eq!(ours[2].len(), burn[2].len(), "{name} {case:?}: ∂w tracked on one side only");
    if case.track[1] {
        let (exact, abs) = weight_grad_f64(case);
        let err = (f64::from(ours[2][0]) - exact).abs();
        assert!(
            err <= 1e-6 * abs + 1e-30,
            "{name} {case:?}: ∂w {} against {exact} (Burn's {}), error {err:e} of Σ|·| {abs:e}",
            ours[2][0],
            burn[2][0]
        );
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
                    let case = Case { shape, y_channels_last, grad_strided, track, seed };
                    check(name, &d, case);
                }
            }
        }
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
    }
}
