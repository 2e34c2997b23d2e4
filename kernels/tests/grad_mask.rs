//! The masked gradient: its value is the input's and its gradient the product's (`x ⊙ mask`,
//! for an `x` that is zero where the mask is) bit for bit, on every compiled backend; on the
//! CubeCL backends the forward launches nothing.

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use burn::tensor::{Device, Tensor, TensorData};
use qdarts_kernels::devices::compiled as devices;
use qdarts_kernels::grad_mask::masked_gradient;
use qdarts_kernels::launches::counted;

const SHAPE: [usize; 4] = [6, 1, 5, 5];

/// A 5×5 filter bank whose outer ring is zero in the first three filters (3×3 kernels padded
/// to 5×5), and the mask of those rings; other values drawn on the host (xorshift).
fn filters_and_mask(device: &Device) -> (Tensor<4>, Tensor<4>) {
    let mut s = 0x9e37_79b9_u64;
    let mut draw = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    let (mut w, mut m) = (Vec::new(), Vec::new());
    for f in 0..SHAPE[0] {
        for t in 0..25 {
            let (i, j) = (t / 5, t % 5);
            let inside = f >= 3 || ((1..4).contains(&i) && (1..4).contains(&j));
            let v = draw();
            w.push(if inside { v } else { 0.0 });
            m.push(if inside { 1.0 } else { 0.0 });
        }
    }
    let t = |v: Vec<f32>| Tensor::from_data(TensorData::new(v, SHAPE), device);
    (t(w), t(m))
}

fn bits(t: Tensor<4>) -> Vec<u32> {
    let data = t.into_data().convert::<f32>();
    data.try_to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect()
}

/// The value and the filters' gradient under `loss = Σ conv-free (y ⊙ up)`, `y = form(w, m)`.
fn run(device: &Device, form: fn(Tensor<4>, Tensor<4>) -> Tensor<4>) -> (Vec<u32>, Vec<u32>) {
    let (w, m) = filters_and_mask(device);
    let w = w.require_grad();
    let y = form(w.clone(), m);
    let up = filters_and_mask(device).0.add_scalar(0.25).mul_scalar(-3.0);
    let grads = y.clone().mul(up).sum().backward();
    (bits(y), bits(w.grad(&grads).unwrap()))
}

#[test]
fn value_and_gradient_are_the_products_bit_for_bit() {
    for (backend, d) in devices() {
        let d = d.autodiff();
        let ours = run(&d, masked_gradient);
        let product = run(&d, |w, m| w.mul(m));
        assert_eq!(ours.0, product.0, "{backend}: values");
        assert_eq!(ours.1, product.1, "{backend}: gradients");
        let zeros = ours.1.iter().filter(|&&b| f32::from_bits(b) == 0.0).count();
        assert_eq!(zeros, 3 * 16, "{backend}: the rings' gradient is zero");
    }
}

#[test]
fn the_forward_launches_nothing_on_the_cubecl_backends() {
    for (backend, d) in devices() {
        let (w, m) = filters_and_mask(&d.clone().autodiff());
        let w = w.require_grad();
        match counted(&d, || masked_gradient(w.clone(), m.clone())).1 {
            Some(n) => assert_eq!(n, 0, "{backend}: {n} launches"),
            None => eprintln!("{backend}: launches not counted"),
        }
    }
}
