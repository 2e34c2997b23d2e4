//! The optimizer kernels (`sgd_update`, `squared_sum`, `squared_sum_onto`, and the second-order
//! step's `axpy` and `virtual_step`) on every backend of the build against
//! the tensor expressions they replace (Burn's and PyTorch's SGD order) and against the same
//! arithmetic on the host, with gradients laid out channels-last as the convolutions leave them.

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use burn::tensor::{Device, Distribution, Tensor};
use qdarts_kernels::cat::ARITY;
use qdarts_kernels::devices::compiled as devices;
use qdarts_kernels::launches::counted;
use qdarts_kernels::optim::{
    Move, Moves, SgdStep, SgdUpdates, SquaredSum, axpy, sgd_update, squared_sum, squared_sum_onto,
    step_available, virtual_step,
};

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

/// A weight `[o, i, k, k]`, its gradient laid out `[o, k, k, i]` in memory (a strided view) and
/// a momentum buffer, drawn from `seed`.
fn draw(d: &Device, dims: [usize; 4], seed: u64) -> (Tensor<4>, Tensor<4>, Tensor<1>) {
    let [o, i, k, l] = dims;
    qdarts_kernels::devices::seeded(d, seed, || {
        let normal = Distribution::Normal(0.0, 1.0);
        (
            Tensor::<4>::random(dims, normal, d),
            Tensor::<4>::random([o, k, l, i], normal, d).permute([0, 3, 1, 2]),
            Tensor::<1>::random([o * i * k * l], normal, d),
        )
    })
}

/// The SGD step as the host computes it, operation for operation in f32.
fn host_sgd(
    w: &[f32],
    g: &[f32],
    v: Option<&[f32]>,
    (decay, momentum, lr): (f32, f32, f32),
) -> (Vec<f32>, Vec<f32>) {
    let mut out = Vec::new();
    let mut vel = Vec::new();
    for k in 0..w.len() {
        let d = w[k] * decay + g[k];
        let vk = match v {
            Some(v) => d * 1.0 + v[k] * momentum,
            None => d,
        };
        vel.push(vk);
        out.push(w[k] - vk * lr);
    }
    (out, vel)
}

#[test]
fn the_sgd_update_matches_the_expressions_and_the_host_on_every_backend() {
    let _serial = serial();
    let hyper = (3e-4f32, 0.9f32, 0.025f32);
    for (name, d) in devices() {
        for (k, dims) in
            [[16, 8, 3, 3], [4, 1, 5, 5], [7, 3, 1, 1], [1, 1, 1, 1]].into_iter().enumerate()
        {
            let (w, g, v) = draw(&d, dims, 40 + k as u64);
            let (hw, hg, hv) = (vals(w.clone()), vals(g.clone()), vals(v.clone()));
            for with_velocity in [false, true] {
                let velocity = with_velocity.then(|| v.clone());
                let step = SgdStep {
                    decay: f64::from(hyper.0),
                    momentum: f64::from(hyper.1),
                    lr: f64::from(hyper.2),
                    grad_scale: None,
                };
                let (out, vel) = sgd_update(w.clone(), g.clone(), velocity.clone(), step);
                assert_eq!(out.dims(), dims, "{name}: the weight keeps its shape");
                assert_eq!(vel.dims(), [hw.len()], "{name}: the momentum buffer is flat");
                // The expressions on the same device, as Burn's Sgd orders them.
                let dd = w.clone().mul_scalar(hyper.0 as f64).add(g.clone());
                let ve = match velocity {
                    Some(v) => dd.mul_scalar(1.0).add(v.reshape(dims).mul_scalar(hyper.1 as f64)),
                    None => dd,
                };
                let oe = w.clone().sub(ve.clone().mul_scalar(hyper.2 as f64));
                let (ho, hvel) = host_sgd(&hw, &hg, with_velocity.then_some(hv.as_slice()), hyper);
                let (out, vel) = (vals(out), vals(vel));
                let at = format!("{name} {dims:?} velocity {with_velocity}");
                // A fused multiply-add (CUDA contracts) may round the last bit differently.
                for (what, a, b) in [
                    ("weight vs expressions", &out, &vals(oe)),
                    ("momentum vs expressions", &vel, &vals(ve)),
                    ("weight vs host", &out, &ho),
                    ("momentum vs host", &vel, &hvel),
                ] {
                    let e = rel_diff(a, b, 1.0);
                    assert!(e < 1e-6, "{at}: {what} differs by {e} (relative)");
                }
            }
        }
    }
}

