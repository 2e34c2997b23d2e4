//! The fast convolution kernel against the direct one: every intermediate value of random
//! convolutions (kernel, stride, dilation, padding, crop, groups, depthwise, ReLU, signed and
//! unsigned grids, flipped channels holding −128, both roundings) and of random max and average
//! poolings must be the same integers.

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;

use common::tensor;

use proptest::prelude::*;
use qdarts_frozen::fixed::{FixedMultiplier, Rounding};
use qdarts_frozen::qdf::DType;
use qdarts_frozen::runtime::Kernels;
use qdarts_frozen::{ActGrid, ConvNode, FrozenModel, Graph, Node, PoolKind, Runtime};

/// One convolution's parameters.
#[derive(Debug, Clone)]
struct Case {
    ci: usize,
    co: usize,
    groups: usize,
    kernel: [usize; 2],
    stride: [usize; 2],
    dilation: usize,
    padding: [usize; 2],
    offset: usize,
    relu: bool,
    h: usize,
    w: usize,
    input: ActGrid,
    out: ActGrid,
    rounding: Rounding,
    seed: u64,
}

fn grid() -> impl Strategy<Value = ActGrid> {
    (any::<bool>(), 0i32..256, 0.01f32..0.2).prop_map(|(unsigned, z, scale)| {
        if unsigned {
            ActGrid { scale, zero_point: z, qmin: 0, qmax: 255 }
        } else {
            ActGrid { scale, zero_point: z - 128, qmin: -128, qmax: 127 }
        }
    })
}

fn case() -> impl Strategy<Value = Case> {
    (
        (0usize..3, 1usize..5, 1usize..4),
        ([1usize..6, 1usize..6], [1usize..4, 1usize..4], 1usize..4, [0usize..4, 0usize..4]),
        (0usize..2, any::<bool>(), 0usize..9, 0usize..9),
        (grid(), grid(), any::<bool>(), any::<u64>()),
    )
        .prop_map(
            |(
                (kind, a, b),
                (kernel, stride, dilation, padding),
                (offset, relu, eh, ew),
                (input, out, even, seed),
            )| {
                // kind 0: dense, 1: depthwise, 2: grouped.
                let (ci, co, groups) = match kind {
                    0 => (a, b * 3, 1),
                    1 => (a * 2, a * 2, a * 2),
                    _ => (2 * a, 2 * b, 2),
                };
                let need =
                    |k: usize, p: usize| (dilation * (k - 1) + 1).saturating_sub(2 * p).max(1);
                Case {
                    ci,
                    co,
                    groups,
                    kernel,
                    stride,
                    dilation,
                    padding,
                    offset,
                    relu,
                    h: need(kernel[0], padding[0]) + offset + eh,
                    w: need(kernel[1], padding[1]) + offset + ew,
                    input,
                    out,
                    rounding: if even { Rounding::TiesToEven } else { Rounding::TiesAwayFromZero },
                    seed,
                }
            },
        )
}

