//! Held rounding: after a pass at x0 recorded on a tape, a quantizer returns
//! `x·mask + (out0 − x0·mask)` for any x of that size in a pass replaying the tape (the
//! straight-through surrogate, linear in x, clipped elements constant), on the recorded grid; a
//! pass without the tape quantizes as usual.

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use burn::tensor::{Device, Tensor};
use qdarts_ops::quant::{
    FakeQuantizer, Granularity, Hold, HoldTape, ObserverKind, QuantPass, QuantSpec, TensorRole,
};

fn vals(t: Tensor<1>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
}

#[test]
fn a_held_quantizer_is_linear_in_its_input_and_constant_where_it_clipped() {
    let d = Device::flex();
    let fixed = ObserverKind::Fixed { min: -1.0, max: 1.0 };
    let spec = QuantSpec::with(4, true, false, Granularity::PerTensor, fixed).unwrap();
    let q = FakeQuantizer::new(spec, "a", TensorRole::Act, 1, &d).unwrap();
    let x0 = Tensor::<1>::from_floats([0.10, -0.33, 0.52, 3.0], &d);
    let tape = HoldTape::default();
    let (out0, g0) = q.forward_in(x0.clone(), QuantPass::held(Hold::Record(&tape)));
    let out0 = vals(out0);
    // A move far below one step (1/7.5 here) keeps out0 + δ inside the range and out0 where
    // the value clipped.
    let delta = [1e-3f32, -2e-3, 5e-4, -1e-3];
    let x1 = x0.clone().add(Tensor::from_floats(delta, &d));
    let (out1, g1) = q.forward_in(x1.clone(), QuantPass::held(Hold::Replay(&tape)));
    let out1 = vals(out1);
    for i in 0..3 {
        assert!((out1[i] - (out0[i] + delta[i])).abs() < 1e-6, "{i}: {} vs {}", out1[i], out0[i]);
    }
    assert!((out1[3] - out0[3]).abs() < 1e-6, "a clipped value moved");
    assert_eq!(vals(g1.step), vals(g0.step));
    // Quantized as usual, the same small move changes nothing (no element crosses a rounding
    // boundary): what the central difference would divide by 2ε.
    assert_eq!(vals(q.forward(x1)), out0);
}

/// A 3×3 plane on a 4-bit grid (step 1/7.5), recorded at `x0`, replayed at `x0 + δ`: `δ` lifts
/// a value that was exactly 0 above 0, pushes one that was one step below 0, and splits two
/// ties, each by less than a step. Returns (values at w, values now, the replayed tensor
/// tracked from `x1`, its held grid, the grid of the same quantizer unheld, x1).
#[allow(clippy::type_complexity)]
fn held_plane()
-> (Vec<f32>, Vec<f32>, Tensor<4>, qdarts_ops::quant::Grid, qdarts_ops::quant::Grid, Tensor<4>) {
    held_plane_on(&Device::flex())
}

/// [`held_plane`] on `device`.
#[allow(clippy::type_complexity)]
fn held_plane_on(
    device: &Device,
) -> (Vec<f32>, Vec<f32>, Tensor<4>, qdarts_ops::quant::Grid, qdarts_ops::quant::Grid, Tensor<4>) {
    let d = device.clone().autodiff();
    let fixed = ObserverKind::Fixed { min: -1.0, max: 1.0 };
    let spec = QuantSpec::with(4, true, false, Granularity::PerTensor, fixed).unwrap();
    let q = FakeQuantizer::new(spec, "a", TensorRole::Act, 1, &d).unwrap();
    let x0: [f32; 9] = [0.02, 0.30, 0.30, -0.5, 0.14, 0.05, 0.9, 0.9, -0.03];
    let delta: [f32; 9] = [0.01, 0.0, 0.05, 0.0, -0.2, 0.0, 0.0, 0.01, 0.0];
    let x0t = Tensor::<1>::from_floats(x0, &d).reshape([1, 1, 3, 3]);
    let tape = HoldTape::default();
    let (out0, _) = q.forward_in(x0t.clone(), QuantPass::held(Hold::Record(&tape)));
    let at_w = vals(out0.reshape([-1]));
    let x1 = x0t.add(Tensor::<1>::from_floats(delta, &d).reshape([1, 1, 3, 3])).require_grad();
    let (out1, held) = q.forward_in(x1.clone(), QuantPass::held(Hold::Replay(&tape)));
    let (_, unheld) = q.forward_with_grid(x1.clone());
    let now = vals(out1.clone().reshape([-1]));
    (at_w, now, out1, held, unheld, x1)
}

