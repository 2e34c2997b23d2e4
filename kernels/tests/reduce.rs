//! The row reductions on every backend against the same reduction done on the host: max and
//! min exactly, means to float32 rounding of an f64 sum, at lengths below, at and above the
//! length where the GPU backends split a row in two stages, with and without a tail; the sum of
//! a whole tensor likewise, and bit for bit Burn's `sum` on flex.

use burn::tensor::{Device, Tensor, TensorData};
use qdarts_kernels::reduce::{row_max, row_mean, row_min, sum_all};

use qdarts_kernels::devices::compiled as devices;

/// Deterministic values of both signs with a wide spread, one planted extreme per row.
fn values(rows: usize, len: usize) -> Vec<f32> {
    let mut s = 0x9e37_79b9_7f4a_7c15_u64;
    let mut v: Vec<f32> = (0..rows * len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0
        })
        .collect();
    for r in 0..rows {
        // The extremes sit at the end of the row on odd rows (inside the tail when there is
        // one) and near the start on even rows.
        let at = if r % 2 == 1 { len - 1 } else { len / 7 };
        v[r * len + at] = if r % 3 == 0 { 100.0 + r as f32 } else { -100.0 - r as f32 };
    }
    v
}

fn host(t: Tensor<1>) -> Vec<f32> {
    t.into_data().try_to_vec::<f32>().expect("f32 tensor")
}

fn check(name: &str, d: &Device, rows: usize, len: usize) {
    let v = values(rows, len);
    let x = Tensor::<2>::from_data(TensorData::new(v.clone(), [rows, len]), d);
    let (max, min, mean) = (host(row_max(x.clone())), host(row_min(x.clone())), host(row_mean(x)));
    for r in 0..rows {
        let row = &v[r * len..(r + 1) * len];
        let want_max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let want_min = row.iter().copied().fold(f32::INFINITY, f32::min);
        let want_mean = row.iter().map(|&a| a as f64).sum::<f64>() / len as f64;
        assert_eq!(max[r], want_max, "{name}: max of row {r} of [{rows}, {len}]");
        assert_eq!(min[r], want_min, "{name}: min of row {r} of [{rows}, {len}]");
        let err = (mean[r] as f64 - want_mean).abs();
        assert!(
            err <= 1e-6 * row.iter().map(|&a| a.abs() as f64).sum::<f64>() / len as f64,
            "{name}: mean of row {r} of [{rows}, {len}]: {} against {want_mean} (f64)",
            mean[r]
        );
    }
}

#[test]
fn row_reductions_match_the_host_on_every_backend() {
    // 4096 splits exactly (64·64); 5000 and 12_345 leave a tail; 100 stays one pass.
    for (name, d) in devices() {
        for &(rows, len) in &[(1, 100), (3, 4095), (1, 4096), (2, 5000), (3, 12_345), (16, 65_536)]
        {
            check(name, &d, rows, len);
        }
    }
}

#[test]
fn whole_tensor_sums_match_the_host_on_every_backend() {
    for (name, d) in devices() {
        // [2, 3, 5, 7] stays one pass; the others split, 3·40·41·17 with a tail.
        for shape in [[2, 3, 5, 7], [4, 16, 8, 8], [3, 40, 41, 17]] {
            let n: usize = shape.iter().product();
            let v = values(1, n);
            let x = Tensor::<4>::from_data(TensorData::new(v.clone(), shape), &d);
            let got = host(sum_all(x.clone()));
            assert_eq!(got.len(), 1, "{name}: {shape:?}");
            let want: f64 = v.iter().map(|&a| a as f64).sum();
            let mass: f64 = v.iter().map(|&a| a.abs() as f64).sum();
            let err = (got[0] as f64 - want).abs();
            assert!(
                err <= 1e-6 * mass,
                "{name}: sum of {shape:?}: {} against {want} (f64)",
                got[0]
            );
            if name == "flex" {
                let burn = host(x.sum());
                assert_eq!(got[0].to_bits(), burn[0].to_bits(), "flex keeps Burn's sum, {shape:?}");
            }
        }
    }
}
