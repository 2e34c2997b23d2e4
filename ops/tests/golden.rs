//! Golden vectors from PyTorch and PaddlePaddle (schema: `tests/golden/SCHEMA.md`).
//!
//! One harness runs every `*.json` file of a folder: `tests/golden/` in this repository, or the
//! folder named by `QDARTS_GOLDEN_DIR`. The file name (or its `op` field) says which reference it
//! comes from. Integers must match exactly; floats to 1e-6 relative (1e-7 absolute near zero);
//! gradients too. Each file's worst relative error is printed (`--nocapture`), so the margin is
//! visible, not just the verdict.

use std::path::{Path, PathBuf};

use burn::tensor::{Device, Tensor, TensorData};
use qdarts_ops::quant::observer::ObserverState;
use qdarts_ops::quant::{
    FakeQuantImpl, FakeQuantizer, Granularity, Grid, LearnableGrid, ObserverKind, QuantPass,
    QuantSpec, RawQuantSpec, RoundMode, TensorRole, fake_quant_learnable, fake_quant_with,
    quantize,
};
use serde_json::Value;

mod common;
use common::{devices, has_fused};

type Check = Result<(), String>;

fn golden_dir() -> PathBuf {
    match std::env::var_os("QDARTS_GOLDEN_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden"),
    }
}

thread_local! {
    /// The device of the file being run.
    static DEVICE: std::cell::RefCell<Device> = std::cell::RefCell::new(Device::flex());
}

fn device() -> Device {
    DEVICE.with(|d| d.borrow().clone())
}

fn floats(v: &Value, key: &str) -> Result<Vec<f32>, String> {
    // A scalar (Paddle's `out_scale`) reads as a one-element list.
    if let Some(x) = v.get(key).and_then(Value::as_f64) {
        return Ok(vec![x as f32]);
    }
    v.get(key)
        .and_then(Value::as_array)
        .ok_or_else(|| format!("missing array `{key}`"))?
        .iter()
        .map(|x| x.as_f64().map(|f| f as f32).ok_or_else(|| format!("non-number in `{key}`")))
        .collect()
}

fn num(v: &Value, key: &str) -> Result<f64, String> {
    v.get(key).and_then(Value::as_f64).ok_or_else(|| format!("missing number `{key}`"))
}

fn shape(v: &Value) -> Result<Vec<usize>, String> {
    v.get("shape")
        .and_then(Value::as_array)
        .ok_or("missing `shape`")?
        .iter()
        .map(|d| d.as_u64().map(|d| d as usize).ok_or_else(|| "bad shape".to_string()))
        .collect()
}

/// Loads a golden tensor of any rank as rank 4: `[before, C, after, 1]` around the channel axis
/// (per-channel), or `[1, 1, 1, n]` (per-tensor). Returns the tensor and its new channel axis.
fn tensor4(
    values: &[f32],
    shape: &[usize],
    axis: Option<usize>,
    device: &Device,
) -> Result<(Tensor<4>, Option<usize>), String> {
    let n: usize = shape.iter().product();
    if n != values.len() {
        return Err(format!("shape {shape:?} holds {n} values, file has {}", values.len()));
    }
    let dims = match axis {
        None => [1, 1, 1, n],
        Some(a) if a < shape.len() => {
            let before = shape[..a].iter().product();
            let after = shape[a + 1..].iter().product();
            [before, shape[a], after, 1]
        }
        Some(a) => return Err(format!("axis {a} out of range for shape {shape:?}")),
    };
    let t = Tensor::from_data(TensorData::new(values.to_vec(), dims), device);
    Ok((t, axis.map(|_| 1)))
}

fn to_vec<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_to_vec::<f32>().expect("f32 data")
}

thread_local! {
    /// Worst relative error among the float comparisons of the current file.
    static WORST: std::cell::Cell<f64> = const { std::cell::Cell::new(0.0) };
}

