//! ReLU: the kernels give the definition bit for bit (0 where `x ≤ 0`, so −0 → +0, else `x`:
//! NaN and subnormals stay; the gradient masked likewise), forward and backward, on every
//! compiled backend, for contiguous and strided inputs and upstream gradients, with the special
//! values (±0, NaN, ±∞, subnormals); on the CubeCL backends in one launch per direction. Where
//! Burn's own ReLU differs from the definition (a GPU driver's float rules) the tests say so.

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use burn::tensor::activation;
use burn::tensor::{Device, Tensor, TensorData};
use qdarts_kernels::devices::compiled as devices;
use qdarts_kernels::launches::counted;
use qdarts_kernels::relu::{relu, relu_available};

const SHAPE: [usize; 4] = [2, 3, 5, 7];

/// The launch counter sees every thread's launches: the tests of this file run one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Host-drawn values (xorshift, Box–Muller), with the special values in front.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    let mut uniform = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        ((s >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    let special = [0.0, -0.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e-40, -1e-40, 1.0, -1.0];
    (0..n)
        .map(|i| match special.get(i) {
            Some(&v) => v,
            None => {
                let (u, v) = (uniform(), uniform());
                ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
            }
        })
        .collect()
}

fn tensor(v: Vec<f32>, shape: [usize; 4], device: &Device) -> Tensor<4> {
    Tensor::from_data(TensorData::new(v, shape), device)
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

/// The inputs: contiguous, a channels-last view of a contiguous tensor, and a slice.
fn inputs(device: &Device) -> Vec<(&'static str, Tensor<4>)> {
    let n: usize = SHAPE.iter().product();
    let [a, b, c, d] = SHAPE;
    let plain = tensor(values(n, 7), SHAPE, device);
    let nhwc = tensor(values(n, 11), [a, c, d, b], device).permute([0, 3, 1, 2]);
    let wide = tensor(values(n * 2, 13), [a, b, c, d * 2], device).slice([0..a, 0..b, 0..c, 0..d]);
    vec![("contiguous", plain), ("channels-last", nhwc), ("slice", wide)]
}

/// The definition on the host: 0 where `v ≤ 0` (so −0 → +0), else `v` (NaN and subnormals
/// stay).
fn at_most_zero(v: f32) -> bool {
    v <= 0.0
}

/// Where Burn's ReLU on `backend` is not the definition: a note, not a failure (it is Burn's).
/// Mesa's CPU driver and flex follow it; NVIDIA's Vulkan driver flushes a subnormal input to 0
/// (and, for a plain float comparison, lets a NaN through as 0).
fn note_burn(backend: &str, case: &str, what: &str, burn: &[u32], def: &[u32]) {
    let off = burn.iter().zip(def).filter(|(a, b)| a != b).count();
    if off > 0 {
        eprintln!(
            "note: {backend}, {case}: Burn's ReLU {what} differs from the definition at {off} of \
             {} elements",
            def.len()
        );
    }
}

#[test]
fn the_forward_is_the_definition_bit_for_bit() {
    let _serial = serial();
    for (backend, d) in devices() {
        for (case, x) in inputs(&d) {
            let got = bits(relu(x.clone()));
            let burn = bits(activation::relu(x.clone()));
            if !relu_available(&d, x.dtype()) {
                // Burn's ReLU itself (LibTorch's keeps −0).
                assert_eq!(got, burn, "{backend}, {case}");
                continue;
            }
            let host = x.into_data().try_to_vec::<f32>().unwrap();
            let def: Vec<u32> =
                host.iter().map(|&v| if at_most_zero(v) { 0f32 } else { v }.to_bits()).collect();
            assert_eq!(got, def, "{backend}, {case}: the kernel against the definition");
            note_burn(backend, case, "forward", &burn, &def);
        }
    }
}

#[test]
fn the_gradient_is_the_definition_bit_for_bit_with_strided_upstream_gradients() {
    let _serial = serial();
    let n: usize = SHAPE.iter().product();
    for (backend, d) in devices() {
        let ad = d.clone().autodiff();
        for (case, x) in inputs(&ad) {
            // The upstream gradient `w`, reaching the ReLU contiguous, or transposed through
            // a permutation of its output.
            let w = tensor(values(n, 17), SHAPE, &ad);
            let [a, b, c, e] = SHAPE;
            let wt = tensor(values(n, 19), [a, e, c, b], &ad);
            type Relu = fn(Tensor<4>) -> Tensor<4>;
            let grads = |f: Relu| {
                let x = x.clone().detach().require_grad();
                let y = f(x.clone());
                let loss = y
                    .clone()
                    .mul(w.clone())
                    .sum()
                    .add(y.permute([0, 3, 2, 1]).mul(wt.clone()).sum());
                let g = loss.backward();
                bits(x.grad(&g).unwrap())
            };
            let got = grads(relu);
            let burn = grads(activation::relu);
            if !relu_available(&d, x.dtype()) {
                assert_eq!(got, burn, "{backend}, {case}");
                continue;
            }
            // The definition: the upstream gradient (summed on the device, through an
            // identity), +0 where the input is at most 0.
            let upstream = grads(|x| x);
            let host = x.into_data().try_to_vec::<f32>().unwrap();
            let def: Vec<u32> = upstream
                .iter()
                .zip(&host)
                .map(|(&g, &v)| if at_most_zero(v) { 0 } else { g })
                .collect();
            assert_eq!(got, def, "{backend}, {case}: the kernel against the definition");
            note_burn(backend, case, "gradient", &burn, &def);
        }
    }
}

#[test]
fn one_launch_each_way_on_the_cubecl_backends() {
    let _serial = serial();
    for (backend, d) in devices() {
        let ad = d.clone().autodiff();
        let x = tensor(values(SHAPE.iter().product(), 23), SHAPE, &ad);
        if !relu_available(&ad, x.dtype()) {
            assert_eq!(counted(&ad, || relu(x.clone())).1, None, "{backend}");
            continue;
        }
        let (_, forward) = counted(&ad, || relu(x.clone()));
        assert_eq!(forward, Some(1), "{backend}: forward");
        let step = |f: fn(Tensor<4>) -> Tensor<4>| {
            let x = x.clone().require_grad();
            let y = f(x.clone());
            let (_, n) = counted(&ad, || drop(y.backward()));
            n.unwrap()
        };
        // The backward of y alone: a ones gradient, then the ReLU's; Burn's ReLU adds a
        // comparison and a fill.
        let (ours, burns) = (step(relu), step(activation::relu));
        assert_eq!(ours + 1, burns, "{backend}: {ours} launches against Burn's {burns}");
    }
}
