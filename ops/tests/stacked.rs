//! A stacked quantizer (`FakeQuantizer::stacked`, the rows of a batched cell's wave) against
//! the per-site quantizers it stands for: the same values bit for bit, the same gradient, the
//! same observer state step after step, each row's state written back, and each site's error
//! row; on every backend compiled in.

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use burn::module::Module;
use burn::tensor::{Device, Distribution, Tensor};
use qdarts_ops::quant::{
    ErrorTape, FakeQuantizer, Granularity, ObserverKind, QuantPass, QuantSpec, RoundMode,
    SpecError, TensorRole,
};

mod common;
use common::devices;

fn floats<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_to_vec::<f32>().expect("f32")
}

/// Every observer a per-tensor activation spec can have, signed and not.
fn act_specs() -> Vec<QuantSpec> {
    let ema = ObserverKind::MovingAverageMinMax { averaging_constant: 0.01 };
    let t = Granularity::PerTensor;
    let spec = |signed, symmetric, obs| QuantSpec::with(8, signed, symmetric, t, obs).unwrap();
    vec![
        spec(true, true, ema),
        spec(false, false, ema),
        spec(true, false, ObserverKind::MinMax),
        spec(true, true, ObserverKind::MovingAverageAbsMax { rate: 0.9 }),
        spec(true, true, ObserverKind::RangeAbsMax { window: 2 }),
        spec(true, true, ObserverKind::AbsMax),
        QuantSpec::unit_interval(8).unwrap(),
        spec(true, true, ema).with_round(RoundMode::TiesAwayFromZero),
    ]
}

/// `sites` quantizers of `spec` over `channels` channels each, and their stacked form.
fn quantizers(
    spec: QuantSpec,
    role: TensorRole,
    sites: usize,
    channels: usize,
    device: &Device,
) -> (Vec<FakeQuantizer>, FakeQuantizer) {
    let qs: Vec<FakeQuantizer> = (0..sites)
        .map(|r| FakeQuantizer::new(spec, format!("edges.{r}.act"), role, channels, device))
        .collect::<Result<_, _>>()
        .unwrap();
    let refs: Vec<&FakeQuantizer> = qs.iter().collect();
    let stacked = FakeQuantizer::stacked(&refs, "wave.act").unwrap();
    (qs, stacked)
}

#[test]
fn stacked_activation_quantizers_are_the_sites_bit_for_bit_step_after_step() {
    let (n, r, c, h, w) = (2, 3, 4, 3, 3);
    for (name, device) in devices() {
        let ad = device.clone().autodiff();
        for spec in act_specs() {
            let (qs, stacked) = quantizers(spec, TensorRole::Act, r, 1, &ad);
            for step in 0..3 {
                let tape = ErrorTape::default();
                let rec = QuantPass::recording(Some(&tape));
                let x: Tensor<4> =
                    Tensor::random([n, r * c, h, w], Distribution::Normal(0.3, 2.0), &ad)
                        .mul_scalar(1.0 + step as f32)
                        .detach()
                        .require_grad();
                // Each site on its own slice.
                let parts: Vec<Tensor<4>> = (0..r)
                    .map(|i| qs[i].forward_in(x.clone().narrow(1, i * c, c), rec).0)
                    .collect();
                let each = Tensor::cat(parts, 1);
                // The rows: `[N, R, C·H·W]`, one channel per site.
                let rows = x.clone().reshape([n, r, c * h * w]);
                let y = stacked.forward_in(rows, rec).0.reshape([n, r * c, h, w]);
                assert_eq!(floats(y.clone()), floats(each.clone()), "{name} {spec:?} step {step}");
                // The straight-through gradient, weighted so that every value counts.
                let weights = Tensor::random([n, r * c, h, w], Distribution::Default, &ad).detach();
                let g_each = each.mul(weights.clone()).sum().backward();
                let g_rows = y.mul(weights).sum().backward();
                let (a, b) = (x.grad(&g_each).unwrap(), x.grad(&g_rows).unwrap());
                assert_eq!(floats(a), floats(b), "{name} {spec:?} step {step}: gradient");
                // Each row's error statistics are its site's.
                let rows = stacked.error_rows(&tape).unwrap();
                assert_eq!(rows.len(), r);
                for (i, row) in rows.iter().enumerate() {
                    let own = qs[i].last_stats(&tape).unwrap().expect("recorded");
                    assert_eq!(row.layer, own.layer);
                    assert_eq!((row.scale, row.zero_point), (own.scale, own.zero_point));
                    assert_eq!(row.clip_frac, own.clip_frac, "{name} {spec:?}");
                    let close = |a: f64, b: f64| (a - b).abs() <= 1e-5 * a.abs().max(b.abs());
                    assert!(close(row.mse, own.mse), "{name} {spec:?}: {row:?} {own:?}");
                    assert!(close(row.sqnr_db, own.sqnr_db), "{name} {spec:?}: {row:?} {own:?}");
                }
            }
            // Each row's state into a fresh site: it then quantizes as the site that ran.
            let probe: Tensor<4> =
                Tensor::random([n, c, h, w], Distribution::Normal(0.0, 3.0), &device);
            for (i, q) in qs.iter().enumerate() {
                let fresh =
                    FakeQuantizer::new(spec, "fresh", TensorRole::Act, 1, &device).unwrap().valid();
                stacked.valid().row_into(i, &fresh);
                let want = q.valid().forward(probe.clone());
                assert_eq!(floats(fresh.forward(probe.clone())), floats(want), "{name} {spec:?}");
            }
        }
    }
}