/// For each output of a 3×3 / stride 1 / padding 1 max pool over a 3×3 plane: the index of the
/// first maximum of `v` in its window, in row-major order.
fn first_argmax(v: &[f32]) -> Vec<usize> {
    let mut out = Vec::new();
    for r in 0..3i32 {
        for c in 0..3i32 {
            let mut best: Option<usize> = None;
            for i in r - 1..=r + 1 {
                for j in c - 1..=c + 1 {
                    if !(0..3).contains(&i) || !(0..3).contains(&j) {
                        continue;
                    }
                    let k = (i * 3 + j) as usize;
                    if best.is_none_or(|b| v[k] > v[b]) {
                        best = Some(k);
                    }
                }
            }
            out.push(best.unwrap());
        }
    }
    out
}

#[test]
fn a_relu_after_a_held_quantizer_keeps_the_mask_it_had_at_w() {
    use qdarts_ops::quant::hold::relu_held;

    let (at_w, now, out1, held, unheld, _) = held_plane();
    // The plane is what the test means: exact zeros at w that are positive now, and a value
    // positive at w that is negative now.
    assert_eq!(at_w[0], 0.0);
    assert!(now[0] > 0.0 && at_w[4] > 0.0 && now[4] < 0.0, "{at_w:?} {now:?}");
    let got = vals(relu_held(out1.clone(), Some(&held)).reshape([-1]));
    let want: Vec<f32> =
        now.iter().zip(&at_w).map(|(v, w)| if *w > 0.0 { *v } else { 0.0 }).collect();
    assert_eq!(got, want);
    // On a grid that is not held (every other pass), a plain ReLU of the values now.
    let plain = vals(relu_held(out1, Some(&unheld)).reshape([-1]));
    assert_eq!(plain, now.iter().map(|v| v.max(0.0)).collect::<Vec<_>>());
}

#[test]
fn a_max_pool_after_a_held_quantizer_takes_the_element_it_took_at_w() {
    use burn::tensor::ops::MaxPoolOptions;
    use qdarts_ops::quant::hold::max_pool2d_held;

    // Every backend of the build: on the CubeCL ones the held pool is its own kernel.
    for (name, d) in qdarts_kernels::devices::compiled() {
        let (at_w, now, out1, held, unheld, x1) = held_plane_on(&d);
        let opts = || MaxPoolOptions::new([3, 3]).with_stride([1, 1]).with_padding([1, 1]);
        let picks = first_argmax(&at_w);
        // The ties at w are split the other way now: held and plain pools pick differently.
        assert_ne!(picks, first_argmax(&now), "{name}: the plane splits no tie");
        let pooled = max_pool2d_held(out1.clone(), Some(&held), opts());
        assert_eq!(
            vals(pooled.clone().reshape([-1])),
            picks.iter().map(|&k| now[k]).collect::<Vec<_>>()
        );
        // The gradient goes to the elements picked at w (the replayed quantizer passes it through
        // where it did not clip: every element here).
        let g = pooled.sum().backward();
        let grad = vals(x1.grad(&g).unwrap().reshape([-1]));
        let mut want = vec![0f32; 9];
        for &k in &picks {
            want[k] += 1.0;
        }
        assert_eq!(grad, want);
        let plain = max_pool2d_held(out1, Some(&unheld), opts());
        assert_eq!(
            vals(plain.reshape([-1])),
            first_argmax(&now).iter().map(|&k| now[k]).collect::<Vec<_>>()
        );
    }
}

#[test]
fn a_channel_slice_of_a_held_tensor_keeps_its_own_values_at_w() {
    use qdarts_ops::quant::hold::{narrow_channels, relu_held};

    let (_, _, out1, held, _, _) = held_plane();
    // Two channels: the plane and its negation (every mask flips).
    let both = Tensor::cat(vec![out1.clone(), out1.clone().neg()], 1);
    let at_w = held.held.clone().unwrap();
    let grid = qdarts_ops::quant::Grid {
        held: Some(Tensor::cat(vec![at_w.clone(), at_w.neg()], 0)),
        ..held
    };
    let whole = vals(relu_held(both.clone(), Some(&grid)).reshape([-1]));
    for ch in 0..2 {
        let part = narrow_channels(Some(&grid), [1, 2, 3, 3], ch, 1);
        let got = vals(relu_held(both.clone().narrow(1, ch, 1), part.as_ref()).reshape([-1]));
        assert_eq!(got, whole[ch * 9..(ch + 1) * 9], "channel {ch}");
    }
}

