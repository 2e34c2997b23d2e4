//! The quantizers' bookkeeping kernels on the CubeCL backends against the tensor expressions
//! they replace, bit for bit, on every backend of the build, and every backend against flex
//! (bit for bit where the backend divides as IEEE 754 does; within a few ulps, a tie rounding
//! either way, where it does not: Vulkan lets a GPU driver divide 2.5 ulps off).
//!
//! - Observers (`qdarts_kernels::observe`): each observer kind the presets use, per tensor and
//!   per channel, contiguous and channels-last tensors, rows long enough for the two-stage
//!   reduction, an all-zero tensor, and successive updates (so the moving averages start from
//!   a stored state).
//! - An observer and the fake quantization on its grid in one launch: the two launches' output,
//!   gradient, grid and state, bit for bit, one launch fewer.
//! - Many weight quantizers at once (`FakeQuantizer::forward_many`): each one's output,
//!   gradient, grid and state as its own forward's, bit for bit, the abs-max sites eight a
//!   launch and the others alone.
//! - The int32 bias (`qdarts_kernels::bias`): ties, vanishing and negative units, values past
//!   the int32 range, both roundings, and the straight-through gradient; the bias rounded and
//!   added back in one launch with its unit as a product of one to three factors.

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use std::sync::Mutex;

use burn::tensor::{DType, Device, Tensor};
use qdarts_kernels::bias::{int32_rounded, rounded_available};
use qdarts_kernels::cat::ARITY;
use qdarts_kernels::devices::compiled as devices;
use qdarts_kernels::launches::counted;
use qdarts_kernels::observe::{CHUNK, observe_available};
use qdarts_ops::candidates::quantize_bias_with;
use qdarts_ops::quant::fake_quant::{
    FakeQuantImpl, Grid, fake_quant_fused, fake_quant_sum, fake_quant_sum_ste, quantize,
};
use qdarts_ops::quant::observer::ObserverState;
use qdarts_ops::quant::{Granularity, ObserverKind, QuantSpec, RoundMode};

fn vals<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
}

/// Held by every test here: the launch count sees every thread of the process.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Whether `d` divides f32 correctly rounded, as flex does: Mesa's CPU Vulkan driver does;
/// Vulkan allows a GPU driver 2.5 ulps (NVIDIA's takes them), and CUDA's division is exact.
/// Where it does not, a grid's step can differ from flex's in its last bits, and a value at a
/// tie of the grid can round the other way.
fn divides_exactly(d: &Device) -> bool {
    let (a, b) = (normal(1 << 14, 91), normal(1 << 14, 92));
    let q =
        vals(Tensor::<1>::from_floats(a.as_slice(), d).div(Tensor::from_floats(b.as_slice(), d)));
    q.iter().zip(a.iter().zip(&b)).all(|(q, (x, y))| q.to_bits() == (x / y).to_bits())
}

/// The compiled devices, each with whether it divides exactly (probed once).
fn devices_and_division() -> Vec<(&'static str, Device, bool)> {
    let all = devices().into_iter().map(|(name, d)| {
        let exact = divides_exactly(&d);
        if !exact {
            eprintln!("note: {name}'s f32 division is not correctly rounded");
        }
        (name, d, exact)
    });
    all.collect()
}

/// The observers under test: `(name, kind, signed, symmetric)`.
fn kinds() -> Vec<(&'static str, ObserverKind, bool, bool)> {
    let ema = ObserverKind::MovingAverageMinMax { averaging_constant: 0.01 };
    vec![
        ("abs_max", ObserverKind::AbsMax, true, true),
        ("moving_average_abs_max", ObserverKind::MovingAverageAbsMax { rate: 0.9 }, true, true),
        ("min_max symmetric", ObserverKind::MinMax, true, true),
        ("min_max affine", ObserverKind::MinMax, false, false),
        ("moving_average_min_max symmetric", ema, true, true),
        ("moving_average_min_max affine", ema, false, false),
    ]
}

/// How a test tensor is laid out and observed.
#[derive(Debug, Clone, Copy)]
enum Case {
    /// A conv weight `[16, 8, 3, 3]`, per output channel.
    Weight,
    /// A short contiguous activation, per tensor.
    Short,
    /// A channels-last activation `[4, 8, 24, 24]` (two-stage), per tensor.
    ChannelsLast,
    /// The same, per channel along axis 1 (strided rows).
    ChannelsLastPerChannel,
    /// A contiguous activation `[4, 8, 40, 40]` per channel along axis 1 (each row a run of
    /// 1 600 values in each of four images; two chunks a row).
    InnerPerChannel,
    /// A contiguous activation with more chunks per row than a cube has threads.
    Long,
    /// A contiguous activation with more chunks than the observer's second stage quantizes
    /// (over 4 Mi values; not in [`Case::ALL`]).
    Huge,
}

impl Case {
    const ALL: [Case; 6] = [
        Case::Weight,
        Case::Short,
        Case::ChannelsLast,
        Case::ChannelsLastPerChannel,
        Case::InnerPerChannel,
        Case::Long,
    ];

    fn granularity(self) -> Granularity {
        match self {
            Case::Weight => Granularity::PerChannel { axis: 0 },
            Case::ChannelsLastPerChannel | Case::InnerPerChannel => {
                Granularity::PerChannel { axis: 1 }
            }
            _ => Granularity::PerTensor,
        }
    }

    fn channels(self) -> usize {
        match self {
            Case::Weight => 16,
            Case::ChannelsLastPerChannel | Case::InnerPerChannel => 8,
            _ => 1,
        }
    }

    /// Tensor `k` of the sequence an observer sees, the same values on every backend (drawn
    /// on the host from `seed`): its range shifting with `k` so that the running extrema move;
    /// the last one all zeros.
    fn tensor(self, d: &Device, k: usize, seed: u64) -> Tensor<4> {
        self.arrange(self.values(d, k, seed))
    }

    /// The flat values of [`tensor`](Self::tensor).
    fn values(self, d: &Device, k: usize, seed: u64) -> Tensor<1> {
        let n = self.dims().iter().product();
        let values: Vec<f32> = if k == 3 {
            vec![0.0; n]
        } else {
            normal(n, seed).iter().map(|v| 0.3 * k as f32 + (1.0 + k as f32) * v).collect()
        };
        Tensor::<1>::from_floats(values.as_slice(), d)
    }