#[test]
fn a_scaled_gradient_is_the_scaled_gradients_step_in_one_launch() {
    let _serial = serial();
    for (name, d) in devices() {
        let dims = [16, 8, 3, 3];
        let (w, g, v) = draw(&d, dims, 70);
        let step = |grad_scale| SgdStep { decay: 3e-4, momentum: 0.9, lr: 0.025, grad_scale };
        for velocity in [None, Some(v.clone())] {
            let s = 0.3718f32;
            let (scaled, launches) =
                counted(&d, || sgd_update(w.clone(), g.clone(), velocity.clone(), step(Some(s))));
            // As `clip_grad_norm_` would leave it: the gradient scaled first, then the step.
            let apart =
                sgd_update(w.clone(), g.clone().mul_scalar(s), velocity.clone(), step(None));
            let at = format!("{name} velocity {}", velocity.is_some());
            assert_same(name, &vals(scaled.0), &vals(apart.0), &format!("{at}: weight"));
            assert_same(name, &vals(scaled.1), &vals(apart.1), &format!("{at}: momentum"));
            if let Some(n) = launches {
                assert_eq!(n, 1, "{at}: one launch");
            }
        }
    }
}

#[test]
fn the_squared_sum_matches_an_f64_sum_and_repeats_bit_for_bit_on_every_backend() {
    let _serial = serial();
    for (name, d) in devices() {
        for (k, dims) in [[64, 32, 3, 3], [16, 8, 5, 5], [3, 1, 1, 1]].into_iter().enumerate() {
            let (_, g, _) = draw(&d, dims, 60 + k as u64);
            let want: f64 = vals(g.clone()).iter().map(|&x| f64::from(x) * f64::from(x)).sum();
            let got = vals(squared_sum(g.clone()));
            assert_eq!(got.len(), 1);
            let e = (f64::from(got[0]) - want).abs() / want;
            assert!(e < 1e-5, "{name} {dims:?}: Σg² {} vs {want} (relative {e})", got[0]);
            let expr = vals(g.clone().square().sum())[0];
            assert!(((got[0] - expr) / expr).abs() < 1e-5, "{name} {dims:?}: vs the expression");
            // A fixed summation order: the same bits every time.
            for _ in 0..3 {
                assert_eq!(vals(squared_sum(g.clone()))[0].to_bits(), got[0].to_bits(), "{name}");
            }
        }
    }
}

#[test]
fn a_running_squared_sum_is_the_sum_plus_each_tensors_squared_sum_in_one_launch_each() {
    let _serial = serial();
    for (name, d) in devices() {
        let tensors: Vec<Tensor<4>> = [[8, 4, 3, 3], [3, 1, 1, 1], [16, 8, 5, 5]]
            .into_iter()
            .enumerate()
            .map(|(k, dims)| draw(&d, dims, 80 + k as u64).1)
            .collect();
        let (running, launches) = counted(&d, || {
            let mut acc: Option<Tensor<1>> = None;
            for g in &tensors {
                acc = Some(squared_sum_onto(acc, g.clone()));
            }
            vals(acc.unwrap())
        });
        // The same f32 sums added in the same order, as tensors.
        let mut want: Option<Tensor<1>> = None;
        for g in &tensors {
            let sq = squared_sum(g.clone());
            want = Some(match want {
                Some(acc) => acc.add(sq),
                None => sq,
            });
        }
        let want = vals(want.unwrap());
        assert_eq!(running[0].to_bits(), want[0].to_bits(), "{name}: {running:?} vs {want:?}");
        if let Some(n) = launches {
            assert_eq!(n, 3, "{name}: one launch per tensor");
        }
    }
}

