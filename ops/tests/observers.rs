//! Observers against hand computations and the torch.ao / Paddle definitions they follow, the
//! eval-mode freeze, and the all-zero tensor for every observer.

use burn::module::Module;
use burn::tensor::{Device, Tensor, TensorData};
use qdarts_ops::quant::observer::ObserverState;
use qdarts_ops::quant::{
    ErrorTape, FakeQuantizer, Granularity, ObserverKind, QuantPass, QuantSpec, RoundMode,
    TensorRole,
};

fn dev() -> Device {
    Device::flex()
}

fn spec(
    observer: ObserverKind,
    signed: bool,
    symmetric: bool,
    granularity: Granularity,
) -> QuantSpec {
    QuantSpec::with(8, signed, symmetric, granularity, observer).expect("valid spec")
}

fn t1(v: &[f32]) -> Tensor<1> {
    Tensor::from_floats(v, &dev())
}

fn vals<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_to_vec::<f32>().expect("f32")
}

fn threshold(fq: &FakeQuantizer) -> f32 {
    vals(fq.observer.as_ref().and_then(ObserverState::threshold).expect("abs-max family"))[0]
}

#[test]
fn range_abs_max_keeps_the_max_of_the_last_window_batches() {
    // Paddle fake_quantize_range_abs_max, window 2: batch maxima 1, 3, 2, 0.5 give scales
    // 1, 3 (3 enters), 3 (window {3, 2}), 2 (window {2, 0.5}).
    let s = spec(ObserverKind::RangeAbsMax { window: 2 }, true, true, Granularity::PerTensor);
    let fq = FakeQuantizer::new(s, "x", TensorRole::Act, 1, &dev()).unwrap();
    let mut seen = vec![];
    for m in [1.0, -3.0, 2.0, 0.5] {
        fq.forward(t1(&[0.1, m, 0.0]));
        seen.push(threshold(&fq));
    }
    assert_eq!(seen, vec![1.0, 3.0, 3.0, 2.0]);
}

#[test]
fn eval_mode_freezes_the_observer() {
    let s =
        spec(ObserverKind::MovingAverageAbsMax { rate: 0.9 }, true, true, Granularity::PerTensor);
    let fq = FakeQuantizer::new(s, "x", TensorRole::Act, 1, &dev()).unwrap();
    fq.forward(t1(&[2.0, -1.0]));
    // Paddle: state 0.9·1 + 1 = 1.9, accum 0.9·1 + 2 = 2.9, scale 2.9/1.9.
    let trained = threshold(&fq);
    assert!((trained - 2.9 / 1.9).abs() < 1e-6);
    let frozen = fq.valid();
    let out = vals(frozen.forward(t1(&[100.0, 0.5])));
    assert_eq!(threshold(&frozen), trained, "valid() must not update the observer");
    // 100 clips to the stored threshold (127 steps of scale/127); 0.5 rounds on that grid.
    let step = trained / 127.0;
    assert!((out[0] - 127.0 * step).abs() < 1e-5, "{out:?}");
    assert!((out[1] - (0.5f32 * (127.0 / trained)).round() * step).abs() < 1e-6);
}

#[test]
fn min_max_affine_matches_torch_calculate_qparams() {
    // torch.ao MinMaxObserver(quint8, per_tensor_affine) on [-1, 0, 2]:
    // scale = (2 - (-1)) / 255, zero_point = 0 - round(-1 / scale) = 85.
    let s = spec(ObserverKind::MinMax, false, false, Granularity::PerTensor);
    let fq = FakeQuantizer::new(s, "x", TensorRole::Act, 1, &dev()).unwrap();
    fq.forward(t1(&[-1.0, 0.0, 2.0]));
    let g = fq.current_grid(&dev());
    assert!((vals(g.step)[0] - 3.0 / 255.0).abs() < 1e-9);
    assert_eq!(vals(g.zero_point)[0], 85.0);
    // Running min/max: a later tensor inside the range changes nothing.
    fq.forward(t1(&[0.5]));
    assert_eq!(vals(fq.current_grid(&dev()).zero_point)[0], 85.0);
}

#[test]
fn symmetric_min_max_uses_half_the_integer_span() {
    // torch: scale = max(|min|, |max|) / ((qmax - qmin) / 2) = 2 / 127.5 for qint8.
    let s = spec(ObserverKind::MinMax, true, true, Granularity::PerTensor);
    let fq = FakeQuantizer::new(s, "x", TensorRole::Weight, 1, &dev()).unwrap();
    fq.forward(t1(&[-2.0, 1.0]));
    let g = fq.current_grid(&dev());
    assert!((vals(g.step)[0] - 2.0 / 127.5).abs() < 1e-9);
    assert_eq!(vals(g.zero_point)[0], 0.0);
}