fn close(name: &str, got: &[f32], want: &[f32]) -> Check {
    if got.len() != want.len() {
        return Err(format!("{name}: {} values, expected {}", got.len(), want.len()));
    }
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let diff = (g as f64 - w as f64).abs();
        let rel = diff / (w.abs().max(g.abs()) as f64).max(f64::MIN_POSITIVE);
        // numpy.allclose(rtol = 1e-6, atol = 1e-7): relative, or absolute near zero.
        let ok = diff <= 1e-7 + 1e-6 * w.abs() as f64;
        if !ok {
            return Err(format!("{name}[{i}]: got {g:e}, expected {w:e} (rel {rel:.2e})"));
        }
        if w.abs() >= 1e-3 {
            WORST.with(|c| c.set(c.get().max(rel)));
            if rel > 1e-6 {
                eprintln!(
                    "  {name}[{i}]: got {g:e}, expected {w:e} (rel {rel:.2e}, abs {diff:.1e})"
                );
            }
        }
    }
    Ok(())
}

fn exact(name: &str, got: &[f32], want: &[f32]) -> Check {
    if got.len() != want.len() {
        return Err(format!("{name}: {} values, expected {}", got.len(), want.len()));
    }
    match got.iter().zip(want).position(|(g, w)| g != w) {
        None => Ok(()),
        Some(i) => Err(format!("{name}[{i}]: got {}, expected {}", got[i], want[i])),
    }
}

/// `out · upstream` summed, so that backward delivers `upstream` as the output gradient.
fn backward_with<const D: usize>(out: Tensor<D>, upstream: Tensor<D>) -> burn::tensor::Gradients {
    out.mul(upstream).sum().backward()
}

fn torch_fixed(v: &Value, per_channel: bool, imp: FakeQuantImpl) -> Check {
    let p = &v["params"];
    let shp = shape(v)?;
    let dev = device().autodiff();
    let (qmin, qmax) = (num(p, "quant_min")? as i32, num(p, "quant_max")? as i32);
    let (scale, zp, axis) = if per_channel {
        (floats(p, "scale")?, floats(p, "zero_point")?, Some(num(p, "axis")? as usize))
    } else {
        (vec![num(p, "scale")? as f32], vec![num(p, "zero_point")? as f32], None)
    };
    let (x, axis4) = tensor4(&floats(v, "input")?, &shp, axis, &dev)?;
    let (up, _) = tensor4(&floats(v, "upstream_grad")?, &shp, axis, &dev)?;
    let grid = Grid::from_step(
        Tensor::from_floats(scale.as_slice(), &dev),
        Tensor::from_floats(zp.as_slice(), &dev),
        (qmin, qmax),
        RoundMode::TiesToEven,
        axis4,
    );
    let x = x.require_grad();
    let out = fake_quant_with(x.clone(), &grid, imp);
    close("output", &to_vec(out.clone()), &floats(v, "output")?)?;
    let grads = backward_with(out, up);
    let gx = x.grad(&grads).ok_or("no gradient for input")?;
    close("grad_input", &to_vec(gx), &floats(v, "grad_input")?)
}

fn torch_learnable(v: &Value) -> Check {
    let p = &v["params"];
    let shp = shape(v)?;
    let dev = device().autodiff();
    let scale = Tensor::<1>::from_floats([num(p, "scale")? as f32], &dev).require_grad();
    let zp = Tensor::<1>::from_floats([num(p, "zero_point")? as f32], &dev).require_grad();
    let lg = LearnableGrid {
        scale: scale.clone(),
        zero_point: zp.clone(),
        qmin: num(p, "quant_min")? as i32,
        qmax: num(p, "quant_max")? as i32,
        grad_factor: num(p, "grad_factor")? as f32,
        round: RoundMode::TiesToEven,
        axis: None,
    };
    let x = tensor4(&floats(v, "input")?, &shp, None, &dev)?.0.require_grad();
    let (out, _) = fake_quant_learnable(x.clone(), &lg);
    close("output", &to_vec(out.clone()), &floats(v, "output")?)?;
    let up = tensor4(&floats(v, "upstream_grad")?, &shp, None, &dev)?.0;
    let grads = backward_with(out, up);
    close(
        "grad_input",
        &to_vec(x.grad(&grads).ok_or("no input grad")?),
        &floats(v, "grad_input")?,
    )?;
    close(
        "grad_scale",
        &to_vec(scale.grad(&grads).ok_or("no scale grad")?),
        &floats(v, "grad_scale")?,
    )?;
    close(
        "grad_zero_point",
        &to_vec(zp.grad(&grads).ok_or("no zero-point grad")?),
        &floats(v, "grad_zero_point")?,
    )
}