#[test]
fn a_squared_sum_of_many_tensors_is_the_running_sum_bit_for_bit_in_one_launch_per_eight() {
    let _serial = serial();
    for (name, d) in devices() {
        let count = ARITY + 3;
        let tensors: Vec<Tensor<4>> =
            (0..count).map(|k| draw(&d, [2 + k, 3, 1 + k % 3, 3], 120 + k as u64).1).collect();
        let bias = draw(&d, [5, 1, 1, 1], 119).0.reshape([5]);
        let (many, launches) = counted(&d, || {
            let mut sum = SquaredSum::new();
            sum.add(bias.clone());
            for g in &tensors {
                sum.add(g.clone());
            }
            vals(sum.total().unwrap())
        });
        let mut want = squared_sum(bias.clone());
        for g in &tensors {
            want = squared_sum_onto(Some(want), g.clone());
        }
        let want = vals(want);
        assert_eq!(many[0].to_bits(), want[0].to_bits(), "{name}: {many:?} vs {want:?}");
        if let Some(n) = launches {
            assert_eq!(n as usize, (count + 1).div_ceil(ARITY), "{name}: one launch per eight");
        }
    }
}

/// `a` and `b` bit for bit, or within one part in 10⁶ on CUDA (which may contract `a·b + c`
/// into a fused multiply-add).
fn assert_same(backend: &str, a: &[f32], b: &[f32], what: &str) {
    if backend == "cuda" {
        let e = rel_diff(a, b, 1.0);
        assert!(e < 1e-6, "{what}: differs by {e} (relative)");
    } else {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(a), bits(b), "{what}");
    }
}

#[test]
fn the_second_order_weights_are_the_host_arithmetic_in_one_launch_on_every_backend() {
    let _serial = serial();
    let (mu, decay, xi) = (0.9f32, 3e-4f32, 0.025f32);
    for (name, d) in devices() {
        for (k, dims) in [[16, 8, 3, 3], [7, 3, 1, 1], [1, 1, 1, 1]].into_iter().enumerate() {
            let (w, g, v) = draw(&d, dims, 60 + k as u64);
            let v = v.reshape(dims);
            let (hw, hg, hv) = (vals(w.clone()), vals(g.clone()), vals(v.clone()));
            let at = format!("{name} {dims:?}");
            // The finite difference's w ± ε·v (keep 1) and a general combination.
            for (keep, step) in [(1.0f32, 1.7e-3f32), (1.0, -1.7e-3), (0.5, 3.0)] {
                let (out, launches) = counted(&d, || vals(axpy(w.clone(), g.clone(), keep, step)));
                let host: Vec<f32> = hw.iter().zip(&hg).map(|(w, g)| w * keep + g * step).collect();
                assert_same(name, &out, &host, &format!("{at}: axpy {keep}, {step}"));
                assert!(launches.is_none_or(|l| l == 1), "{at}: axpy in {launches:?} launches");
            }
            for with_velocity in [false, true] {
                let velocity = with_velocity.then(|| v.clone());
                let (out, launches) = counted(&d, || {
                    vals(virtual_step(
                        w.clone(),
                        g.clone(),
                        velocity,
                        f64::from(mu),
                        f64::from(decay),
                        f64::from(xi),
                    ))
                });
                // pt.darts: w − ((μ·v + g) + λ·w)·ξ.
                let host: Vec<f32> = (0..hw.len())
                    .map(|i| {
                        let m = if with_velocity { hv[i] * mu + hg[i] } else { hg[i] };
                        hw[i] - (m + hw[i] * decay) * xi
                    })
                    .collect();
                let what = format!("{at}: virtual step, velocity {with_velocity}");
                assert_same(name, &out, &host, &what);
                assert!(launches.is_none_or(|l| l == 1), "{what}: {launches:?} launches");
            }
        }
    }
}