#[test]
fn moving_average_min_max_starts_from_the_first_tensor() {
    // torch MovingAverageMinMaxObserver(c = 0.5): first [-1, 1] sets the range, then
    // [-3, 3] moves it to -1 + 0.5·(-3 + 1) = -2 and 2.
    let s = spec(
        ObserverKind::MovingAverageMinMax { averaging_constant: 0.5 },
        true,
        true,
        Granularity::PerTensor,
    );
    let fq = FakeQuantizer::new(s, "x", TensorRole::Act, 1, &dev()).unwrap();
    fq.forward(t1(&[-1.0, 1.0]));
    fq.forward(t1(&[-3.0, 3.0]));
    let g = fq.current_grid(&dev());
    assert!((vals(g.step)[0] - 2.0 / 127.5).abs() < 1e-9);
}

#[test]
fn per_channel_min_max_keeps_one_scale_per_channel() {
    let s = spec(ObserverKind::MinMax, true, true, Granularity::PerChannel { axis: 0 });
    let fq = FakeQuantizer::new(s, "w", TensorRole::Weight, 2, &dev()).unwrap();
    let w = Tensor::<2>::from_data(TensorData::new(vec![1.0f32, -0.5, 0.25, -4.0], [2, 2]), &dev());
    fq.forward(w);
    let steps = vals(fq.current_grid(&dev()).step);
    assert!((steps[0] - 1.0 / 127.5).abs() < 1e-9);
    assert!((steps[1] - 4.0 / 127.5).abs() < 1e-9);
}

#[test]
fn per_channel_quantizer_rejects_another_channel_count() {
    let s = spec(ObserverKind::ChannelWiseAbsMax, true, true, Granularity::PerChannel { axis: 0 });
    let fq = FakeQuantizer::new(s, "w", TensorRole::Weight, 3, &dev()).unwrap();
    let err = fq.try_forward(Tensor::<2>::zeros([4, 2], &dev())).unwrap_err();
    assert!(err.to_string().contains("3 channels"), "{err}");
    let s = spec(ObserverKind::ChannelWiseAbsMax, true, true, Granularity::PerChannel { axis: 2 });
    let fq = FakeQuantizer::new(s, "w", TensorRole::Weight, 3, &dev()).unwrap();
    let err = fq.try_forward(Tensor::<2>::zeros([4, 2], &dev())).unwrap_err();
    assert!(err.to_string().contains("out of range"), "{err}");
}

#[test]
fn lsq_initialises_the_step_from_the_first_tensor() {
    // LSQ: s0 = 2·mean|x| / sqrt(Qp), Qp = 127 for int8: mean|x| = 1 here.
    let s = spec(ObserverKind::Lsq, true, true, Granularity::PerTensor);
    let fq = FakeQuantizer::new(s, "x", TensorRole::Act, 1, &dev().autodiff()).unwrap();
    fq.forward(Tensor::<1>::from_floats([1.0, -1.0, 2.0, 0.0], &dev().autodiff()));
    // The training step writes it into the parameter before its optimizer step.
    let fq = qdarts_ops::quant::lsq::apply_init(fq);
    let step = vals(fq.lsq.as_ref().unwrap().scale.val())[0];
    assert!((step - 2.0 / 127f32.sqrt()).abs() < 1e-6, "{step}");
}

fn every_observer() -> Vec<(ObserverKind, bool, Granularity)> {
    let pc = Granularity::PerChannel { axis: 1 };
    vec![
        (ObserverKind::AbsMax, true, Granularity::PerTensor),
        (ObserverKind::ChannelWiseAbsMax, true, pc),
        (ObserverKind::RangeAbsMax { window: 3 }, true, Granularity::PerTensor),
        (ObserverKind::MovingAverageAbsMax { rate: 0.9 }, true, Granularity::PerTensor),
        (ObserverKind::MinMax, true, Granularity::PerTensor),
        (ObserverKind::MinMax, false, pc),
        (
            ObserverKind::MovingAverageMinMax { averaging_constant: 0.01 },
            false,
            Granularity::PerTensor,
        ),
        (ObserverKind::Lsq, true, Granularity::PerTensor),
        (ObserverKind::Lsq, false, pc),
    ]
}

