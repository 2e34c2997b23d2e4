//! Quantized add, concat and the integer softmax.

// Test helpers panic on impossible conversions; a panic is the failure report here.
#![allow(clippy::unwrap_used)]

use burn::tensor::{Device, Distribution, Tensor, TensorData};
use qdarts_ops::arith::{QAdd, QConcat, int_softmax, quantized_softmax};
use qdarts_ops::candidates::{Ctx, QTensor, QuantSites};
use qdarts_ops::qconfig::QuantConfig;
use qdarts_ops::quant::{ErrorTape, QuantPass, QuantSpec};

fn dev() -> Device {
    Device::flex()
}

fn vals<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
}

/// Activations on the fixed range [-1.27, 1.28] with 8-bit unsigned affine: step 0.01, zp 127.
fn cfg_fixed_act() -> QuantConfig {
    let act: QuantSpec = toml::from_str(
        "bits = 8\nsigned = false\nsymmetric = false\nobserver = { kind = \"fixed\", min = -1.27, max = 1.28 }",
    )
    .unwrap();
    QuantConfig { act: Some(act), ..QuantConfig::default() }
}

fn q1(v: &[f32]) -> QTensor {
    QTensor::float(Tensor::<4>::from_data(TensorData::new(v.to_vec(), [1, 1, 1, v.len()]), &dev()))
}

#[test]
fn add_rounds_each_operand_onto_the_output_grid_before_adding() {
    let cfg = cfg_fixed_act();
    let add = QAdd::new(&Ctx::new(&cfg, "add", "n2.add", &dev())).unwrap();
    // On a 0.01 grid: 0.004 + 0.004 -> 0 + 0 = 0 (an integer add of rescaled operands), where
    // quantizing the float sum 0.008 would give 0.01. 0.006 + 0.006 -> 0.01 + 0.01 = 0.02.
    // 1.0 + 1.0 saturates at the top of the range, 128 steps above the zero point: 1.28.
    let out = add.forward(vec![q1(&[0.004, 0.006, 1.0]), q1(&[0.004, 0.006, 1.0])]);
    let v = vals(out.value);
    assert!(v[0].abs() < 1e-7, "{v:?}");
    assert!((v[1] - 0.02).abs() < 1e-6, "{v:?}");
    assert!((v[2] - 1.28).abs() < 1e-6, "{v:?}");
}

#[test]
fn add_passes_the_gradient_to_every_operand_where_the_sum_is_in_range() {
    let cfg = cfg_fixed_act();
    let ad = dev().autodiff();
    let add = QAdd::new(&Ctx::new(&cfg, "add", "add", &ad)).unwrap();
    let a = Tensor::<4>::from_data(TensorData::new(vec![0.5f32, 1.0], [1, 1, 1, 2]), &ad)
        .require_grad();
    let b = Tensor::<4>::from_data(TensorData::new(vec![0.1f32, 1.0], [1, 1, 1, 2]), &ad)
        .require_grad();
    let out = add.forward(vec![QTensor::float(a.clone()), QTensor::float(b.clone())]).value;
    let grads = out.sum().backward();
    assert_eq!(vals(a.grad(&grads).unwrap()), vec![1.0, 0.0]);
    assert_eq!(vals(b.grad(&grads).unwrap()), vec![1.0, 0.0]);
}

#[test]
fn concat_puts_every_operand_on_one_grid() {
    let cfg = cfg_fixed_act();
    let cat = QConcat::new(&Ctx::new(&cfg, "cat", "cat", &dev())).unwrap();
    let tape = ErrorTape::default();
    let out = cat.forward_in(vec![q1(&[0.123]), q1(&[-0.456])], QuantPass::recording(Some(&tape)));
    assert_eq!(out.dims(), [1, 2, 1, 1]);
    let v = vals(out.value);
    assert!((v[0] - 0.12).abs() < 1e-6 && (v[1] + 0.46).abs() < 1e-6, "{v:?}");
    assert_eq!(cat.quant_stats(&tape).unwrap().len(), 1);
}

#[test]
fn integer_softmax_matches_a_hand_computed_case() {
    // Equal inputs give equal shares: 255/4 = 63.75 -> 64 each (rounded half up).
    assert_eq!(int_softmax(&[5, 5, 5, 5], 0.05, 255), vec![64, 64, 64, 64]);
    // A dominant input takes (almost) everything: exp(-10)·255 ≈ 0.0116 rounds to 0.
    assert_eq!(int_softmax(&[0, -200], 0.05, 255), vec![255, 0]);
}

fn error_stats(a: &[f32], b: &[f32]) -> (f64, f64, f64) {
    let errs: Vec<f64> = a.iter().zip(b).map(|(x, y)| (*x as f64 - *y as f64).abs()).collect();
    let mean = errs.iter().sum::<f64>() / errs.len() as f64;
    let rmse = (errs.iter().map(|e| e * e).sum::<f64>() / errs.len() as f64).sqrt();
    (mean, rmse, errs.iter().cloned().fold(0.0, f64::max))
}

#[test]
fn integer_softmax_error_against_float_softmax_over_ten_thousand_inputs() {
    // 10 000 rows of 8 logits (one DARTS edge's alphas), N(0, 1.5²), 8-bit inputs on each
    // row's symmetric range, outputs on the 8-bit [0, 1] grid.
    let rows = 10_000;
    let x = qdarts_ops::seeded(&dev(), 17, || {
        Tensor::<2>::random([rows, 8], Distribution::Normal(0.0, 1.5), &dev())
    });
    let int = vals(quantized_softmax(x.clone(), 8, 8).unwrap());

    // Against the float softmax of the float logits: everything (input rounding included).
    let float = vals(burn::tensor::activation::softmax(x.clone(), 1));
    let (mean, rmse, max) = error_stats(&float, &int);
    eprintln!(
        "integer softmax vs float softmax: mean |err| {mean:.2e}, rmse {rmse:.2e}, max {max:.2e}"
    );

    // Against the float softmax of the 8-bit logits: the integer exp, division and output grid.
    let xv = vals(x);
    let xq: Vec<f32> = xv
        .chunks(8)
        .flat_map(|row| {
            let s = row.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
            row.iter().map(move |v| (v / s).round_ties_even() * s).collect::<Vec<_>>()
        })
        .collect();
    let xq = Tensor::<2>::from_data(TensorData::new(xq, [rows, 8]), &dev());
    let float_q = vals(burn::tensor::activation::softmax(xq, 1));
    let (amean, armse, amax) = error_stats(&float_q, &int);
    eprintln!(
        "integer arithmetic alone (same 8-bit inputs): mean |err| {amean:.2e}, rmse {armse:.2e}, max {amax:.2e}"
    );

    // The output grid alone costs up to half a step (1/510 ≈ 2.0e-3).
    assert!(amax < 4e-3, "integer arithmetic max error {amax}");
    assert!(mean < 1.5e-3, "mean error {mean}");
    assert!(max < 1.5e-2, "max error {max}");
}