#[test]
fn several_parameters_updated_at_once_are_each_ones_update_bit_for_bit_in_one_launch_per_eight() {
    let _serial = serial();
    for (name, d) in devices() {
        // Eleven parameters of two ranks: conv weights with strided gradients, and vectors;
        // every third without a momentum buffer yet (its first step).
        let params: Vec<(Tensor<4>, Tensor<4>, Option<Tensor<1>>)> = (0..11u64)
            .map(|k| {
                let dims =
                    [2 + (k as usize % 3), 3, 1 + 2 * (k as usize % 2), 1 + 2 * (k as usize % 2)];
                let (w, g, v) = draw(&d, dims, 90 + k);
                (w, g, (k % 3 != 0).then_some(v))
            })
            .collect();
        let vector = draw(&d, [7, 1, 1, 1], 120);
        for grad_scale in [None, Some(0.25f32)] {
            let step = SgdStep { decay: 3e-4, momentum: 0.9, lr: 0.025, grad_scale };
            let (results, launches) = counted(&d, || {
                let mut updates = SgdUpdates::new(step);
                let mut at: Vec<usize> = params
                    .iter()
                    .map(|(w, g, v)| updates.add(w.clone(), g.clone(), v.clone()))
                    .collect();
                let (w1, g1, v1) =
                    (vector.0.clone().reshape([7]), vector.1.clone().reshape([7]), None);
                at.push(updates.add(w1, g1, v1));
                updates.finish();
                let last = at.pop().unwrap();
                let four: Vec<(Tensor<4>, Tensor<1>)> =
                    at.into_iter().map(|i| updates.take(i)).collect();
                (four, updates.take::<1>(last))
            });
            let (four, one) = results;
            for (k, ((w, g, v), (out, vel))) in params.iter().zip(four).enumerate() {
                let (want_w, want_v) = sgd_update(w.clone(), g.clone(), v.clone(), step);
                assert_eq!(out.dims(), w.dims(), "{name}: parameter {k}'s shape");
                assert_eq!(vals(out), vals(want_w), "{name} {grad_scale:?}: parameter {k}");
                assert_eq!(vals(vel), vals(want_v), "{name} {grad_scale:?}: buffer {k}");
            }
            let w1 = vector.0.clone().reshape([7]);
            let (want_w, want_v) = sgd_update(w1, vector.1.clone().reshape([7]), None, step);
            assert_eq!(vals(one.0), vals(want_w), "{name} {grad_scale:?}: the vector");
            assert_eq!(vals(one.1), vals(want_v), "{name} {grad_scale:?}: its buffer");
            if step_available(&d, burn::tensor::DType::F32) {
                let want = 12u64.div_ceil(ARITY as u64);
                assert_eq!(launches, Some(want), "{name}: launches of twelve parameters");
            }
        }
    }
}

#[test]
fn many_second_order_weights_at_once_are_each_ones_bit_for_bit_in_one_launch_per_eight() {
    let _serial = serial();
    for (name, d) in devices() {
        // Eleven parameters of varied shapes, every third without a momentum buffer.
        let params: Vec<(Tensor<4>, Tensor<4>, Option<Tensor<1>>)> = (0..11u64)
            .map(|k| {
                let dims = [1 + (k as usize % 4), 2, 1 + 2 * (k as usize % 2), 3];
                let (w, g, v) = draw(&d, dims, 140 + k);
                (w, g, (k % 3 != 0).then_some(v))
            })
            .collect();
        let rules = [
            Move::Axpy { keep: 1.0, step: -2.3e-3 },
            Move::Virtual { momentum: 0.9, decay: 3e-4, xi: 0.025 },
        ];
        for rule in rules {
            let (outs, launches) = counted(&d, || {
                let mut moves = Moves::new(rule);
                let at: Vec<usize> = params
                    .iter()
                    .map(|(w, g, v)| moves.add(w.clone(), g.clone(), v.clone()))
                    .collect();
                moves.finish();
                at.into_iter().map(|i| vals(moves.take::<4>(i))).collect::<Vec<_>>()
            });
            for (k, ((w, g, v), out)) in params.iter().zip(outs).enumerate() {
                let want = match rule {
                    Move::Axpy { keep, step } => axpy(w.clone(), g.clone(), keep, step),
                    Move::Virtual { momentum, decay, xi } => {
                        let v = v.clone().map(|v| v.reshape(w.dims()));
                        virtual_step(w.clone(), g.clone(), v, momentum, decay, xi)
                    }
                };
                assert_eq!(out, vals(want), "{name} {rule:?}: parameter {k}");
            }
            if step_available(&d, burn::tensor::DType::F32) {
                assert_eq!(launches, Some(2), "{name} {rule:?}: launches of eleven parameters");
            }
        }
    }
}
