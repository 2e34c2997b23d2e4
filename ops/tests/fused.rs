//! The fused fake-quant kernel against the composite expression: bit-identical values and
//! straight-through gradients on ties, out-of-range values, both roundings, every channel axis
//! and non-contiguous inputs. (The golden vectors run both against PyTorch and Paddle.)

use burn::tensor::{DType, Device, Tensor};
use qdarts_ops::quant::{Grid, RoundMode, fake_quant};
use qdarts_ops::quant::{fake_quant_fused, fused_available};

mod common;
use common::{devices, fused_devices, has_fused};

/// Values that hit every case: exact ties (k + 0.5 steps), near-ties, zero, both signs, far
/// out of range.
fn values(n: usize, step: f32) -> Vec<f32> {
    let mut s = 0x2545_f491_4f6c_dd1d_u64;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 40) as f32 / (1u64 << 24) as f32; // [0, 1)
            match i % 5 {
                0 => ((i as f32 / 5.0).floor() - 150.0 + 0.5) * step, // ties, some beyond ±128
                1 => (u - 0.5) * 300.0 * step,
                2 => (u - 0.5) * 4.0 * step,
                3 => {
                    if i % 2 == 0 {
                        0.0
                    } else {
                        -1e6 * step
                    }
                }
                _ => (u - 0.5) * step * 256.0 + 1e-7,
            }
        })
        .collect()
}

fn floats(t: Tensor<4>) -> Vec<f32> {
    t.into_data().try_to_vec::<f32>().expect("f32 tensor")
}

fn bits(t: Tensor<4>) -> Vec<u32> {
    floats(t).iter().map(|v| v.to_bits()).collect()
}

fn check(
    d: &Device,
    shape: [usize; 4],
    axis: Option<usize>,
    round: RoundMode,
    (qmin, qmax): (i32, i32),
) {
    let d = d.clone().autodiff();
    let c = axis.map_or(1, |a| shape[a]);
    let steps: Vec<f32> = (0..c).map(|k| 0.013 * (1.0 + k as f32 * 0.37)).collect();
    let zps: Vec<f32> =
        (0..c).map(|k| if qmin == 0 { (k * 37 % 200) as f32 + 20.0 } else { 0.0 }).collect();
    let n: usize = shape.iter().product();
    let xs = values(n, steps[0]);
    let grid = Grid::from_step(
        Tensor::from_floats(steps.as_slice(), &d),
        Tensor::from_floats(zps.as_slice(), &d),
        (qmin, qmax),
        round,
        axis,
    );
    let up = Tensor::<1>::from_floats(values(n, 0.7).as_slice(), &d).reshape(shape);
    let x = Tensor::<1>::from_floats(xs.as_slice(), &d).reshape(shape);

    let xa = x.clone().require_grad();
    let (a, _) = fake_quant(xa.clone(), &grid);
    let ga = xa.grad(&a.clone().mul(up.clone()).sum().backward()).expect("grad");
    let xb = x.require_grad();
    let b = fake_quant_fused(xb.clone(), &grid);
    let gb = xb.grad(&b.clone().mul(up).sum().backward()).expect("grad");

    let what = format!("{d:?} {shape:?} axis {axis:?} {round:?} [{qmin}, {qmax}]");
    assert_eq!(bits(a), bits(b), "values differ: {what}");
    // The composite gradient is g·0 outside (−0 for negative g); compare as numbers.
    let (ga, gb) = (floats(ga), floats(gb));
    assert_eq!(ga, gb, "gradients differ: {what}");
    assert!(ga.contains(&0.0) && ga.iter().any(|&g| g != 0.0), "{what}: no clipping seen");
}

#[test]
fn fused_is_compiled_in_for_every_backend() {
    for (name, d) in devices() {
        // Where no kernel is written (LibTorch), quantizers must fall back to the composite.
        let want = has_fused(name);
        assert_eq!(fused_available(&d, DType::F32), want, "{name}");
        assert_eq!(fused_available(&d.autodiff(), DType::F32), want, "{name} autodiff");
    }
    assert!(!fused_available(&Device::flex(), DType::F16));
}