/// Input → the case's convolution → global average → a one-class classifier.
fn model(c: &Case) -> FrozenModel {
    let mut s = c.seed | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let cig = c.ci / c.groups;
    let n = c.co * cig * c.kernel[0] * c.kernel[1];
    // Every int8 weight, −128 included; every third channel flipped (negative scale).
    let w: Vec<u8> = (0..n).map(|_| next() as u8).collect();
    let b: Vec<u8> =
        (0..c.co).flat_map(|_| ((next() % 40001) as i32 - 20000).to_le_bytes()).collect();
    let unit: Vec<f32> =
        (0..c.co).map(|_| c.out.scale * (1e-4 + (next() % 3000) as f32 * 1e-6)).collect();
    let wstep: Vec<f32> = unit
        .iter()
        .enumerate()
        .map(|(ch, u)| if ch % 3 == 2 { -u / c.input.scale } else { u / c.input.scale })
        .collect();
    let dims = [c.co as u32, cig as u32, c.kernel[0] as u32, c.kernel[1] as u32];
    let mut tensors = BTreeMap::new();
    tensors.insert("conv.weight".into(), tensor("conv.weight", DType::I8, &dims, wstep, w));
    tensors.insert(
        "conv.bias".into(),
        tensor("conv.bias", DType::I32, &[c.co as u32], unit.clone(), b),
    );
    let multipliers = unit
        .iter()
        .map(|u| FixedMultiplier::new(f64::from(*u) / f64::from(c.out.scale)).unwrap())
        .collect();
    let conv = Node::Conv(ConvNode {
        name: "conv".into(),
        input: 0,
        relu: c.relu,
        kernel: c.kernel,
        stride: c.stride,
        padding: c.padding,
        dilation: c.dilation,
        groups: c.groups,
        offset: c.offset,
        multipliers,
        out: c.out,
        weight_bits: 8,
    });
    let graph = Graph {
        input_shape: [c.ci, c.h, c.w],
        mean: vec![0.0; c.ci],
        std: vec![1.0; c.ci],
        classes: 1,
        rounding: c.rounding,
        nodes: vec![Node::Input { grid: c.input }, conv],
    };
    let mut model =
        FrozenModel { genotype: qdarts_genotypes::known("DARTS_V2").unwrap(), graph, tensors };
    let out_len = |n: usize, k: usize, p: usize, st: usize| {
        (n - c.offset + 2 * p - (c.dilation * (k - 1) + 1)) / st + 1
    };
    let oh = out_len(c.h, c.kernel[0], c.padding[0], c.stride[0]);
    let ow = out_len(c.w, c.kernel[1], c.padding[1], c.stride[1]);
    let gap = FixedMultiplier::new(1.0 / (oh * ow) as f64).unwrap();
    model.graph.nodes.push(Node::GlobalAvgPool { input: 1, multiplier: gap, out: c.out });
    model.tensors.insert(
        "fc.weight".into(),
        tensor("fc.weight", DType::I8, &[1, c.co as u32], vec![1.0], vec![1; c.co]),
    );
    model
        .tensors
        .insert("fc.bias".into(), tensor("fc.bias", DType::I32, &[1], vec![1.0], vec![0; 4]));
    model.graph.nodes.push(Node::Linear {
        name: "fc".into(),
        input: 2,
        multipliers: vec![FixedMultiplier::new(1.0).unwrap()],
        logit_scale: 1.0,
    });
    model.validate().map_err(|e| format!("{c:?}: {e}")).unwrap();
    model
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 300,
        // Seeded: the same cases every run (CI must not fail by chance).
        rng_seed: proptest::test_runner::RngSeed::Fixed(2011),
        ..ProptestConfig::default()
    })]

    #[test]
    fn fast_convolution_equals_the_direct_one(c in case()) {
        let model = model(&c);
        let fast = Runtime::with_kernels(&model, Kernels::Fast).unwrap();
        let direct = Runtime::with_kernels(&model, Kernels::Direct).unwrap();
        let len = fast.input_len();
        let mut s = c.seed.rotate_left(17) | 1;
        for _ in 0..2 {
            // Spread over the whole input grid and past it (clamped).
            let image: Vec<f32> = (0..len)
                .map(|_| {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 300.0 * c.input.scale
                })
                .collect();
            let (lf, vf) = fast.run_image_values(&image);
            let (ld, vd) = direct.run_image_values(&image);
            prop_assert_eq!(&vf[1], &vd[1], "conv output differs");
            prop_assert_eq!(lf, ld);
        }
    }
}

/// `nodes` (the input first, the value under test last, `features` channels of `hw`
/// positions on grid `g`) → global average → a one-class classifier.
fn classified(
    mut nodes: Vec<Node>,
    [features, hw]: [usize; 2],
    g: ActGrid,
    input_shape: [usize; 3],
    rounding: Rounding,
) -> FrozenModel {
    let last = nodes.len() - 1;
    let gap = FixedMultiplier::new(1.0 / hw as f64).unwrap();
    nodes.push(Node::GlobalAvgPool { input: last, multiplier: gap, out: g });
    nodes.push(Node::Linear {
        name: "fc".into(),
        input: last + 1,
        multipliers: vec![FixedMultiplier::new(1.0).unwrap()],
        logit_scale: 1.0,
    });
    let mut tensors = BTreeMap::new();
    let n = features as u32;
    tensors.insert(
        "fc.weight".into(),
        tensor("fc.weight", DType::I8, &[1, n], vec![1.0], vec![1; features]),
    );
    tensors.insert("fc.bias".into(), tensor("fc.bias", DType::I32, &[1], vec![1.0], vec![0; 4]));
    let c = input_shape[0];
    let graph =
        Graph { input_shape, mean: vec![0.0; c], std: vec![1.0; c], classes: 1, rounding, nodes };
    FrozenModel { genotype: qdarts_genotypes::known("DARTS_V2").unwrap(), graph, tensors }
}

