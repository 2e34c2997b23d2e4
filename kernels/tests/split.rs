//! The split: its parts are `narrow`'s bit for bit, and so is the input's gradient (each
//! element one part's gradient, or 0 where no gradient reached the part), on every compiled
//! backend, along every dimension, with parts the loss does not reach, parts used twice and an
//! input also used whole; on the CubeCL backends the backward in fewer launches than the
//! narrows' (one concatenation against a zero fill, a write and an add per part). The fan-out:
//! the gradients of a tensor's uses summed, as Burn sums them, in one launch per eight. The
//! pick: parts picked from a vector at positions are `select`'s, and so is the vector's
//! gradient, in one launch each way per eight parts.

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use burn::tensor::{Device, Int, Tensor, TensorData};
use qdarts_kernels::devices::compiled as devices;
use qdarts_kernels::fan_out::{fan_out, fan_out_available};
use qdarts_kernels::launches::counted;
use qdarts_kernels::pick::{pick, pick_available};
use qdarts_kernels::split::split;

const SHAPE: [usize; 4] = [4, 6, 5, 3];

/// The launch counter sees every thread's launches: the tests of this file run one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Host-drawn values (xorshift), in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.max(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn tensor(shape: [usize; 4], seed: u64, device: &Device) -> Tensor<4> {
    let n = shape.iter().product();
    Tensor::from_data(TensorData::new(values(n, seed), shape), device)
}