#[test]
fn fused_matches_composite_bit_for_bit() {
    for (_, d) in fused_devices() {
        for round in [RoundMode::TiesToEven, RoundMode::TiesAwayFromZero] {
            for range in [(-128, 127), (0, 255), (-8, 7)] {
                check(&d, [2, 3, 5, 7], None, round, range);
                for axis in 0..4 {
                    check(&d, [3, 4, 5, 6], Some(axis), round, range);
                }
            }
        }
        // Large enough to span several parallel chunks, with runs crossing chunk borders.
        check(&d, [2, 48, 33, 33], Some(1), RoundMode::TiesToEven, (-128, 127));
    }
}

#[test]
fn fused_reads_non_contiguous_inputs() {
    for (_, d) in fused_devices() {
        non_contiguous(&d.autodiff());
    }
}

fn non_contiguous(d: &Device) {
    let d = d.clone();
    let grid = Grid::from_step(
        Tensor::from_floats([0.05, 0.1, 0.2], &d),
        Tensor::from_floats([0.0, 0.0, 0.0], &d),
        (-128, 127),
        RoundMode::TiesToEven,
        Some(1),
    );
    let x = Tensor::<1>::from_floats(values(3 * 4 * 5 * 2, 0.05).as_slice(), &d)
        .reshape([4, 3, 5, 2])
        .swap_dims(0, 1)
        .swap_dims(0, 1)
        .permute([0, 1, 3, 2]);
    let grid4 = Grid { axis: Some(1), ..grid };
    assert_eq!(bits(fake_quant(x.clone(), &grid4).0), bits(fake_quant_fused(x, &grid4)));
}

/// Inputs laid out channels-last and an upstream gradient that reaches the quantizer as a
/// strided view (the loss reads the output transposed): values and gradients as composite.
#[test]
fn fused_gradients_read_strided_inputs_and_upstream_gradients() {
    for (_, d) in fused_devices() {
        let d = d.autodiff();
        for axis in [None, Some(1)] {
            let c = if axis.is_some() { 3 } else { 1 };
            let steps: Vec<f32> = (0..c).map(|k| 0.05 * (1.0 + k as f32)).collect();
            let grid = Grid::from_step(
                Tensor::from_floats(steps.as_slice(), &d),
                Tensor::zeros([c], &d),
                (-128, 127),
                RoundMode::TiesToEven,
                axis,
            );
            let x = Tensor::<1>::from_floats(values(120, 0.05).as_slice(), &d)
                .reshape([4, 5, 2, 3])
                .permute([0, 3, 1, 2]);
            let up =
                Tensor::<1>::from_floats(values(120, 0.7).as_slice(), &d).reshape([4, 2, 5, 3]);
            let run = |fused: bool| {
                let xa = x.clone().require_grad();
                let y = if fused {
                    fake_quant_fused(xa.clone(), &grid)
                } else {
                    fake_quant(xa.clone(), &grid).0
                };
                let loss = y.clone().permute([0, 3, 2, 1]).mul(up.clone()).sum();
                let g = xa.grad(&loss.backward()).expect("grad");
                (bits(y), floats(g))
            };
            let (composite, fused) = (run(false), run(true));
            let what = format!("{d:?} axis {axis:?}");
            assert_eq!(composite.0, fused.0, "values differ: {what}");
            assert_eq!(composite.1, fused.1, "gradients differ: {what}");
            let g = &fused.1;
            assert!(g.contains(&0.0) && g.iter().any(|&v| v != 0.0), "{what}: no clipping seen");
        }
    }
}

/// A per-channel grid whose parameters hold one value for every channel.
#[test]
fn fused_broadcasts_one_value_parameters() {
    for (_, d) in fused_devices() {
        let grid = Grid::from_step(
            Tensor::from_floats([0.05], &d),
            Tensor::from_floats([3.0], &d),
            (0, 255),
            RoundMode::TiesAwayFromZero,
            Some(1),
        );
        let x = Tensor::<1>::from_floats(values(2 * 3 * 4 * 5, 0.05).as_slice(), &d)
            .reshape([2, 3, 4, 5]);
        assert_eq!(bits(fake_quant(x.clone(), &grid).0), bits(fake_quant_fused(x, &grid)));
    }
}