/// Every value of one image on the fast and on the direct kernels: the image spreads over
/// the whole input grid (`scale`) and past it (clamped).
fn fast_and_direct(model: &FrozenModel, seed: u64, scale: f32) -> (Vec<Vec<i8>>, Vec<Vec<i8>>) {
    model.validate().unwrap();
    let fast = Runtime::with_kernels(model, Kernels::Fast).unwrap();
    let direct = Runtime::with_kernels(model, Kernels::Direct).unwrap();
    let mut st = seed | 1;
    let image: Vec<f32> = (0..fast.input_len())
        .map(|_| {
            st ^= st << 13;
            st ^= st >> 7;
            st ^= st << 17;
            ((st >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 300.0 * scale
        })
        .collect();
    (fast.run_image_values(&image).1, direct.run_image_values(&image).1)
}

/// Input → pooling → global average → a one-class classifier.
fn pool_model(
    kind: PoolKind,
    [k, s, p]: [usize; 3],
    [c, h, w]: [usize; 3],
    g: ActGrid,
    rounding: Rounding,
) -> FrozenModel {
    let [oh, ow] = [(h + 2 * p - k) / s + 1, (w + 2 * p - k) / s + 1];
    let nodes = vec![
        Node::Input { grid: g },
        Node::Pool { input: 0, kind, kernel: k, stride: s, padding: p },
    ];
    classified(nodes, [c, oh * ow], g, [c, h, w], rounding)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 300,
        rng_seed: proptest::test_runner::RngSeed::Fixed(2012),
        ..ProptestConfig::default()
    })]

    #[test]
    fn fast_pooling_equals_the_direct_one(
        max in any::<bool>(),
        k in 1usize..6,
        s in 1usize..4,
        pad in 0usize..3,
        (c, h, w) in (1usize..4, 1usize..12, 1usize..12),
        g in grid(),
        even in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let p = pad.min(k / 2);
        prop_assume!(h + 2 * p >= k && w + 2 * p >= k);
        let kind = if max { PoolKind::Max } else { PoolKind::Avg };
        let r = if even { Rounding::TiesToEven } else { Rounding::TiesAwayFromZero };
        let model = pool_model(kind, [k, s, p], [c, h, w], g, r);
        let (vf, vd) = fast_and_direct(&model, seed, g.scale);
        prop_assert_eq!(&vf[1], &vd[1], "pool output differs");
    }
}

/// Input → sum of the input with itself → concatenation of the input and the sum → global
/// average → a one-class classifier: the fast kernels' tables against the direct arithmetic.
fn sum_model(
    [g, sum, cat]: [ActGrid; 3],
    operands: usize,
    [c, h, w]: [usize; 3],
    rounding: Rounding,
) -> FrozenModel {
    let m = |from: ActGrid, to: ActGrid| {
        FixedMultiplier::new(f64::from(from.scale) / f64::from(to.scale)).unwrap()
    };
    let nodes = vec![
        Node::Input { grid: g },
        Node::Add { inputs: vec![(0, m(g, sum)); operands], out: sum },
        Node::Concat { inputs: vec![(0, m(g, cat)), (1, m(sum, cat))], out: cat },
    ];
    classified(nodes, [2 * c, h * w], cat, [c, h, w], rounding)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 200,
        rng_seed: proptest::test_runner::RngSeed::Fixed(2013),
        ..ProptestConfig::default()
    })]

    #[test]
    fn fast_sums_and_concatenations_equal_the_direct_ones(
        grids in (grid(), grid(), grid()),
        operands in 1usize..4,
        (c, h, w) in (1usize..4, 1usize..12, 1usize..12),
        even in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let (g, sum, cat) = grids;
        let r = if even { Rounding::TiesToEven } else { Rounding::TiesAwayFromZero };
        let model = sum_model([g, sum, cat], operands, [c, h, w], r);
        let (vf, vd) = fast_and_direct(&model, seed, g.scale);
        prop_assert_eq!(&vf[1], &vd[1], "sum differs");
        prop_assert_eq!(&vf[2], &vd[2], "concatenation differs");
    }
}