fn bits(t: Tensor<4>) -> Vec<u32> {
    t.into_data()
        .convert::<f32>()
        .try_to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

/// How the loss uses the parts.
#[derive(Debug, Clone, Copy)]
enum Use {
    /// Every part once.
    All,
    /// Every part but the second.
    SkipOne,
    /// The first part twice, the rest once.
    Twice,
    /// Every part, and the input whole too.
    WithInput,
}

/// The loss `Σ_i Σ parts_i ⊙ up_i` (as `uses` says) and the input's gradient, the parts cut
/// by `cut`.
fn run(
    device: &Device,
    dim: usize,
    uses: Use,
    cut: impl Fn(Tensor<4>) -> Vec<Tensor<4>>,
) -> (Vec<Vec<u32>>, Vec<u32>) {
    let x = tensor(SHAPE, 7 + dim as u64, device).require_grad();
    let parts = cut(x.clone());
    let values: Vec<Vec<u32>> = parts.iter().map(|p| bits(p.clone())).collect();
    let mut loss: Option<Tensor<4>> = None;
    let mut add = |t: Tensor<4>| loss = Some(loss.take().map_or(t.clone(), |l| l.add(t)));
    for (i, p) in parts.iter().enumerate() {
        if matches!(uses, Use::SkipOne) && i == 1 {
            continue;
        }
        let up = tensor(p.dims(), 100 + i as u64, device);
        let term = p.clone().mul(up).sum().reshape([1, 1, 1, 1]);
        add(term.clone());
        if matches!(uses, Use::Twice) && i == 0 {
            add(term.mul_scalar(3.0));
        }
    }
    if matches!(uses, Use::WithInput) {
        add(x.clone().mul_scalar(0.5).sum().reshape([1, 1, 1, 1]));
    }
    let grads = loss.unwrap().backward();
    (values, bits(x.grad(&grads).unwrap()))
}

fn narrows(x: Tensor<4>, dim: usize, sizes: &[usize]) -> Vec<Tensor<4>> {
    let mut at = 0;
    sizes
        .iter()
        .map(|&len| {
            at += len;
            x.clone().narrow(dim, at - len, len)
        })
        .collect()
}

/// The cuts of each dimension of [`SHAPE`] tried: uneven, a part of one, the whole in two.
fn cuts() -> Vec<(usize, Vec<usize>)> {
    vec![(0, vec![1, 3]), (1, vec![2, 1, 3]), (2, vec![1, 1, 1, 2]), (3, vec![2, 1])]
}

#[test]
fn the_parts_and_the_gradient_are_narrows_bit_for_bit() {
    let _serial = serial();
    for (backend, d) in devices() {
        let d = d.autodiff();
        for (dim, sizes) in cuts() {
            for uses in [Use::All, Use::SkipOne, Use::Twice, Use::WithInput] {
                let ours = run(&d, dim, uses, |x| split(x, dim, &sizes));
                let burns = run(&d, dim, uses, |x| narrows(x, dim, &sizes));
                assert_eq!(ours.0, burns.0, "{backend} dim {dim} {sizes:?} {uses:?}: values");
                assert_eq!(ours.1, burns.1, "{backend} dim {dim} {sizes:?} {uses:?}: gradient");
            }
        }
    }
}

#[test]
fn an_untracked_input_is_cut_as_narrow_cuts_it() {
    let _serial = serial();
    for (backend, d) in devices() {
        for device in [d.clone(), d.autodiff()] {
            for (dim, sizes) in cuts() {
                let x = tensor(SHAPE, 3, &device);
                let ours: Vec<_> = split(x.clone(), dim, &sizes).into_iter().map(bits).collect();
                let burns: Vec<_> = narrows(x, dim, &sizes).into_iter().map(bits).collect();
                assert_eq!(ours, burns, "{backend} dim {dim} {sizes:?}");
            }
        }
    }
}

#[test]
#[should_panic(expected = "split: parts [2, 2] of a dimension of size 6")]
fn parts_that_do_not_cover_the_dimension_are_refused() {
    let x = tensor(SHAPE, 1, &devices()[0].1);
    let _ = split(x, 1, &[2, 2]);
}

#[test]
fn the_backward_takes_fewer_launches_than_the_narrows_on_the_cubecl_backends() {
    let _serial = serial();
    for (backend, d) in devices() {
        let d = d.autodiff();
        let sizes = [1, 2, 1, 2];
        let launches = |cut: &dyn Fn(Tensor<4>) -> Vec<Tensor<4>>| {
            let x = tensor(SHAPE, 11, &d).require_grad();
            let loss = cut(x.clone()).into_iter().map(|p| p.sum()).reduce(|a, b| a.add(b)).unwrap();
            counted(&d, || drop(loss.backward())).1
        };
        let ours = launches(&|x| split(x, 1, &sizes));
        let burns = launches(&|x| narrows(x, 1, &sizes));
        match (ours, burns) {
            (Some(ours), Some(burns)) => {
                eprintln!("{backend}: split backward {ours} launches, narrows {burns}");
                assert!(ours < burns, "{backend}: {ours} launches against the narrows' {burns}");
            }
            (None, None) => {}
            other => panic!("{backend}: launches counted for one form only: {other:?}"),
        }
    }
}

/// `x`'s gradient (bits) and the backward's launches when `uses` readers each scale their use
/// of `x` by `k + 1` (reader `skip` not reaching the loss), the uses from [`fan_out`] or the
/// tensor itself. The upstream values are multiples of 1/64 and the scales small integers:
/// every sum is exact, in any order.
fn fanned(d: &Device, uses: usize, skip: usize, fanned: bool) -> (Vec<u32>, Option<u64>) {
    let d = d.clone().autodiff();
    let x = tensor(SHAPE, 3, &d).require_grad();
    let parts = match fanned {
        true => fan_out(x.clone(), uses),
        false => vec![x.clone(); uses],
    };
    let up: Vec<f32> =
        values(SHAPE.iter().product(), 9).iter().map(|v| (v * 64.0).round() / 64.0).collect();
    let up = Tensor::<4>::from_data(TensorData::new(up, SHAPE), &d);
    let loss = parts
        .into_iter()
        .enumerate()
        .filter(|(k, _)| *k != skip)
        .map(|(k, p)| p.mul_scalar((k + 1) as f32).mul(up.clone()).sum())
        .reduce(|a, b| a.add(b))
        .unwrap();
    let (grads, launches) = counted(&d, || loss.backward());
    (bits(x.grad(&grads).unwrap()), launches)
}

#[test]
fn a_fan_out_sums_its_uses_gradients_in_one_launch() {
    let _serial = serial();
    for (name, d) in devices() {
        for (uses, skip) in [(4, 9), (4, 1), (11, 3)] {
            let (ours, l1) = fanned(&d, uses, skip, true);
            let (want, l0) = fanned(&d, uses, skip, false);
            assert_eq!(ours, want, "{name}: {uses} uses, use {skip} unread: ∂x");
            if fan_out_available(&d, burn::tensor::DType::F32) {
                // Burn adds the reached uses' gradients one at a time; here one launch per
                // eight of them.
                let reached = uses - usize::from(skip < uses);
                let sums = (reached - 1).div_ceil(7) as u64;
                let (l0, l1) = (l0.unwrap(), l1.unwrap());
                assert_eq!(l0 - l1, (reached - 1) as u64 - sums, "{name}: {uses} uses: launches");
            }
        }
    }
}

/// Parts of a 40-element vector picked at positions (the last one, a zero, picked many
/// times, as a wave's coefficients pick it), weighted and summed into a loss: the parts and
/// the vector's gradient, and the launches forward and backward.
fn picked(
    d: &Device,
    parts: &[Vec<usize>],
    skip: Option<usize>,
    by_pick: bool,
) -> (Vec<Vec<u32>>, Vec<u32>, Option<u64>) {
    let mut v = values(40, 77);
    v[39] = 0.0;
    let x = Tensor::<1>::from_data(TensorData::new(v, [40]), d).require_grad();
    let ((outs, grad), launches) = counted(d, || {
        let outs = match by_pick {
            true => pick(x.clone(), parts),
            false => parts
                .iter()
                .map(|p| {
                    let at: Vec<i64> = p.iter().map(|&i| i as i64).collect();
                    let at = Tensor::<1, Int>::from_data(TensorData::new(at, [p.len()]), d);
                    x.clone().select(0, at)
                })
                .collect(),
        };
        let loss = outs
            .iter()
            .enumerate()
            .filter(|(t, _)| Some(*t) != skip)
            .map(|(t, o)| {
                let n = o.dims()[0];
                let w = Tensor::<1>::from_data(TensorData::new(values(n, 90 + t as u64), [n]), d);
                o.clone().mul(w).sum()
            })
            .reduce(|a, b| a.add(b))
            .unwrap();
        let mut grads = loss.backward();
        let grad = x.grad_remove(&mut grads).unwrap();
        let outs: Vec<Vec<u32>> =
            outs.into_iter().map(|o| bits(o.reshape([1, 1, 1, -1]))).collect();
        (outs, bits(Tensor::from_inner(grad).reshape([1, 1, 1, 40])))
    });
    (outs, grad, launches)
}

#[test]
fn picked_parts_and_their_gradient_are_selects_bit_for_bit_in_one_launch_each_way() {
    let _serial = serial();
    // Eleven parts (two launches' worth), each position picked once but the zero's.
    let parts: Vec<Vec<usize>> = (0..11)
        .map(|t| (0..(3 + t % 4)).map(|i| if i % 3 == 2 { 39 } else { (t * 3 + i) % 39 }).collect())
        .collect();
    for (name, d) in devices() {
        let d = d.autodiff();
        for skip in [None, Some(4)] {
            let (outs, grad, launches) = picked(&d, &parts, skip, true);
            let (want, want_grad, selects) = picked(&d, &parts, skip, false);
            assert_eq!(outs, want, "{name} {skip:?}: the parts");
            // The zero's gradient is a sum of several in another order; every other
            // position has one term.
            assert_eq!(grad[..39], want_grad[..39], "{name} {skip:?}: the gradient");
            if pick_available(&d, burn::tensor::DType::F32) {
                let (launches, selects) = (launches.unwrap(), selects.unwrap());
                // Selects: one each forward, a zero fill and an add-in each backward, and
                // the reached parts' gradients added one by one onto the vector's. Picks: two
                // launches forward, two backward, and their two gradients added. The loss's
                // own launches are the same on both sides.
                let reached = 11 - u64::from(skip.is_some());
                let by_select = 11 + 2 * reached + (reached - 1);
                assert_eq!(selects - launches, by_select - 5, "{name} {skip:?}: launches");
            }
        }
    }
}

#[test]
#[should_panic(expected = "a position past 40")]
fn a_position_past_the_end_is_refused() {
    let d = devices().into_iter().next().unwrap().1;
    let x = Tensor::<1>::zeros([40], &d);
    let _ = pick(x, &[vec![3, 40]]);
}