#[test]
fn stacked_weight_quantizers_are_each_edge_per_channel() {
    let (r, c, k) = (3, 4, 3);
    let spec = QuantSpec::with(
        8,
        true,
        true,
        Granularity::PerChannel { axis: 0 },
        ObserverKind::ChannelWiseAbsMax,
    )
    .unwrap();
    for (name, device) in devices() {
        let ad = device.clone().autodiff();
        let (qs, stacked) = quantizers(spec, TensorRole::Weight, r, c, &ad);
        let stacked = stacked.with_row_numel(1, 7);
        let tape = ErrorTape::default();
        let rec = QuantPass::recording(Some(&tape));
        let w: Tensor<4> = Tensor::random([r * c, 1, k, k], Distribution::Normal(0.0, 0.5), &ad)
            .detach()
            .require_grad();
        let parts: Vec<Tensor<4>> =
            (0..r).map(|i| qs[i].forward_in(w.clone().narrow(0, i * c, c), rec).0).collect();
        let each = Tensor::cat(parts, 0);
        let y = stacked.forward_in(w.clone(), rec).0;
        assert_eq!(floats(y.clone()), floats(each.clone()), "{name}");
        let (a, b) = (each.sum().backward(), y.sum().backward());
        assert_eq!(floats(w.grad(&a).unwrap()), floats(w.grad(&b).unwrap()), "{name}");
        let rows = stacked.error_rows(&tape).unwrap();
        let own = qs[1].last_stats(&tape).unwrap().unwrap();
        // Row 1 counts 7 values instead of its run's 36: its mean error is over them.
        let expected = own.mse * (c * k * k) as f64 / 7.0;
        assert!((rows[1].mse - expected).abs() <= 1e-5 * expected, "{name}: {rows:?}");
        assert_eq!(rows[1].scale, own.scale);
    }
}

#[test]
fn lsq_and_mixed_specs_do_not_stack() {
    let device = Device::flex();
    let lsq = QuantSpec::with(8, true, true, Granularity::PerTensor, ObserverKind::Lsq).unwrap();
    let qs: Vec<FakeQuantizer> = (0..2)
        .map(|_| FakeQuantizer::new(lsq, "a", TensorRole::Act, 1, &device).unwrap())
        .collect();
    let refs: Vec<&FakeQuantizer> = qs.iter().collect();
    let err = FakeQuantizer::stacked(&refs, "wave.act").unwrap_err();
    assert!(matches!(err, SpecError::Stacked(ref m) if m.contains("LSQ")), "{err}");
    let other = QuantSpec::unit_interval(8).unwrap();
    let a = FakeQuantizer::new(other, "a", TensorRole::Act, 1, &device).unwrap();
    let b = FakeQuantizer::new(act_specs()[0], "b", TensorRole::Act, 1, &device).unwrap();
    let err = FakeQuantizer::stacked(&[&a, &b], "wave.act").unwrap_err();
    assert!(err.to_string().contains("differ"), "{err}");
    assert!(FakeQuantizer::stacked(&[], "wave.act").is_err());
}