    /// Flat values laid out as [`tensor`](Self::tensor) lays them out.
    fn arrange(self, values: Tensor<1>) -> Tensor<4> {
        let x = values.reshape(self.dims());
        match self {
            Case::ChannelsLast | Case::ChannelsLastPerChannel => x.permute([0, 3, 1, 2]),
            _ => x,
        }
    }

    /// The shape the values are drawn in (before a permutation to channels-last).
    fn dims(self) -> [usize; 4] {
        match self {
            Case::Weight => [16, 8, 3, 3],
            Case::Short => [2, 3, 5, 7],
            Case::ChannelsLast | Case::ChannelsLastPerChannel => [4, 24, 24, 8],
            Case::InnerPerChannel => [4, 8, 40, 40],
            Case::Long => [8, 16, 96, 96],
            Case::Huge => [17, 16, 128, 128],
        }
    }
}

/// `n` standard normal values from `seed` (xorshift and Box–Muller on the host).
fn normal(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut uniform = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        ((s >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    (0..n)
        .map(|_| {
            let (u, v) = (uniform(), uniform());
            ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32
        })
        .collect()
}

/// The stored state of an observer, tensor by tensor.
fn state(o: &ObserverState) -> Vec<Vec<f32>> {
    match o {
        ObserverState::AbsMax(s) => vec![vals(s.threshold.value())],
        ObserverState::MovingAverageAbsMax(s) => {
            vec![vals(s.state.value()), vals(s.accum.value()), vals(s.threshold.value())]
        }
        ObserverState::MinMax(s) => vec![vals(s.min.value()), vals(s.max.value())],
        ObserverState::RangeAbsMax(_) | ObserverState::Fixed(_) => unreachable!("not tested"),
    }
}

/// Everything an observer step produces: the grid's `mult`, `step`, `zero_point`, then the
/// stored state.
type Seen = Vec<Vec<f32>>;

/// Four updates of a fresh observer on `d` (the kernels or the expressions), each followed by a
/// read of the stored state (eval mode), then a read of the current weight without an update.
fn run(d: &Device, spec: &QuantSpec, case: Case, kernel: bool) -> Vec<Seen> {
    let o = ObserverState::new(spec, case.channels(), d).unwrap();
    let mut seen = Vec::new();
    let stored = |seen: &mut Vec<Seen>| {
        let g = o.grid_with(spec, &case.tensor(d, 2, 8), false, false, kernel);
        seen.push(vec![vals(g.mult), vals(g.step), vals(g.zero_point)]);
    };
    stored(&mut seen);
    for k in 0..4 {
        let x = case.tensor(d, k, 40 + k as u64);
        let g = o.grid_with(spec, &x, true, false, kernel);
        let mut s = vec![vals(g.mult), vals(g.step), vals(g.zero_point)];
        s.extend(state(&o));
        seen.push(s);
        stored(&mut seen);
    }
    let x = case.tensor(d, 1, 7);
    let g = o.grid_with(spec, &x, false, true, kernel);
    seen.push(vec![vals(g.mult), vals(g.step), vals(g.zero_point)]);
    seen
}

fn bits(seen: &[Seen]) -> Vec<Vec<Vec<u32>>> {
    seen.iter()
        .map(|s| s.iter().map(|v| v.iter().map(|x| x.to_bits()).collect()).collect())
        .collect()
}

#[test]
fn the_observer_kernels_give_the_expressions_grids_and_states_bit_for_bit() {
    let _serial = serial();
    let flex = Device::flex();
    let mut checked = 0;
    let backends = devices_and_division();
    for (name, kind, signed, symmetric) in kinds() {
        for case in Case::ALL {
            let spec = QuantSpec::with(8, signed, symmetric, case.granularity(), kind).unwrap();
            let reference = bits(&run(&flex, &spec, case, false));
            for &(backend, ref d, exact) in &backends {
                let d = d.clone();
                let what = format!("{name}, {case:?} on {backend}");
                let expressions = bits(&run(&d, &spec, case, false));
                let kernels = bits(&run(&d, &spec, case, true));
                checked += 1;
                let moving = kind != ObserverKind::AbsMax && kind != ObserverKind::MinMax;
                if moving && (backend == "cuda" || !exact) {
                    // A moving average's `a·r + b` may be one fused multiply-add there (CUDA;
                    // a Vulkan GPU driver, which may also divide inexactly, may contract it).
                    assert_close(&kernels, &expressions, &what);
                    continue;
                }
                assert_eq!(kernels, expressions, "{what}: kernels against expressions");
                if exact {
                    assert_eq!(expressions, reference, "{what}: expressions against flex");
                } else {
                    assert_close(&expressions, &reference, &format!("{what} against flex"));
                }
            }
        }
    }
    assert_eq!(checked, kinds().len() * Case::ALL.len() * backends.len(), "comparisons");
}

/// Within a few ulps (a zero point within 1), for the fused multiply-adds of CUDA and the
/// inexact divisions of a Vulkan GPU driver.
fn assert_close(a: &[Vec<Vec<u32>>], b: &[Vec<Vec<u32>>], what: &str) {
    for (x, y) in a.iter().flatten().flatten().zip(b.iter().flatten().flatten()) {
        let (fx, fy) = (f32::from_bits(*x), f32::from_bits(*y));
        let ok = x.abs_diff(*y) <= 4 || (fx.fract() == 0.0 && (fx - fy).abs() <= 1.0);
        assert!(ok, "{what}: {fx} against {fy}");
    }
}

#[test]
fn an_observer_update_is_at_most_two_launches_on_the_cubecl_backends() {
    let _serial = serial();
    let spec = QuantSpec::with(
        8,
        true,
        true,
        Granularity::PerTensor,
        ObserverKind::MovingAverageMinMax { averaging_constant: 0.01 },
    )
    .unwrap();
    for (backend, d) in devices() {
        let x = Case::ChannelsLast.tensor(&d, 0, 3);
        if !observe_available(&d, x.dtype()) {
            continue;
        }
        assert!(x.dims().iter().product::<usize>() > CHUNK, "two stages");
        let o = ObserverState::new(&spec, 1, &d).unwrap();
        o.grid(&spec, &x, true, false);
        // Two kernels: the chunks' extrema, then the state update and the grid.
        let (_, launches) = counted(&d, || vals(o.grid(&spec, &x, true, false).step));
        let launches = launches.unwrap();
        assert!(launches <= 2, "{backend}: {launches} launches");
        let (_, composite) = counted(&d, || vals(o.grid_with(&spec, &x, true, false, false).step));
        assert!(composite.unwrap() > 4 * launches, "{backend}: the expressions take {composite:?}");
        // A stored state (eval mode): one launch, without the tensor's extrema.
        let (_, stored) = counted(&d, || vals(o.grid(&spec, &x, false, false).step));
        assert_eq!(stored, Some(1), "{backend}: a stored state");
    }
}

#[test]
fn a_nan_in_the_tensor_reaches_the_state_as_in_the_expressions() {
    let _serial = serial();
    let ema = ObserverKind::MovingAverageMinMax { averaging_constant: 0.01 };
    // The extrema are NaN; an abs-max threshold and a first moving average take them, a
    // running min/max keeps its stored bounds (the pair minimum `min_pair` keeps its left
    // operand against a NaN), on every backend, kernels or expressions.
    for (kind, nan) in [(ObserverKind::AbsMax, true), (ema, true), (ObserverKind::MinMax, false)] {
        let spec = QuantSpec::with(8, true, true, Granularity::PerTensor, kind).unwrap();
        for (backend, d) in devices() {
            // One NaN deep in the second chunk of the row.
            let mut v = normal(8 * 16 * 96 * 96, 5);
            v[CHUNK + 17] = f32::NAN;
            let x = Tensor::<1>::from_floats(v.as_slice(), &d).reshape([8, 16, 96, 96]);
            for kernel in [true, false] {
                let o = ObserverState::new(&spec, 1, &d).unwrap();
                let step = vals(o.grid_with(&spec, &x, true, false, kernel).step)[0];
                let s = state(&o);
                let what = format!("{kind:?} on {backend}, kernel {kernel}: {s:?}, step {step}");
                assert_eq!(step.is_nan(), nan, "{what}");
                assert!(s.iter().flatten().all(|v| v.is_nan() == nan), "{what}");
            }
        }
    }
}

/// One observer step with the fake quantization of its tensor: the output, the gradient of
/// `Σ out ⊙ w` (`w` a fixed draw) reaching the flat input, the grid then the stored state
/// after the step (all as bits), and the forward's launches.
struct FqStep {
    out: Vec<u32>,
    grad: Vec<u32>,
    seen: Vec<Vec<u32>>,
    launches: u64,
    backward_launches: u64,
}

/// Step `k` of `o` on `case`'s tensor `k` (autodiff on `d`), updating or (`!update`) reading a
/// weight as it is: in one launch (`fused`, `None` where the observer does not read the
/// tensor), or the observer kernel then the fused fake quantization.
fn fq_step(
    d: &Device,
    o: &ObserverState,
    spec: &QuantSpec,
    (case, k): (Case, usize),
    update: bool,
    fused: bool,
) -> Option<FqStep> {
    let leaf = case.values(d, k, 60 + k as u64).require_grad();
    let x = case.arrange(leaf.clone());
    let (done, launches) = counted(d, || {
        let (out, grid) = if fused {
            o.grid_and_fake_quant(spec, &x, update, !update)?
        } else {
            let grid = o.grid_with(spec, &x, update, !update, true);
            (fake_quant_fused(x.clone(), &grid), grid)
        };
        Some((out, vec![vals(grid.mult), vals(grid.step), vals(grid.zero_point)]))
    });
    let (out, mut seen) = done?;
    seen.extend(state(o));
    let w = Tensor::<1>::from_floats(normal(leaf.dims()[0], 99).as_slice(), d);
    let loss = out.clone().mul(case.arrange(w)).sum();
    let (grads, backward_launches) = counted(d, || loss.backward());
    let bits = |v: Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    Some(FqStep {
        out: bits(vals(out)),
        grad: bits(vals(leaf.grad(&grads).unwrap())),
        seen: seen.into_iter().map(bits).collect(),
        launches: launches.unwrap(),
        backward_launches: backward_launches.unwrap(),
    })
}

#[test]
fn an_observer_and_its_fake_quantization_in_one_launch_are_the_two_launches_bit_for_bit() {
    let _serial = serial();
    let mut checked = 0;
    let mut cube_devices = 0;
    for (backend, d) in devices() {
        if !observe_available(&d, DType::F32) {
            continue;
        }
        cube_devices += 1;
        let ad = d.autodiff();
        // An unsigned abs-max grid clips the negative values: its gradient is masked.
        let unsigned = ("abs_max unsigned", ObserverKind::AbsMax, false, true);
        for (name, kind, signed, symmetric) in kinds().into_iter().chain([unsigned]) {
            for case in Case::ALL {
                for round in [RoundMode::TiesToEven, RoundMode::TiesAwayFromZero] {
                    let spec = QuantSpec::with(8, signed, symmetric, case.granularity(), kind)
                        .unwrap()
                        .with_round(round);
                    let fresh = || ObserverState::new(&spec, case.channels(), &ad).unwrap();
                    let (one, two) = (fresh(), fresh());
                    // Four updates (the fourth of an all-zero tensor), then a read without one.
                    for k in 0..5 {
                        let update = k < 4;
                        let what = format!("{name}, {case:?}, {round:?}, step {k} on {backend}");
                        let apart = fq_step(&ad, &two, &spec, (case, k), update, false).unwrap();
                        // A stored state (every kind but abs-max, which reads the weight as
                        // it is) is read without the tensor, in the same launch.
                        let fused = fq_step(&ad, &one, &spec, (case, k), update, true).unwrap();
                        assert_eq!(fused.launches + 1, apart.launches, "{what}: launches");
                        // A signed abs-max grid on the tensor itself clips nothing: its
                        // gradient passes without the masking launch.
                        let unmasked = kind == ObserverKind::AbsMax && signed;
                        assert_eq!(
                            fused.backward_launches + u64::from(unmasked),
                            apart.backward_launches,
                            "{what}: backward launches"
                        );
                        let moving = kind != ObserverKind::AbsMax && kind != ObserverKind::MinMax;
                        if moving && backend == "cuda" {
                            // Each kernel may contract a moving average's `a·r + b` on its own.
                            let close = |a: &[u32], b: &[u32]| {
                                assert_close(&[vec![a.to_vec()]], &[vec![b.to_vec()]], &what)
                            };
                            for (f, a) in fused.seen.iter().zip(&apart.seen) {
                                close(f, a);
                            }
                            continue;
                        }
                        assert_eq!(fused.seen, apart.seen, "{what}: grid and state");
                        assert_eq!(fused.out, apart.out, "{what}: output");
                        assert_eq!(fused.grad, apart.grad, "{what}: gradient");
                        checked += 1;
                    }
                }
            }
        }
    }
    // Per kind and case: four updates, and a read without one.
    let per_device = (kinds().len() + 1) * Case::ALL.len() * 2 * 5;
    if !devices().iter().any(|(b, _)| *b == "cuda") {
        assert_eq!(checked, cube_devices * per_device, "comparisons");
    }
}

/// Bytes of live allocations in `d`'s memory pool (`None` without a pool).
fn in_use(d: &Device) -> Option<u64> {
    d.memory_pool_usage().map(|u| u.bytes_in_use)
}

#[test]
fn a_per_tensor_fake_quantization_keeps_a_bit_per_element_for_its_gradient_not_its_input() {
    let _serial = serial();
    let n = 1 << 16;
    for (backend, d) in devices() {
        if !observe_available(&d, DType::F32) {
            continue;
        }
        let ad = d.autodiff();
        for (name, kind, signed, symmetric) in kinds() {
            let spec = QuantSpec::with(8, signed, symmetric, Granularity::PerTensor, kind).unwrap();
            let o = ObserverState::new(&spec, 1, &ad).unwrap();
            let what = format!("{name} on {backend}");
            let leaf = Tensor::<1>::from_floats(normal(n, 5).as_slice(), &ad).require_grad();
            // An intermediate: nothing but the fake quantization's backward could keep it.
            let x = leaf.clone().mul_scalar(2.0);
            let before = in_use(&ad).unwrap();
            let (out, _grid) = o.grid_and_fake_quant(&spec, &x, true, false).unwrap();
            drop(x);
            // What the step added, the output in place of the input: the grid, and the mask.
            let kept = in_use(&ad).unwrap().saturating_sub(before);
            let mask_bytes = 4 * n.div_ceil(32) as u64;
            if kind == ObserverKind::AbsMax {
                // Nothing clips: the gradient passes as it is, nothing kept for it.
                assert!(kept < mask_bytes, "{what}: {kept} bytes kept");
            } else {
                // A bit per element (a 32nd of the input), and the grid; not the input.
                assert!(kept >= mask_bytes, "{what}: {kept} bytes kept");
                assert!(kept < 2 * mask_bytes, "{what}: {kept} bytes kept");
            }
            let grad = leaf.grad(&out.sum().backward()).unwrap();
            // 2 where the element quantizes inside the range, else 0.
            assert!(vals(grad).iter().all(|g| *g == 2.0 || *g == 0.0), "{what}: gradient");
        }
    }
}

#[test]
fn past_the_shared_chunks_an_observer_still_quantizes_as_the_two_launches() {
    let _serial = serial();
    let ema = ObserverKind::MovingAverageMinMax { averaging_constant: 0.01 };
    let spec = QuantSpec::with(8, true, true, Granularity::PerTensor, ema).unwrap();
    for (backend, d) in devices() {
        if !observe_available(&d, DType::F32) {
            continue;
        }
        let ad = d.autodiff();
        assert!(Case::Huge.dims().iter().product::<usize>() > 1024 * CHUNK, "past the limit");
        let fresh = || ObserverState::new(&spec, 1, &ad).unwrap();
        let (one, two) = (fresh(), fresh());
        for k in 0..2 {
            let what = format!("step {k} on {backend}");
            let apart = fq_step(&ad, &two, &spec, (Case::Huge, k), true, false).unwrap();
            let fused = fq_step(&ad, &one, &spec, (Case::Huge, k), true, true).unwrap();
            // The chunks' extrema, the state and grid, the fake quantization.
            assert_eq!((fused.launches, apart.launches), (3, 3), "{what}: launches");
            if backend == "cuda" {
                continue; // Each kernel may contract the moving average on its own there.
            }
            assert_eq!(fused.seen, apart.seen, "{what}: grid and state");
            assert_eq!(fused.out, apart.out, "{what}: output");
            assert_eq!(fused.grad, apart.grad, "{what}: gradient");
        }
        // The stored state, read without the extrema: one launch, however long the rows.
        let apart = fq_step(&ad, &two, &spec, (Case::Huge, 2), false, false).unwrap();
        let fused = fq_step(&ad, &one, &spec, (Case::Huge, 2), false, true).unwrap();
        assert_eq!((fused.launches, apart.launches), (1, 2), "stored on {backend}: launches");
        assert_eq!(fused.seen, apart.seen, "stored on {backend}: grid and state");
        assert_eq!(fused.out, apart.out, "stored on {backend}: output");
        assert_eq!(fused.grad, apart.grad, "stored on {backend}: gradient");
    }
}

/// Biases and units that hit every case of the int32 rounding: exact ties, vanishing, zero and
/// negative units, quotients past ±2³¹, both signs.
fn bias_case() -> (Vec<f32>, Vec<f32>) {
    let mut b = Vec::new();
    let mut unit = Vec::new();
    for k in 0..64 {
        let s = 0.013 * (1.0 + k as f32 * 0.37) * if k % 3 == 0 { -1.0 } else { 1.0 };
        let v = match k % 8 {
            0 => (k as f32 - 31.5) * s.abs(), // a tie
            1 => 0.0,
            2 => -3.7e9 * s.abs(), // below −2³¹ units
            3 => 5.1e9 * s.abs(),  // above 2³¹ − 1 units
            _ => (k as f32 * 0.731).sin() * 40.0,
        };
        let s = match k % 16 {
            5 => 0.0,
            13 => 1e-31,
            _ => s,
        };
        b.push(v);
        unit.push(s);
    }
    (b, unit)
}

#[test]
fn the_bias_kernel_gives_the_expressions_values_and_gradient() {
    let _serial = serial();
    let (b, unit) = bias_case();
    let flex = Device::flex().autodiff();
    let backends = devices_and_division();
    for round in [RoundMode::TiesToEven, RoundMode::TiesAwayFromZero] {
        let run = |d: &Device, kernel: bool| {
            let bt = Tensor::<1>::from_floats(b.as_slice(), d).require_grad();
            let ut = Tensor::<1>::from_floats(unit.as_slice(), d);
            let out = quantize_bias_with(bt.clone(), ut, round, kernel);
            let up = Tensor::<1>::from_floats(unit.as_slice(), d);
            let grad = bt.grad(&out.clone().mul(up).sum().backward()).unwrap();
            (vals(out).iter().map(|v| v.to_bits()).collect::<Vec<_>>(), vals(grad))
        };
        let reference = run(&flex, false);
        assert_eq!(reference.1, unit, "{round:?}: the gradient passes straight through");
        for (backend, d, exact) in &backends {
            let (backend, exact) = (*backend, *exact);
            let d = d.clone().autodiff();
            let kernel = run(&d, true);
            if backend == "cuda" {
                // `q·s − b` may be one fused multiply-add there.
                for (x, y) in kernel.0.iter().zip(&reference.0) {
                    let (fx, fy) = (f32::from_bits(*x), f32::from_bits(*y));
                    assert!((fx - fy).abs() <= 1e-6 * fy.abs().max(1.0), "{fx} against {fy}");
                }
            } else {
                assert_eq!(
                    kernel.0,
                    run(&d, false).0,
                    "{backend} {round:?}: kernel and expressions"
                );
                if exact {
                    assert_eq!(kernel.0, reference.0, "{backend} {round:?}: against flex");
                } else {
                    // `b / unit` a few ulps off: a tie may round to the other neighbour.
                    for ((x, y), u) in kernel.0.iter().zip(&reference.0).zip(&unit) {
                        let (fx, fy) = (f32::from_bits(*x), f32::from_bits(*y));
                        let off = (fx - fy).abs();
                        assert!(
                            off <= 1e-6 * fy.abs().max(1.0) || off <= u.abs() * 1.000_01,
                            "{backend} {round:?}: {fx} against flex's {fy} (unit {u})"
                        );
                    }
                }
            }
            assert_eq!(kernel.1, reference.1, "{backend} {round:?}: gradient");
        }
    }
}

#[test]
fn the_rounded_bias_kernel_is_the_sum_of_the_bias_and_its_rounding_in_one_launch() {
    let _serial = serial();
    let (b, unit) = bias_case();
    let n = b.len();
    // A conv's `s_w,c` (the case's units, some vanishing), the input's `[1]` step, then the
    // BatchNorm's per-channel `w`; and the shorter products a pool (`[1]` step, `w`) and a
    // factorized reduction (`[C]` unit, `w`) take.
    let w: Vec<f32> = (0..n).map(|k| 0.4 + (k as f32 * 0.29).cos().abs() * 3.0).collect();
    for (backend, d, _) in devices_and_division() {
        let t = |v: &[f32]| Tensor::<1>::from_floats(v, &d);
        let cases: [(&str, Vec<Tensor<1>>); 3] = [
            ("conv", vec![t(&unit), t(&[0.37]), t(&w)]),
            ("pool", vec![t(&[0.021]), t(&w)]),
            ("reduce", vec![t(&unit)]),
        ];
        for (what, factors) in cases {
            let bt = t(&b);
            if !rounded_available(&bt, &factors) {
                continue;
            }
            for round in [RoundMode::TiesToEven, RoundMode::TiesAwayFromZero] {
                let product = factors.iter().cloned().reduce(|u, f| u.mul(f)).unwrap();
                let product = if product.dims()[0] == n { product } else { product.expand([n]) };
                let expected = vals(quantize_bias_with(bt.clone(), product, round, false));
                let ties_away = round == RoundMode::TiesAwayFromZero;
                let (got, launches) =
                    counted(&d, || vals(int32_rounded(bt.clone(), &factors, ties_away)));
                assert_eq!(launches, Some(1), "{backend} {what} {round:?}");
                // Bit for bit the expressions' `b + (b_q − b)` (on CUDA within a fused
                // multiply-add of `q·s − b`).
                let mut same = 0;
                for (k, (x, y)) in got.iter().zip(&expected).enumerate() {
                    same += usize::from(x.to_bits() == y.to_bits());
                    let off = (x - y).abs();
                    // A bias past the int32 range (`b_q` far from `b`): `b + (b_q − b)` is
                    // `b_q` within a rounding at `b`'s magnitude, and in one kernel a shader
                    // compiler may fold the sum (Mesa's lavapipe does: up to 56 off at
                    // |b| ≈ 1.3e9, `b_q` ≈ 1e8).
                    let clamped = matches!(k % 8, 2 | 3);
                    let bound = if clamped { 1.2e-7 * b[k].abs() } else { 0.0 };
                    let cuda = backend == "cuda" && off <= 1e-6 * y.abs().max(1.0);
                    assert!(
                        off <= bound || cuda,
                        "{backend} {what} {round:?} [{k}]: {x} against {y}"
                    );
                }
                eprintln!("{backend} {what} {round:?}: {same} of {n} bit for bit");
            }
        }
    }
}

#[test]
fn a_fixed_range_gives_torch_ao_grid_once_derived_and_then_without_launches() {
    let _serial = serial();
    // The mixing weights' observer: unsigned 8-bit affine over [0, 1] (torch.ao's
    // `FixedQParamsObserver` for a softmax: scale 1/255, zero point 0).
    let spec = QuantSpec::with(
        8,
        false,
        false,
        Granularity::PerTensor,
        ObserverKind::Fixed { min: 0.0, max: 1.0 },
    )
    .unwrap();
    // Asymmetric over [-0.5, 1.5], per channel: scale 2/255, zero point round(0.5·255/2) = 64.
    let wide = QuantSpec::with(
        8,
        false,
        false,
        Granularity::PerChannel { axis: 0 },
        ObserverKind::Fixed { min: -0.5, max: 1.5 },
    )
    .unwrap();
    for (backend, d) in devices() {
        let x = Tensor::<1>::from_floats([0.1, 0.7, 0.2, 0.0, 0.0, 0.0, 0.0, 0.0], &d);
        let o = ObserverState::new(&spec, 1, &d).unwrap();
        let first = o.grid(&spec, &x, true, false);
        assert_eq!(vals(first.step.clone()), [1.0 / 255.0], "{backend}");
        assert_eq!(vals(first.zero_point.clone()), [0.0], "{backend}");
        assert_eq!(vals(first.mult.clone()), [(1.0_f32 / 255.0).recip()], "{backend}");
        let (again, launches) = counted(&d, || o.grid(&spec, &x, true, false));
        assert_eq!(vals(again.step), [1.0 / 255.0], "{backend}");
        assert!(launches.is_none_or(|n| n == 0), "{backend}: {launches:?} launches");

        // Another channel count is another grid.
        let o = ObserverState::new(&wide, 3, &d).unwrap();
        let x3 = Tensor::<2>::zeros([3, 4], &d);
        let g = o.grid(&wide, &x3, false, false);
        assert_eq!(vals(g.step), [2.0 / 255.0; 3], "{backend}");
        assert_eq!(vals(g.zero_point), [64.0; 3], "{backend}");
        let x2 = Tensor::<2>::zeros([2, 4], &d);
        assert_eq!(vals(o.grid(&wide, &x2, false, false).zero_point), [64.0; 2], "{backend}");
    }
}

/// What a quantized sum gives: its value, the clamped integers, the in-range mask and each
/// operand's gradient, as bits; and its forward and backward launches (CubeCL only).
struct SumSeen {
    values: Vec<Vec<u32>>,
    launches: [Option<u64>; 2],
}

/// The quantized sum of `n` operands on `d` by the kernels (`fused`) or the expressions. The
/// operands are `scale`·normal draws (rounded to multiples of `1/quantum` when given: ties on
/// a grid of a power of two), every other one channels-last (strided); the upstream gradient
/// differs from element to element.
fn quantized_sum(
    d: &Device,
    n: usize,
    grid: &Grid,
    (scale, quantum): (f32, Option<f32>),
    fused: bool,
    seed: u64,
) -> SumSeen {
    let dims = [2, 3, 5, 4];
    let len = dims.iter().product::<usize>();
    let xs: Vec<Tensor<4>> = (0..n)
        .map(|k| {
            let v: Vec<f32> = normal(len, seed + k as u64)
                .iter()
                .map(|v| match quantum {
                    Some(q) => (v * scale * q).round() / q,
                    None => v * scale,
                })
                .collect();
            let x = Tensor::<1>::from_floats(v.as_slice(), d);
            if k % 2 == 1 {
                // Laid out [N, H, W, C]: a channels-last view of [N, C, H, W].
                x.reshape([2, 5, 4, 3]).permute([0, 3, 1, 2]).require_grad()
            } else {
                x.reshape(dims).require_grad()
            }
        })
        .collect();
    let up = Tensor::<1>::from_floats(normal(len, seed + 99).as_slice(), d).reshape(dims);
    let sum = xs.iter().cloned().reduce(|a, b| a.add(b)).unwrap();
    let sum_of = |integers| {
        if fused {
            fake_quant_sum_ste(&xs, &sum, grid, integers, FakeQuantImpl::Fused)
        } else {
            let (out, qz) = fake_quant_sum(&xs, &sum, grid);
            (out, Some(qz))
        }
    };
    let ((out, _), forward) = counted(d, || sum_of(false));
    let qz = sum_of(true).1.unwrap();
    // The launches of the product with the upstream gradient and the sum, alone, are taken
    // off the backward count.
    let alone = sum.clone().detach().require_grad();
    let (_, around) = counted(d, || alone.mul(up.clone()).sum().backward());
    let (grads, backward) = counted(d, || out.clone().mul(up).sum().backward());
    let backward = backward.zip(around).map(|(b, a)| b - a);
    let bits = |v: Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    let mut values = vec![bits(vals(out)), bits(vals(qz.q)), bits(vals(qz.in_range.float()))];
    values.extend(xs.iter().map(|x| bits(vals(x.grad(&grads).unwrap()))));
    SumSeen { values, launches: [forward, backward] }
}

#[test]
fn a_quantized_sum_by_its_kernels_is_the_expressions_in_one_launch_up_to_eight_operands() {
    let _serial = serial();
    let mut seed = 500;
    for (backend, d) in devices() {
        let d = d.autodiff();
        let cube = counted(&d, || ()).1.is_some();
        // One launch up to eight operands, one per operand past them.
        for n in [2, 3, 4, 5, 8, 9] {
            for per_channel in [false, true] {
                for round in [RoundMode::TiesToEven, RoundMode::TiesAwayFromZero] {
                    // A grid of powers of two on operands at multiples of 1/16 (ties
                    // everywhere), a grid of 0.05 on continuous operands; a range that clips.
                    for (operands, base) in [((1.0, Some(16.0)), 0.125), ((0.5, None), 0.05)] {
                        seed += 1;
                        let steps: Vec<f32> = if per_channel {
                            vec![base, base / 2.0, base * 2.0]
                        } else {
                            vec![base]
                        };
                        let step = Tensor::<1>::from_floats(steps.as_slice(), &d);
                        let zp = step.zeros_like().add_scalar(3.0);
                        let grid =
                            Grid::from_step(step, zp, (-20, 24), round, per_channel.then_some(1));
                        let what = format!(
                            "{backend}: {n} operands, per channel {per_channel}, {round:?}, \
                             operands {operands:?}"
                        );
                        let run = |fused| quantized_sum(&d, n, &grid, operands, fused, seed);
                        let (kernels, expressions) = (run(true), run(false));
                        let pairs = kernels.values.iter().zip(&expressions.values);
                        for (k, (a, b)) in pairs.enumerate() {
                            assert_eq!(a, b, "{what}: output {k} (value, integers, mask, ∂x_i)");
                        }
                        // Something was clipped and something was not.
                        let mask = &expressions.values[2];
                        let inside = mask.iter().filter(|&&m| m == 1.0f32.to_bits()).count();
                        assert!(inside > 0 && inside < mask.len(), "{what}: {inside} in range");
                        if cube {
                            let [f, b] = kernels.launches;
                            let want = if n <= ARITY { 1 } else { n as u64 };
                            assert_eq!(f, Some(want), "{what}: forward launches");
                            assert_eq!(b, Some(1), "{what}: backward launches");
                        }
                    }
                }
            }
        }
    }
}

/// A held quantizer's output `x·m + (a − x_w·m)` and gradient `∂out·m` as the expressions of
/// `qdarts_ops::quant::hold` compute them (the mask from the quantization of `x_w`), with the
/// values and gradient of `x` as bit patterns, and the launches of the backward of
/// `Σ out·upstream`.
fn held_by_expressions(
    x: Tensor<4>,
    x_w: Tensor<4>,
    at_w: Tensor<4>,
    grid: &Grid,
    upstream: Tensor<4>,
    leaf: &Tensor<1>,
) -> (Vec<u32>, Vec<u32>, Option<u64>) {
    let mask = quantize(x_w.clone(), grid).in_range.float();
    let offset = at_w.sub(x_w.mul(mask.clone()));
    let out = x.mul(mask).add(offset);
    let loss = out.clone().mul(upstream).sum();
    let (grads, launches) = counted(&loss.device(), || loss.backward());
    (bits_of(out), bits_of(leaf.grad(&grads).unwrap()), launches)
}

fn bits_of<const D: usize>(t: Tensor<D>) -> Vec<u32> {
    vals(t).iter().map(|v| v.to_bits()).collect()
}

/// Values on a grid of step `2^-4` and half-way between its levels (every rounding a tie),
/// past both ends of an 8-bit range (clipped) and continuous ones, with −0, ±∞ and NaN.
fn held_values(n: usize, seed: u64) -> Vec<f32> {
    let specials = [-0.0, 0.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 9.0, -9.0];
    normal(n, seed)
        .iter()
        .enumerate()
        .map(|(i, v)| match i % 5 {
            0 => (v * 64.0).round() / 32.0 / 2.0 + 1.0 / 32.0,
            1 => (v * 64.0).round() / 16.0,
            2 if i % 37 == 2 => specials[(i / 37) % specials.len()],
            _ => v * 4.0,
        })
        .collect()
}

#[test]
fn held_rounding_by_its_kernels_is_the_expressions_bit_for_bit_in_one_launch_each_way() {
    use qdarts_kernels::fake_quant::FusedLayout;
    use qdarts_kernels::hold::{held_fake_quant, hold_available};

    let _serial = serial();
    let mut checked = 0;
    for (backend, d) in devices() {
        if !hold_available(&d, DType::F32) {
            continue;
        }
        let ad = d.autodiff();
        for case in [Case::Weight, Case::Short, Case::ChannelsLast, Case::ChannelsLastPerChannel] {
            for round in [RoundMode::TiesToEven, RoundMode::TiesAwayFromZero] {
                for (signed, zp) in [(true, 0.0), (false, 128.0), (false, 3.0)] {
                    let what = format!("{case:?}, {round:?}, signed {signed} on {backend}");
                    let c = case.channels();
                    // Steps of powers of two per channel (ties stay ties), the zero point as given.
                    let steps: Vec<f32> = (0..c).map(|k| 2f32.powi(-4 + (k % 3) as i32)).collect();
                    let range = if signed { (-128, 127) } else { (0, 255) };
                    let grid = Grid::from_step(
                        Tensor::from_floats(steps.as_slice(), &ad),
                        Tensor::<1>::full([c], zp, &ad),
                        range,
                        round,
                        case.granularity().axis(),
                    );
                    let n: usize = case.dims().iter().product();
                    let host =
                        |seed| Tensor::<1>::from_floats(held_values(n, seed).as_slice(), &ad);
                    let x_w = case.arrange(host(5));
                    let at_w = fake_quant_fused(x_w.clone(), &grid);
                    let upstream = case.arrange(Tensor::from_floats(normal(n, 7).as_slice(), &ad));
                    // Each computation differentiates its own leaf (a backward consumes the graph).
                    let leaf = host(6).require_grad();
                    let expected = held_by_expressions(
                        case.arrange(leaf.clone()),
                        x_w.clone(),
                        at_w.clone(),
                        &grid,
                        upstream.clone(),
                        &leaf,
                    );
                    let leaf = host(6).require_grad();
                    let x = case.arrange(leaf.clone());
                    let ties_away = round == RoundMode::TiesAwayFromZero;
                    let layout =
                        FusedLayout::new(&x.dims(), grid.axis, range.0, range.1, ties_away);
                    let (out, forward) = counted(&ad, || {
                        held_fake_quant(x, x_w, at_w, &grid.mult, &grid.zero_point, layout)
                    });
                    let loss = out.clone().mul(upstream).sum();
                    let (grads, backward) = counted(&ad, || loss.backward());
                    assert_eq!(forward, Some(1), "{what}: forward launches");
                    // As many as the expressions' product by the mask: one.
                    assert_eq!(backward, expected.2, "{what}: backward launches");
                    assert_eq!(bits_of(out), expected.0, "{what}: output");
                    assert_eq!(bits_of(leaf.grad(&grads).unwrap()), expected.1, "{what}: gradient");
                    checked += 1;
                }
            }
        }
    }
    let cube = devices().iter().filter(|(_, d)| hold_available(d, DType::F32)).count();
    assert_eq!(checked, cube * 4 * 2 * 3, "comparisons");
}

#[test]
fn a_held_relu_gate_is_the_expressions_mask_bit_for_bit_in_one_launch_each_way() {
    use qdarts_kernels::hold::{gate, hold_available};

    let _serial = serial();
    for (backend, d) in devices() {
        if !hold_available(&d, DType::F32) {
            continue;
        }
        let ad = d.autodiff();
        for case in [Case::Short, Case::ChannelsLast] {
            let what = format!("{case:?} on {backend}");
            let n: usize = case.dims().iter().product();
            let host = |seed| Tensor::<1>::from_floats(held_values(n, seed).as_slice(), &ad);
            let key = case.arrange(host(8));
            let upstream = case.arrange(Tensor::from_floats(held_values(n, 10).as_slice(), &ad));
            let leaf = host(9).require_grad();
            let x = case.arrange(leaf.clone());
            let expected = x.mul(key.clone().greater_elem(0.0).float());
            let grads = expected.clone().mul(upstream.clone()).sum().backward();
            let expected_grad = bits_of(leaf.grad(&grads).unwrap());
            let leaf = host(9).require_grad();
            let x = case.arrange(leaf.clone());
            let (out, forward) = counted(&ad, || gate(x, key));
            let loss = out.clone().mul(upstream).sum();
            let (grads, _) = counted(&ad, || loss.backward());
            assert_eq!(forward, Some(1), "{what}: forward launches");
            assert_eq!(bits_of(out), bits_of(expected), "{what}: output");
            assert_eq!(bits_of(leaf.grad(&grads).unwrap()), expected_grad, "{what}: gradient");
        }
    }
}

/// The weight sites of [`many_sites_are_each_sites_forward_bit_for_bit`]: `(dims, spec)`, of
/// which the first eleven are per-channel abs-max (one launch per eight) and the last two are
/// not taken together (a min/max observer; a grid that clips).
fn many_sites() -> Vec<([usize; 4], QuantSpec)> {
    let per_channel = Granularity::PerChannel { axis: 0 };
    let abs_max =
        QuantSpec::with(8, true, true, per_channel, ObserverKind::ChannelWiseAbsMax).unwrap();
    let mut sites: Vec<([usize; 4], QuantSpec)> = (0..11)
        .map(|k| {
            let dims = match k % 3 {
                0 => [6 + k, 1, 3, 3],
                1 => [4 + k, 1, 5, 5],
                _ => [8 + k, 5, 1, 1],
            };
            let round = [RoundMode::TiesToEven, RoundMode::TiesAwayFromZero][k % 2];
            (dims, abs_max.with_round(round))
        })
        .collect();
    let ema = ObserverKind::MovingAverageMinMax { averaging_constant: 0.01 };
    sites.push(([5, 2, 3, 3], QuantSpec::with(8, true, true, per_channel, ema).unwrap()));
    let unsigned = QuantSpec::with(8, false, true, per_channel, ObserverKind::AbsMax).unwrap();
    sites.push(([3, 2, 3, 3], unsigned));
    sites
}

#[test]
fn many_sites_are_each_sites_forward_bit_for_bit() {
    use qdarts_ops::quant::{FakeQuantizer, TensorRole};

    let _serial = serial();
    for (backend, d) in devices() {
        let ad = d.clone().autodiff();
        let sites = many_sites();
        let make = |tag: &str| -> Vec<FakeQuantizer> {
            let each = sites.iter().enumerate();
            let quantizer = |(k, (dims, spec)): (usize, &([usize; 4], QuantSpec))| {
                let path = format!("{tag}.{k}");
                FakeQuantizer::new(*spec, path, TensorRole::Weight, dims[0], &ad).unwrap()
            };
            each.map(quantizer).collect()
        };
        let (one, many) = (make("one"), make("many"));
        // Two steps (the second from the first's state); every fourth weight strided.
        for step in 0..2u64 {
            let leaves: Vec<Tensor<4>> = sites
                .iter()
                .enumerate()
                .map(|(k, (dims, _))| {
                    let n = dims.iter().product();
                    let data = normal(n, 300 + 17 * step + k as u64);
                    Tensor::<1>::from_floats(data.as_slice(), &ad).reshape(*dims).require_grad()
                })
                .collect();
            // Square filters: the same shape, read through swapped strides.
            let input = |k: usize, w: &Tensor<4>| match k % 4 {
                3 => w.clone().swap_dims(2, 3),
                _ => w.clone(),
            };
            let run = |qs: &[FakeQuantizer], together: bool| {
                let xs: Vec<(&FakeQuantizer, Tensor<4>)> = qs
                    .iter()
                    .zip(&leaves)
                    .enumerate()
                    .map(|(k, (q, w))| (q, input(k, w)))
                    .collect();
                let (outs, launches) = counted(&ad, || match together {
                    true => FakeQuantizer::forward_many(xs, qdarts_ops::quant::QuantPass::OFF),
                    false => xs.into_iter().map(|(q, x)| q.forward_with_grid(x)).collect(),
                });
                let r = Tensor::<1>::from_floats(normal(4096, 77).as_slice(), &ad);
                let loss = outs.iter().fold(None::<Tensor<1>>, |acc, (out, _)| {
                    let n = out.dims().iter().product();
                    let term = out.clone().reshape([n]).mul(r.clone().narrow(0, 0, n)).sum();
                    Some(acc.map_or(term.clone(), |a| a.add(term)))
                });
                let grads = loss.unwrap().backward();
                let bits = |t: Tensor<4>| vals(t).iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                let seen: Vec<_> = outs
                    .into_iter()
                    .zip(qs)
                    .zip(&leaves)
                    .map(|(((out, grid), q), leaf)| {
                        let g = [grid.mult, grid.step, grid.zero_point].map(vals);
                        let st = state(q.observer.as_ref().unwrap());
                        (bits(out), bits(leaf.grad(&grads).unwrap()), g, st)
                    })
                    .collect();
                (seen, launches)
            };
            let (apart, apart_launches) = run(&one, false);
            let (together, launches) = run(&many, true);
            for (k, (a, t)) in apart.iter().zip(&together).enumerate() {
                let what = format!("site {k}, step {step} on {backend}");
                assert_eq!(t.0, a.0, "{what}: output");
                assert_eq!(t.1, a.1, "{what}: gradient");
                assert_eq!(t.2, a.2, "{what}: grid");
                assert_eq!(t.3, a.3, "{what}: observer state");
            }
            if observe_available(&d, DType::F32) {
                // Eleven sites in two launches; the last two one launch or more each.
                let (apart, together) = (apart_launches.unwrap(), launches.unwrap());
                assert_eq!(apart - together, 11 - 2, "{backend}: launches {apart} and {together}");
            }
        }
    }
}