fn paddle_round(p: &Value) -> Result<RoundMode, String> {
    match num(p, "round_type")? as i64 {
        0 => Ok(RoundMode::TiesToEven),
        1 => Ok(RoundMode::TiesAwayFromZero),
        r => Err(format!("unknown round_type {r}")),
    }
}

fn paddle_spec(
    p: &Value,
    observer: ObserverKind,
    granularity: Granularity,
) -> Result<QuantSpec, String> {
    QuantSpec::new(RawQuantSpec {
        bits: num(p, "bit_length")? as u32,
        signed: true,
        symmetric: true,
        granularity,
        round: paddle_round(p)?,
        observer,
        quant_min: None,
        quant_max: None,
    })
    .map_err(|e| e.to_string())
}

/// Runs one training-mode step of a Paddle quantizer and checks threshold, integers and
/// dequantized values.
fn paddle_step(
    (fq, imp): (&FakeQuantizer, FakeQuantImpl),
    step: &Value,
    shp: &[usize],
    axis: Option<usize>,
    scale_key: &str,
) -> Check {
    let dev = device();
    let (x, _) = tensor4(&floats(step, "input")?, shp, axis, &dev)?;
    let qp = QuantPass { imp, ..QuantPass::OFF };
    let (out, _) = fq.try_forward_in(x.clone(), qp).map_err(|e| e.to_string())?;
    let threshold =
        fq.observer.as_ref().and_then(ObserverState::threshold).ok_or("no threshold")?;
    close(scale_key, &to_vec(threshold), &floats(step, scale_key)?)?;
    let q = quantize(x, &fq.current_grid(&dev)).q;
    exact("quantized", &to_vec(q), &floats(step, "quantized")?)?;
    close("dequantized", &to_vec(out), &floats(step, "dequantized")?)
}

fn paddle_abs_max(v: &Value, imp: FakeQuantImpl) -> Check {
    let spec = paddle_spec(&v["params"], ObserverKind::AbsMax, Granularity::PerTensor)?;
    let fq = FakeQuantizer::new(spec, "golden", TensorRole::Act, 1, &device())
        .map_err(|e| e.to_string())?;
    paddle_step((&fq, imp), v, &shape(v)?, None, "out_scale")
}

fn paddle_channel_wise(v: &Value, imp: FakeQuantImpl) -> Check {
    let p = &v["params"];
    let shp = shape(v)?;
    let axis = num(p, "quant_axis")? as usize;
    let channels = *shp.get(axis).ok_or("quant_axis out of range")?;
    let spec =
        paddle_spec(p, ObserverKind::ChannelWiseAbsMax, Granularity::PerChannel { axis: 1 })?;
    let fq = FakeQuantizer::new(spec, "golden", TensorRole::Weight, channels, &device())
        .map_err(|e| e.to_string())?;
    paddle_step((&fq, imp), v, &shp, Some(axis), "out_scales")
}

fn paddle_moving_average(v: &Value, imp: FakeQuantImpl) -> Check {
    let p = &v["params"];
    let shp = shape(v)?;
    let rate = num(p, "moving_rate")? as f32;
    let spec = paddle_spec(p, ObserverKind::MovingAverageAbsMax { rate }, Granularity::PerTensor)?;
    let dev = device();
    let fq =
        FakeQuantizer::new(spec, "golden", TensorRole::Act, 1, &dev).map_err(|e| e.to_string())?;
    let Some(ObserverState::MovingAverageAbsMax(s)) = &fq.observer else {
        return Err("moving-average spec built another observer".into());
    };
    s.state.set(Tensor::from_floats([num(p, "in_state")? as f32], &dev));
    s.accum.set(Tensor::from_floats([num(p, "in_accum")? as f32], &dev));
    let steps = v.get("steps").and_then(Value::as_array).ok_or("missing `steps`")?;
    for (i, step) in steps.iter().enumerate() {
        paddle_step((&fq, imp), step, &shp, None, "out_scale")
            .map_err(|e| format!("step {i}: {e}"))?;
        close("out_state", &to_vec(s.state.value()), &[num(step, "out_state")? as f32])
            .map_err(|e| format!("step {i}: {e}"))?;
        close("out_accum", &to_vec(s.accum.value()), &[num(step, "out_accum")? as f32])
            .map_err(|e| format!("step {i}: {e}"))?;
    }
    Ok(())
}

