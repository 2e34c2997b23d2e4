//! Held rounding: after recording at x0, a quantizer returns `x·mask + (out0 − x0·mask)` for
//! any x of that size (the straight-through surrogate, linear in x, clipped elements constant),
//! on the recorded grid; `Off` forgets the recording.

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use burn::tensor::{Device, Tensor};
use qdarts_ops::quant::{
    FakeQuantizer, Granularity, HoldMode, ObserverKind, QuantSpec, TensorRole,
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
    q.set_hold(HoldMode::Record);
    let (out0, g0) = q.forward_with_grid(x0.clone());
    let out0 = vals(out0);
    // A move far below one step (1/7.5 here) keeps out0 + δ inside the range and out0 where
    // the value clipped.
    let delta = [1e-3f32, -2e-3, 5e-4, -1e-3];
    let x1 = x0.clone().add(Tensor::from_floats(delta, &d));
    q.set_hold(HoldMode::Replay);
    let (out1, g1) = q.forward_with_grid(x1.clone());
    let out1 = vals(out1);
    for i in 0..3 {
        assert!((out1[i] - (out0[i] + delta[i])).abs() < 1e-6, "{i}: {} vs {}", out1[i], out0[i]);
    }
    assert!((out1[3] - out0[3]).abs() < 1e-6, "a clipped value moved");
    assert_eq!(vals(g1.step), vals(g0.step));
    // Quantized as usual, the same small move changes nothing (no element crosses a rounding
    // boundary): what the central difference would divide by 2ε.
    q.set_hold(HoldMode::Off);
    assert_eq!(vals(q.forward(x1)), out0);
}
