//! The mix: coefficients times blocks of columns side by side are Burn's concatenation and
//! matmul within float rounding (the sums run in another order), and so are the gradients of
//! the coefficients and of every block, on every compiled backend, with strided blocks, a
//! block the loss also reaches on its own, an untracked block, and more blocks than one launch
//! takes; on the CubeCL backends one launch forward and two backward.

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use burn::tensor::{Device, Tensor, TensorData};
use qdarts_kernels::cat::ARITY;
use qdarts_kernels::devices::compiled as devices;
use qdarts_kernels::launches::counted;
use qdarts_kernels::mix::mix;

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

fn tensor(shape: [usize; 3], seed: u64, device: &Device) -> Tensor<3> {
    let n = shape.iter().product();
    Tensor::from_data(TensorData::new(values(n, seed), shape), device)
}

fn floats(t: Tensor<3>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
}

const N: usize = 3;
const L: usize = 20;
const ROWS: usize = 4;

/// `count` blocks `[N, c, L]` (block `i` has `i % 3 + 1` columns) and the leaves they are
/// views of: every third laid out transposed, every third a narrow of a wider tensor (both read
/// through their strides); the second leaf untracked.
fn blocks(count: usize, device: &Device, track: bool) -> (Vec<Tensor<3>>, Vec<Tensor<3>>) {
    (0..count)
        .map(|i| {
            let c = i % 3 + 1;
            let seed = 10 + i as u64;
            let leaf = match i % 3 {
                0 => tensor([N, L, c], seed, device),
                1 => tensor([N, c + 3, L], seed, device),
                _ => tensor([N, c, L], seed, device),
            };
            let leaf = if track && i != 1 { leaf.require_grad() } else { leaf };
            let block = match i % 3 {
                0 => leaf.clone().swap_dims(1, 2),
                1 => leaf.clone().narrow(1, 2, c),
                _ => leaf.clone(),
            };
            (block, leaf)
        })
        .unzip()
}

/// The output and the gradients of the coefficients and of each block's leaf (empty:
/// untracked) under the loss `Σ out ⊙ up + Σ x_0 ⊙ u_0` (the first block also reached on its
/// own).
fn run(
    device: &Device,
    count: usize,
    track: bool,
    join: impl Fn(Tensor<3>, Vec<Tensor<3>>) -> Tensor<3>,
) -> (Vec<f32>, Vec<Vec<f32>>) {
    let (blocks, leaves) = blocks(count, device, track);
    let columns = blocks.iter().map(|b| b.dims()[1]).sum();
    let w = tensor([1, ROWS, columns], 7, device);
    let w = if track { w.require_grad() } else { w };
    let out = join(w.clone(), blocks.clone());
    if !track {
        return (floats(out), Vec::new());
    }
    let up = tensor(out.dims(), 99, device);
    let own = tensor(blocks[0].dims(), 98, device);
    let loss = out.clone().mul(up).sum() + blocks[0].clone().mul(own).sum();
    let grads = loss.backward();
    let leaves = std::iter::once(&w).chain(&leaves);
    let grads = leaves.map(|t| t.grad(&grads).map(floats).unwrap_or_default()).collect();
    (floats(out), grads)
}

/// `ours` within float rounding of `burns`: each value within 1e-5 (every value here is a sum
/// of at most 60 products of numbers below 1).
fn close(ours: &[f32], burns: &[f32], what: &str) {
    assert_eq!(ours.len(), burns.len(), "{what}: lengths");
    for (i, (a, b)) in ours.iter().zip(burns).enumerate() {
        assert!((a - b).abs() <= 1e-5, "{what}: element {i}: {a} against {b}");
    }
}

fn burns(w: Tensor<3>, blocks: Vec<Tensor<3>>) -> Tensor<3> {
    w.matmul(Tensor::cat(blocks, 1))
}

#[test]
fn values_and_gradients_are_burns_product_within_rounding() {
    let _serial = serial();
    for (backend, d) in devices() {
        for (device, track) in [(d.clone(), false), (d.autodiff(), true)] {
            for count in [1, 3, ARITY, ARITY + 2] {
                let what = format!("{backend}, {count} blocks");
                let ours = run(&device, count, track, mix);
                let burns = run(&device, count, track, burns);
                close(&ours.0, &burns.0, &format!("{what}: values"));
                assert_eq!(ours.1.len(), burns.1.len(), "{what}: gradients");
                for (i, (a, b)) in ours.1.iter().zip(&burns.1).enumerate() {
                    // Slot 0 the coefficients, then the blocks; the second block is untracked.
                    let tracked = track && i != 2;
                    assert_eq!(a.is_empty(), !tracked, "{what}: gradient {i} present");
                    close(a, b, &format!("{what}: gradient {i}"));
                }
            }
        }
    }
}

#[test]
fn one_launch_forward_and_two_backward_on_the_cubecl_backends() {
    let _serial = serial();
    for (backend, d) in devices() {
        let device = d.clone().autodiff();
        // Leaves themselves: a view's own backward (a narrow's fill and write) is not the mix's.
        let leaves = || -> Vec<Tensor<3>> {
            let shape = |i: usize| [N, i % 3 + 1, L];
            (0..ARITY).map(|i| tensor(shape(i), 10 + i as u64, &device).require_grad()).collect()
        };
        let blocks = leaves();
        let columns = blocks.iter().map(|b| b.dims()[1]).sum();
        let w = tensor([1, ROWS, columns], 7, &device).require_grad();
        let up = tensor([N, ROWS, L], 99, &device);
        // The loss's own backward launches, on a leaf in the output's place.
        let leaf = tensor([N, ROWS, L], 5, &device).require_grad();
        let (_, loss) = counted(&d, || leaf.mul(up.clone()).sum().backward());
        let (out, forward) = counted(&d, || mix(w.clone(), blocks.clone()));
        let (_, ours) = counted(&d, || out.mul(up.clone()).sum().backward());
        let out = burns(w.clone(), leaves());
        let (_, theirs) = counted(&d, || out.mul(up.clone()).sum().backward());
        match (loss, forward, ours, theirs) {
            (Some(loss), Some(forward), Some(ours), Some(theirs)) => {
                let (ours, theirs) = (ours - loss, theirs - loss);
                eprintln!(
                    "{backend}: forward {forward}, backward {ours}; Burn's backward {theirs}"
                );
                assert_eq!(forward, 1, "{backend}: the forward's launches");
                assert_eq!(ours, 2, "{backend}: the backward's launches");
            }
            (None, None, None, None) => {}
            other => panic!("{backend}: launches counted for some forms only: {other:?}"),
        }
    }
}