#[test]
fn all_zero_tensors_give_finite_scales_zero_output_and_finite_gradients() {
    let ad = dev().autodiff();
    for (obs, symmetric, gran) in every_observer() {
        let s = spec(obs, true, symmetric, gran);
        let fq = FakeQuantizer::new(s, "zero", TensorRole::Act, 3, &ad).unwrap();
        let tape = ErrorTape::default();
        let x = Tensor::<4>::zeros([2, 3, 4, 4], &ad).require_grad();
        let (out, _) = fq.forward_in(x.clone(), QuantPass::recording(Some(&tape)));
        let o = vals(out.clone());
        assert!(o.iter().all(|&v| v == 0.0), "{obs:?}: non-zero output {o:?}");
        let grads = out.sum().backward();
        let gx = vals(x.grad(&grads).expect("input gradient"));
        assert!(gx.iter().all(|v| v.is_finite()), "{obs:?}: gradient {gx:?}");
        if let Some(lsq) = &fq.lsq {
            let gs = vals(lsq.scale.val().grad(&grads).expect("step gradient"));
            assert!(gs.iter().all(|v| v.is_finite()), "{obs:?}: step gradient {gs:?}");
        }
        let g = fq.current_grid(&ad);
        for v in vals(g.step).into_iter().chain(vals(g.mult)) {
            assert!(v.is_finite() && v > 0.0, "{obs:?}: step or multiplier {v}");
        }
        // torch.ao gives an affine int8 all-zero tensor the zero point qmin (-128).
        assert!(vals(g.zero_point).iter().all(|v| v.is_finite()), "{obs:?}");
        let st = fq.last_stats(&tape).unwrap().expect("recorded");
        for v in [st.mse, st.sqnr_db, st.clip_frac, st.scale, st.zero_point] {
            assert!(v.is_finite(), "{obs:?}: stats {st:?}");
        }
        assert_eq!(st.mse, 0.0);
        assert_eq!(st.clip_frac, 0.0);
    }
}

#[test]
fn error_statistics_match_a_hand_computation() {
    // Abs-max 8 bit on [1, 0.3, -0.5, 0]: T = 1, step 1/127.
    // 0.3·127 = 38.1 -> 38, -0.5·127 = -63.5 -> -64 (ties to even).
    let s = spec(ObserverKind::AbsMax, true, true, Granularity::PerTensor);
    let fq = FakeQuantizer::new(s, "layer.act", TensorRole::Act, 1, &dev()).unwrap();
    let tape = ErrorTape::default();
    fq.forward_in(t1(&[1.0, 0.3, -0.5, 0.0]), QuantPass::recording(Some(&tape)));
    let st = fq.last_stats(&tape).unwrap().unwrap();
    let e1 = 0.3f64 - 38.0 / 127.0;
    let e2 = -0.5f64 + 64.0 / 127.0;
    let noise = e1 * e1 + e2 * e2;
    let signal = 1.0 + 0.09 + 0.25;
    assert!((st.mse - noise / 4.0).abs() < 1e-9, "{st:?}");
    assert!((st.sqnr_db - 10.0 * (signal / noise).log10()).abs() < 1e-3, "{st:?}");
    assert_eq!(st.clip_frac, 0.0);
    assert_eq!(st.layer, "layer.act");
    assert_eq!(st.bits, 8);
    assert!((st.scale - 1.0 / 127.0).abs() < 1e-9);

    // Frozen at T = 1, a value of 3 clips: one element of four.
    let frozen = fq.valid();
    let tape = ErrorTape::default();
    frozen.forward_in(t1(&[3.0, 0.5, 0.0, -0.25]), QuantPass::recording(Some(&tape)));
    assert_eq!(frozen.last_stats(&tape).unwrap().unwrap().clip_frac, 0.25);
}

#[test]
fn quantize_returns_integers_and_their_grid() {
    // Paddle fake_quantize_abs_max, 4 bits: bin_cnt 7, T = 2: x·7/2 = 3.5 -> 4 (even), -7, 1.75 -> 2.
    let s = QuantSpec::symmetric(4, ObserverKind::AbsMax).unwrap();
    let fq = FakeQuantizer::new(s, "w", TensorRole::Weight, 1, &dev()).unwrap();
    let q = fq.quantize(t1(&[1.0, -2.0, 0.5])).unwrap();
    let ints: Vec<i64> = q.values.into_data().convert::<i64>().try_to_vec::<i64>().unwrap();
    assert_eq!(ints, vec![4, -7, 2]);
    assert!((vals(q.scale)[0] - 2.0 / 7.0).abs() < 1e-7);
    let away = s.with_round(RoundMode::TiesAwayFromZero);
    let fq = FakeQuantizer::new(away, "w", TensorRole::Weight, 1, &dev()).unwrap();
    let q = fq.quantize(t1(&[1.0, -2.0, -1.0])).unwrap();
    let ints: Vec<i64> = q.values.into_data().convert::<i64>().try_to_vec::<i64>().unwrap();
    assert_eq!(ints, vec![4, -7, -4]);
}