/// Which reference produced a file: by its name as SCHEMA.md lists them, else by its `op`.
fn run_case(name: &str, v: &Value, imp: FakeQuantImpl) -> Check {
    let op = v.get("op").and_then(Value::as_str).unwrap_or("");
    let is = |prefix: &str, op_name: &str| name.starts_with(prefix) || op.contains(op_name);
    if is("torch_learnable_per_tensor", "learnable_per_tensor") {
        torch_learnable(v)
    } else if is("torch_per_channel_affine", "fake_quantize_per_channel_affine") {
        torch_fixed(v, true, imp)
    } else if is("torch_per_tensor_affine", "fake_quantize_per_tensor_affine") {
        torch_fixed(v, false, imp)
    } else if is("paddle_moving_average_abs_max", "moving_average_abs_max") {
        paddle_moving_average(v, imp)
    } else if is("paddle_channel_wise", "channel_wise") {
        paddle_channel_wise(v, imp)
    } else if is("paddle_abs_max", "abs_max") {
        paddle_abs_max(v, imp)
    } else {
        Err("not a case of the golden schema (unknown file name and op)".into())
    }
}

/// Every file runs twice on each device: with the composite fake-quant expression and with the
/// fused kernel (the quantizers' Paddle cases go through the process-wide default, set here; this
/// is the only test of this binary, so nothing else sees the switch).
#[test]
fn every_golden_vector_matches_its_reference() {
    for (name, dev) in devices() {
        assert_eq!(
            qdarts_ops::quant::fused_available(&dev, burn::tensor::DType::F32),
            has_fused(name),
            "the fused kernel must be compiled in for {name}, or half of this test proves nothing"
        );
    }
    let dir = golden_dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read golden folder {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no *.json golden vectors in {}", dir.display());
    let mut failures = Vec::new();
    let devices = devices();
    let mut runs = Vec::new();
    for (dev_name, dev) in &devices {
        for imp in [FakeQuantImpl::Composite, FakeQuantImpl::Fused] {
            if imp == FakeQuantImpl::Fused && !has_fused(dev_name) {
                continue;
            }
            runs.extend(files.iter().map(|p| (*dev_name, dev, imp, p)));
        }
    }
    for (dev_name, dev, imp, path) in runs {
        DEVICE.with(|d| *d.borrow_mut() = dev.clone());
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        WORST.with(|c| c.set(0.0));
        let result = std::fs::read_to_string(path)
            .map_err(|e| e.to_string())
            .and_then(|text| serde_json::from_str::<Value>(&text).map_err(|e| e.to_string()))
            .and_then(|v| run_case(&name, &v, imp));
        let name = format!("{name} [{dev_name} {imp:?}]");
        match result {
            Ok(()) => {
                let worst = WORST.with(|c| c.get());
                eprintln!(
                    "golden ok   {name} (worst relative error where |ref| >= 1e-3: {worst:.1e})"
                );
            }
            Err(e) => {
                eprintln!("golden FAIL {name}: {e}");
                failures.push(format!("{name}: {e}"));
            }
        }
    }
    eprintln!(
        "{} golden files in {}, each composite on {} and fused on {}, {} runs failed",
        files.len(),
        dir.display(),
        devices.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(" and "),
        devices
            .iter()
            .filter(|(n, _)| has_fused(n))
            .map(|(n, _)| *n)
            .collect::<Vec<_>>()
            .join(" and "),
        failures.len()
    );
    assert!(failures.is_empty(), "golden mismatches:\n{}", failures.join("\n"));
}