#[test]
fn a_per_channel_held_quantizer_keeps_each_channels_clipping() {
    let d = Device::flex();
    let axis0 = Granularity::PerChannel { axis: 0 };
    let ema = ObserverKind::MovingAverageMinMax { averaging_constant: 0.01 };
    let spec = QuantSpec::with(8, true, true, axis0, ema).unwrap();
    let q = FakeQuantizer::new(spec, "w", TensorRole::Act, 2, &d).unwrap();
    // The first tensor sets the ranges (±0.5 and ±1); the recorded one moves them by 1 %, so
    // 0.8 clips in the first channel (not on a per-tensor grid of ±1), 2.0 and 1.5 in the second.
    q.forward(Tensor::<2>::from_floats([[0.5, -0.5, 0.0, 0.1], [1.0, -1.0, 0.0, 0.1]], &d));
    let x0 = Tensor::<2>::from_floats([[0.1, -0.2, 0.8, 0.3], [2.0, -0.5, 0.25, 1.5]], &d);
    let tape = HoldTape::default();
    let out0 = vals(q.forward_in(x0.clone(), QuantPass::held(Hold::Record(&tape))).0.reshape([8]));
    let delta = [1e-4f32, -2e-4, 3e-4, 1e-4, -1e-4, 2e-4, -3e-4, 1e-4];
    let x1 = x0.add(Tensor::<1>::from_floats(delta, &d).reshape([2, 4]));
    // Replayed twice: the second replay reads what the first derived.
    for _ in 0..2 {
        let out1 =
            vals(q.forward_in(x1.clone(), QuantPass::held(Hold::Replay(&tape))).0.reshape([8]));
        for i in 0..8 {
            let clipped = [2, 4, 7].contains(&i);
            let expected = if clipped { out0[i] } else { out0[i] + delta[i] };
            assert!((out1[i] - expected).abs() < 1e-6, "{i}: {} vs {expected}", out1[i]);
        }
    }
}

/// The hold is the pass's, not the module's: a recording made through one copy of a quantizer is
/// replayed through another (the second-order step's copies at `w` and `w±`), a pass without the
/// tape quantizes as usual on either, and another quantizer finds nothing of it on the tape.
#[test]
fn a_recording_belongs_to_the_quantizer_and_the_pass_not_to_a_copy() {
    let d = Device::flex();
    let fixed = ObserverKind::Fixed { min: -1.0, max: 1.0 };
    let spec = QuantSpec::with(4, true, false, Granularity::PerTensor, fixed).unwrap();
    let q = FakeQuantizer::new(spec, "a", TensorRole::Act, 1, &d).unwrap();
    let other = FakeQuantizer::new(spec, "a", TensorRole::Act, 1, &d).unwrap();
    let x0 = Tensor::<1>::from_floats([0.10, -0.33, 0.52, 3.0], &d);
    // 0.10 lies 0.033 above the boundary half a step (1/15) up: moved by −0.05 it rounds to 0
    // unheld, and keeps its rounding at w held.
    let x1 = x0.clone().add(Tensor::from_floats([-0.05f32, 0.0, 0.0, 0.0], &d));
    let tape = HoldTape::default();
    let out0 = vals(q.forward_in(x0, QuantPass::held(Hold::Record(&tape))).0);
    assert_eq!(tape.len(), 1);
    let copy = q.clone();
    let held = vals(copy.forward_in(x1.clone(), QuantPass::held(Hold::Replay(&tape))).0);
    assert!((held[0] - (out0[0] - 0.05)).abs() < 1e-6, "the copy replays: {held:?} {out0:?}");
    let unheld = vals(q.forward(x1.clone()));
    assert!((unheld[0] - held[0]).abs() > 0.01, "a pass without the tape rounds anew");
    assert_eq!(vals(other.forward_in(x1.clone(), QuantPass::held(Hold::Replay(&tape))).0), unheld);
    assert_eq!(vals(copy.forward(x1)), unheld, "replaying set nothing on the copy");
}
