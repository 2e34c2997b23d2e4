//! The concatenation: its values are `Tensor::cat`'s bit for bit, and so is every part's
//! gradient, on every compiled backend, along every dimension, with strided parts, parts the
//! loss reaches through the output only, a part given twice, and more parts than one launch
//! takes; on the CubeCL backends one launch per eight parts where Burn's takes one per part.

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use burn::tensor::{Device, Tensor, TensorData};
use qdarts_kernels::cat::{ARITY, cat};
use qdarts_kernels::devices::compiled as devices;
use qdarts_kernels::launches::counted;

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
    let data = t.into_data().convert::<f32>();
    data.try_to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect()
}

/// `count` parts to lay side by side along `dim` of `[3, 4, 5, 2]` (part `i` is `i % 3 + 1`
/// long there), every third one a strided view (a transpose back and forth, or a narrow), the
/// last one the first again when `twice`.
fn parts(dim: usize, count: usize, twice: bool, device: &Device, track: bool) -> Vec<Tensor<4>> {
    let leaf = |t: Tensor<4>| if track { t.require_grad() } else { t };
    let mut out: Vec<Tensor<4>> = (0..count)
        .map(|i| {
            let mut shape = [3, 4, 5, 2];
            shape[dim] = i % 3 + 1;
            match i % 3 {
                0 => {
                    // Laid out transposed: strided in the last two dimensions.
                    let [a, b, c, d] = shape;
                    leaf(tensor([a, b, d, c], 10 + i as u64, device)).swap_dims(2, 3)
                }
                1 => {
                    let mut wide = shape;
                    wide[(dim + 1) % 4] += 2;
                    leaf(tensor(wide, 30 + i as u64, device)).narrow(
                        (dim + 1) % 4,
                        1,
                        shape[(dim + 1) % 4],
                    )
                }
                _ => leaf(tensor(shape, 50 + i as u64, device)),
            }
        })
        .collect();
    if twice {
        out.push(out[0].clone());
    }
    out
}

/// The output's bits and each part's gradient under the loss `Σ cat ⊙ up`, joined by `join`.
fn run(
    device: &Device,
    dim: usize,
    count: usize,
    twice: bool,
    track: bool,
    join: impl Fn(Vec<Tensor<4>>) -> Tensor<4>,
) -> (Vec<u32>, Vec<Vec<u32>>) {
    let parts = parts(dim, count, twice, device, track);
    let out = join(parts.clone());
    if !track {
        return (bits(out), Vec::new());
    }
    let up = tensor(out.dims(), 99, device);
    let grads = out.clone().mul(up).sum().backward();
    let grads = parts.iter().map(|p| p.grad(&grads).map(bits).unwrap_or_default()).collect();
    (bits(out), grads)
}

#[test]
fn values_and_gradients_are_burns_cat_bit_for_bit() {
    let _serial = serial();
    for (backend, d) in devices() {
        for (device, track) in [(d.clone(), false), (d.autodiff(), true)] {
            for dim in 0..4 {
                for (count, twice) in [
                    (2, false),
                    (3, true),
                    (ARITY, false),
                    (ARITY + 1, false),
                    (2 * ARITY + 3, true),
                ] {
                    let ours = run(&device, dim, count, twice, track, |p| cat(p, dim));
                    let burns = run(&device, dim, count, twice, track, |p| Tensor::cat(p, dim));
                    assert_eq!(ours.0, burns.0, "{backend} dim {dim}, {count} parts: values");
                    assert_eq!(ours.1, burns.1, "{backend} dim {dim}, {count} parts: gradients");
                }
            }
        }
    }
}

#[test]
fn empty_parts_are_left_out() {
    let _serial = serial();
    for (backend, d) in devices() {
        let a = tensor([2, 3, 1, 1], 1, &d);
        let none = tensor([2, 0, 1, 1], 2, &d);
        let b = tensor([2, 2, 1, 1], 3, &d);
        let ours = cat(vec![a.clone(), none.clone(), b.clone()], 1);
        assert_eq!(bits(ours), bits(Tensor::cat(vec![a, none, b], 1)), "{backend}");
    }
}

#[test]
fn one_launch_per_eight_parts_on_the_cubecl_backends() {
    let _serial = serial();
    for (backend, d) in devices() {
        // Nine parts: one launch for the first eight, one for those and the ninth.
        for (count, want) in [(2, 1), (ARITY, 1), (ARITY + 1, 2)] {
            let p = parts(1, count, false, &d, false);
            let ours = counted(&d, || cat(p.clone(), 1)).1;
            let burns = counted(&d, || Tensor::cat(p.clone(), 1)).1;
            match (ours, burns) {
                (Some(ours), Some(burns)) => {
                    eprintln!("{backend}: {count} parts, {ours} launches, Burn's cat {burns}");
                    assert_eq!(ours, want, "{backend}: {count} parts");
                    assert!(ours < burns, "{backend}: {ours} launches against Burn's {burns}");
                }
                (None, None) => {}
                other => panic!("{backend}: launches counted for one form only: {other:?}"),
            }
        }
    }
}
