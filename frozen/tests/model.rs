//! The integer runtime against a naive reference (plain nested loops, exact integer math) on a
//! hand-built graph with every node kind, and the model loader under random damage.

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;

use common::tensor;

use proptest::prelude::*;
use qdarts_frozen::fixed::{FixedMultiplier, Rounding};
use qdarts_frozen::qdf::{DType, QTensor, QdfFile};
use qdarts_frozen::{ActGrid, ConvNode, FrozenModel, Graph, Node, PoolKind, Runtime};

const G8: ActGrid = ActGrid { scale: 0.05, zero_point: 3, qmin: -128, qmax: 127 };
const G8B: ActGrid = ActGrid { scale: 0.07, zero_point: -2, qmin: -128, qmax: 127 };
const G8C: ActGrid = ActGrid { scale: 0.035, zero_point: 0, qmin: -128, qmax: 127 };
const U8: ActGrid = ActGrid { scale: 0.04, zero_point: 120, qmin: 0, qmax: 255 };
const U8B: ActGrid = ActGrid { scale: 0.03, zero_point: 128, qmin: 0, qmax: 255 };

fn m(v: f64) -> FixedMultiplier {
    FixedMultiplier::new(v).unwrap()
}

/// A small graph: input (u8 grid) → conv 3×3 s1 → depthwise dilated conv with ReLU → max pool
/// s2 → conv 1×1 with input crop (offset 1) and stride 2 …, add, concat, zero, avg pool, GAP,
/// linear. Weights from `seed`; every rescale is the ratio of the scales it joins, as freeze
/// makes them.
fn model(seed: u64, rounding: Rounding) -> FrozenModel {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut next = move || {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (s >> 33) as i64
    };
    let mut tensors = BTreeMap::new();
    let mut conv = |name: &str,
                    (input, s_in): (usize, f32),
                    co: usize,
                    cig: usize,
                    k: [usize; 2],
                    stride: usize,
                    pad: usize,
                    dil: usize,
                    groups: usize,
                    offset: usize,
                    relu: bool,
                    out: ActGrid,
                    next: &mut dyn FnMut() -> i64| {
        let w: Vec<u8> =
            (0..co * cig * k[0] * k[1]).map(|_| (next() % 255 - 127) as i8 as u8).collect();
        let b: Vec<u8> =
            (0..co).flat_map(|_| ((next() % 20001 - 10000) as i32).to_le_bytes()).collect();
        let rescale: Vec<f64> =
            (0..co).map(|c| 0.0004 + 0.0003 * c as f64 + (next() % 100) as f64 * 1e-6).collect();
        // The accumulator unit is M·s_out; the weight step is the unit over the input step.
        let unit: Vec<f32> = rescale.iter().map(|r| (r * f64::from(out.scale)) as f32).collect();
        let wstep: Vec<f32> = unit.iter().map(|u| u / s_in).collect();
        let dims = [co as u32, cig as u32, k[0] as u32, k[1] as u32];
        let wname = format!("{name}.weight");
        tensors.insert(wname.clone(), tensor(&wname, DType::I8, &dims, wstep, w));
        let bname = format!("{name}.bias");
        tensors.insert(bname.clone(), tensor(&bname, DType::I32, &[co as u32], unit.clone(), b));
        let multipliers = unit.iter().map(|u| m(f64::from(*u) / f64::from(out.scale))).collect();
        Node::Conv(ConvNode {
            name: name.into(),
            input,
            relu,
            kernel: k,
            stride: [stride; 2],
            padding: [pad; 2],
            dilation: dil,
            groups,
            offset,
            multipliers,
            out,
            weight_bits: 8,
        })
    };
    let r = |a: ActGrid, b: ActGrid| m(f64::from(a.scale) / f64::from(b.scale));
    let nodes = vec![
        Node::Input { grid: U8 }, // 0: [2,10,10]
        conv("a", (0, U8.scale), 4, 2, [3, 3], 1, 1, 1, 1, 0, false, G8, &mut next), // 1: [4,10,10]
        conv("b", (1, G8.scale), 4, 1, [3, 3], 1, 2, 2, 4, 0, true, G8B, &mut next), // 2: depthwise dilated
        Node::Pool { input: 2, kind: PoolKind::Max, kernel: 3, stride: 2, padding: 1 }, // 3: [4,5,5]
        conv("c", (1, G8.scale), 2, 4, [1, 1], 2, 0, 1, 1, 0, true, U8, &mut next), // 4: [2,5,5]
        conv("d", (1, G8.scale), 2, 4, [1, 1], 2, 0, 1, 1, 1, true, U8B, &mut next), // 5: crop, [2,5,5]
        Node::Concat { inputs: vec![(4, r(U8, G8C)), (5, r(U8B, G8C))], out: G8C },  // 6: [4,5,5]
        Node::Zero { input: 1, stride: 2, out: G8 },                                 // 7: [4,5,5]
        Node::Add { inputs: vec![(3, r(G8B, U8)), (6, r(G8C, U8)), (7, r(G8, U8))], out: U8 }, // 8
        Node::Pool { input: 8, kind: PoolKind::Avg, kernel: 3, stride: 1, padding: 1 }, // 9
        conv("e", (9, U8.scale), 6, 2, [1, 3], 1, 1, 1, 2, 0, false, G8, &mut next), // 10: grouped 1×3, pad 1 → [6,7,5]
        Node::GlobalAvgPool { input: 10, multiplier: m(1.0 / 35.0), out: G8 },       // 11: [6]
    ];
    let mut nodes = nodes;
    let logit_scale = 0.001f32;
    let fc_rescale = [1.0f64, 1.5, 2.25];
    let fc_unit: Vec<f32> =
        fc_rescale.iter().map(|r| (r * f64::from(logit_scale)) as f32).collect();
    let w: Vec<u8> = (0..3 * 6).map(|_| (next() % 255 - 127) as i8 as u8).collect();
    let fc_w: Vec<f32> = fc_unit.iter().map(|u| u / G8.scale).collect();
    tensors.insert("fc.weight".into(), tensor("fc.weight", DType::I8, &[3, 6], fc_w, w));
    tensors.insert(
        "fc.bias".into(),
        tensor(
            "fc.bias",
            DType::I32,
            &[3],
            fc_unit.clone(),
            [5i32, -7, 100].iter().flat_map(|v| v.to_le_bytes()).collect(),
        ),
    );
    nodes.push(Node::Linear {
        name: "fc".into(),
        input: 11,
        multipliers: fc_unit.iter().map(|u| m(f64::from(*u) / f64::from(logit_scale))).collect(),
        logit_scale,
    });
    let genotype = qdarts_genotypes::known("DARTS_V2").unwrap();
    FrozenModel {
        genotype,
        graph: Graph {
            input_shape: [2, 10, 10],
            mean: vec![0.5; 2],
            std: vec![0.25; 2],
            classes: 3,
            rounding,
            nodes,
        },
        tensors,
    }
}

// ---- naive reference ----

type Val = (Vec<i64>, [usize; 3]); // q values (not shifted), shape

fn rq(x: i64, mult: FixedMultiplier, g: &ActGrid, r: Rounding) -> i64 {
    i64::from(mult.apply(x as i32, r).saturating_add(g.zero_point).clamp(g.qmin, g.qmax))
}

fn grid(model: &FrozenModel, v: usize) -> ActGrid {
    model.grid_of(v).unwrap()
}

fn reference(model: &FrozenModel, image: &[f32]) -> Vec<i32> {
    let r = model.graph.rounding;
    let t = |n: &str| &model.tensors[n];
    let ints = |t: &QTensor| -> Vec<i64> {
        match t.dtype {
            DType::I8 => t.data.iter().map(|&b| i64::from(b as i8)).collect(),
            _ => t
                .data
                .chunks(4)
                .map(|c| i64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                .collect(),
        }
    };
    let mut vals: Vec<Val> = Vec::new();
    let mut logits = vec![];
    for (i, node) in model.graph.nodes.iter().enumerate() {
        let v: Val = match node {
            Node::Input { grid: g } => {
                let q = image
                    .iter()
                    .map(|&x| {
                        let y = x / g.scale;
                        let y =
                            if r == Rounding::TiesToEven { y.round_ties_even() } else { y.round() };
                        (y as i64 + i64::from(g.zero_point))
                            .clamp(i64::from(g.qmin), i64::from(g.qmax))
                    })
                    .collect();
                (q, model.graph.input_shape)
            }
            Node::Conv(c) => {
                let (x, [ci, h, w]) = &vals[c.input];
                let z = i64::from(grid(model, c.input).zero_point);
                let wt = ints(t(&format!("{}.weight", c.name)));
                let bias = ints(t(&format!("{}.bias", c.name)));
                let co = c.multipliers.len();
                let (cig, cog) = (ci / c.groups, co / c.groups);
                let (hh, ww) = (h - c.offset, w - c.offset);
                let oh =
                    (hh + 2 * c.padding[0] - c.dilation * (c.kernel[0] - 1) - 1) / c.stride[0] + 1;
                let ow =
                    (ww + 2 * c.padding[1] - c.dilation * (c.kernel[1] - 1) - 1) / c.stride[1] + 1;
                let mut out = vec![];
                for o in 0..co {
                    for oy in 0..oh {
                        for ox in 0..ow {
                            let mut acc = bias[o];
                            for cl in 0..cig {
                                let ch = o / cog * cig + cl;
                                for ky in 0..c.kernel[0] {
                                    for kx in 0..c.kernel[1] {
                                        let y = (oy * c.stride[0] + ky * c.dilation) as i64
                                            - c.padding[0] as i64;
                                        let xx = (ox * c.stride[1] + kx * c.dilation) as i64
                                            - c.padding[1] as i64;
                                        if y < 0 || xx < 0 || y >= hh as i64 || xx >= ww as i64 {
                                            continue;
                                        }
                                        let q = x[(ch * h + y as usize + c.offset) * w
                                            + xx as usize
                                            + c.offset];
                                        let mut d = q - z;
                                        if c.relu {
                                            d = d.max(0);
                                        }
                                        acc += d * wt[((o * cig + cl) * c.kernel[0] + ky)
                                            * c.kernel[1]
                                            + kx];
                                    }
                                }
                            }
                            out.push(rq(acc, c.multipliers[o], &c.out, r));
                        }
                    }
                }
                (out, [co, oh, ow])
            }
            Node::Pool { input, kind, kernel, stride, padding } => {
                let (x, [c, h, w]) = &vals[*input];
                let z = i64::from(grid(model, *input).zero_point);
                let (oh, ow) = (
                    (h + 2 * padding - kernel) / stride + 1,
                    (w + 2 * padding - kernel) / stride + 1,
                );
                let mut out = vec![];
                for ch in 0..*c {
                    for oy in 0..oh {
                        for ox in 0..ow {
                            let mut win = vec![];
                            for ky in 0..*kernel {
                                for kx in 0..*kernel {
                                    let (y, xx) = (
                                        (oy * stride + ky) as i64 - *padding as i64,
                                        (ox * stride + kx) as i64 - *padding as i64,
                                    );
                                    if y >= 0 && xx >= 0 && y < *h as i64 && xx < *w as i64 {
                                        win.push(x[(ch * h + y as usize) * w + xx as usize]);
                                    }
                                }
                            }
                            out.push(match kind {
                                PoolKind::Max => *win.iter().max().unwrap(),
                                PoolKind::Avg => {
                                    let s: i64 = win.iter().map(|q| q - z).sum();
                                    let mean = s as f64 / win.len() as f64; // exact: small integers
                                    let q = if r == Rounding::TiesToEven {
                                        mean.round_ties_even()
                                    } else {
                                        mean.round()
                                    };
                                    q as i64 + z
                                }
                            });
                        }
                    }
                }
                (out, [*c, oh, ow])
            }
            Node::Add { inputs, out } => {
                let shape = vals[inputs[0].0].1;
                let mut acc = vec![0i64; vals[inputs[0].0].0.len()];
                for (v, mult) in inputs {
                    let z = i64::from(grid(model, *v).zero_point);
                    for (a, q) in acc.iter_mut().zip(&vals[*v].0) {
                        *a += i64::from(mult.apply((q - z) as i32, r));
                    }
                }
                (
                    acc.iter()
                        .map(|a| {
                            (a + i64::from(out.zero_point))
                                .clamp(i64::from(out.qmin), i64::from(out.qmax))
                        })
                        .collect(),
                    shape,
                )
            }
            Node::Concat { inputs, out } => {
                let mut q = vec![];
                let mut c = 0;
                for (v, mult) in inputs {
                    let z = i64::from(grid(model, *v).zero_point);
                    q.extend(vals[*v].0.iter().map(|x| rq(x - z, *mult, out, r)));
                    c += vals[*v].1[0];
                }
                let s = vals[inputs[0].0].1;
                (q, [c, s[1], s[2]])
            }
            Node::Zero { input, stride, out } => {
                let [c, h, w] = vals[*input].1;
                let s = [c, h.div_ceil(*stride), w.div_ceil(*stride)];
                (vec![i64::from(out.zero_point); s.iter().product()], s)
            }
            Node::GlobalAvgPool { input, multiplier, out } => {
                let (x, [c, h, w]) = &vals[*input];
                let z = i64::from(grid(model, *input).zero_point);
                let q = (0..*c)
                    .map(|ch| {
                        rq(
                            x[ch * h * w..(ch + 1) * h * w].iter().map(|q| q - z).sum(),
                            *multiplier,
                            out,
                            r,
                        )
                    })
                    .collect();
                (q, [*c, 0, 0])
            }
            Node::Linear { name, input, multipliers, .. } => {
                let (x, [k, _, _]) = &vals[*input];
                let z = i64::from(grid(model, *input).zero_point);
                let wt = ints(t(&format!("{name}.weight")));
                let b = ints(t(&format!("{name}.bias")));
                logits = multipliers
                    .iter()
                    .enumerate()
                    .map(|(o, mm)| {
                        let acc: i64 =
                            (0..*k).map(|j| wt[o * k + j] * (x[j] - z)).sum::<i64>() + b[o];
                        mm.apply(acc as i32, r)
                    })
                    .collect();
                (vec![], [0, 0, 0])
            }
        };
        let _ = i;
        vals.push(v);
    }
    logits
}

fn images(seed: u64, n: usize) -> Vec<f32> {
    // Noise around a per-image level, so that pooled features (and logits) differ.
    let mut s = seed | 1;
    (0..n * 200)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let level = ((i / 200) % 7) as f32 - 3.0;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0 + level
        })
        .collect()
}

#[test]
fn runtime_matches_the_naive_reference_on_every_node_kind() {
    for (seed, r) in
        [(1, Rounding::TiesToEven), (2, Rounding::TiesAwayFromZero), (3, Rounding::TiesToEven)]
    {
        let model = model(seed, r);
        let rt = Runtime::new(&model).unwrap();
        let imgs = images(seed, 12);
        let got = rt.run(&imgs, 3);
        for (i, img) in imgs.chunks(200).enumerate() {
            assert_eq!(
                &got[i * 3..i * 3 + 3],
                reference(&model, img).as_slice(),
                "seed {seed} image {i}"
            );
        }
        // Threads change nothing.
        assert_eq!(rt.run(&imgs, 1), got);
        // The values are not trivial: logits differ between images.
        assert!(got.chunks(3).any(|l| l != &got[0..3]), "{got:?}");
    }
}

#[test]
fn a_model_survives_its_file_round_trip() {
    let model = model(7, Rounding::TiesToEven);
    let bytes = model.to_qdf().unwrap().write().unwrap();
    let back = FrozenModel::from_qdf(QdfFile::read(&bytes).unwrap()).unwrap();
    assert_eq!(back, model);
}

#[test]
fn inconsistent_graphs_are_refused() {
    let base = model(7, Rounding::TiesToEven);
    let mut m = base.clone();
    if let Node::Conv(c) = &mut m.graph.nodes[1] {
        c.input = 5;
    }
    assert!(m.validate().unwrap_err().to_string().contains("not computed before"));
    let mut m = base.clone();
    m.tensors.remove("c.bias");
    assert!(m.validate().unwrap_err().to_string().contains("c.bias"));
    let mut m = base.clone();
    if let Node::Conv(c) = &mut m.graph.nodes[1] {
        c.kernel = [30, 30];
    }
    assert!(m.validate().unwrap_err().to_string().contains("does not fit"));
    let mut m = base.clone();
    if let Node::Add { out, .. } = &mut m.graph.nodes[8] {
        out.qmax = 300;
    }
    assert!(m.validate().unwrap_err().to_string().contains("8 bits"));
    let mut m = base.clone();
    m.graph.nodes.pop();
    assert!(m.validate().unwrap_err().to_string().contains("classifier"));
    // Narrower weights: the conv's int8 weights must fit its `weight_bits`.
    let mut m = base.clone();
    if let Node::Conv(c) = &mut m.graph.nodes[1] {
        c.weight_bits = 4;
    }
    let err = m.validate().unwrap_err().to_string();
    assert!(err.contains("does not fit 4 bits"), "{err}");
    let mut m = base.clone();
    if let Node::Conv(c) = &mut m.graph.nodes[1] {
        c.weight_bits = 9;
    }
    assert!(m.validate().unwrap_err().to_string().contains("weight bits"));
    let mut m = base.clone();
    let name = match &mut m.graph.nodes[1] {
        Node::Conv(c) => {
            c.weight_bits = 4;
            c.name.clone()
        }
        _ => unreachable!(),
    };
    let w = m.tensors.get_mut(&format!("{name}.weight")).unwrap();
    w.data.iter_mut().for_each(|b| *b = ((*b as i8) % 8) as u8);
    m.validate().unwrap();
    let macs = m.macs().unwrap();
    assert_eq!(macs[0].1, 4, "BitOPs count the conv at 4 bits");
    // A rescale that disagrees with the scales it joins (an edited shift: n = −5).
    let mut m = base.clone();
    if let Node::Conv(c) = &mut m.graph.nodes[1] {
        c.multipliers[0].n = -5;
    }
    let err = m.validate().unwrap_err().to_string();
    assert!(err.contains("channel 0") && err.contains("scales it joins"), "{err}");
    let mut m = base;
    if let Node::Add { inputs, .. } = &mut m.graph.nodes[8] {
        inputs[1].1 = FixedMultiplier { m0: inputs[1].1.m0, n: inputs[1].1.n + 1 };
    }
    assert!(m.validate().unwrap_err().to_string().contains("operand 6"));
}

fn reseal(mut bytes: Vec<u8>) -> Vec<u8> {
    let n = bytes.len() - 8;
    let h = bytes[..n]
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    bytes[n..].copy_from_slice(&h.to_le_bytes());
    bytes
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 300,
        // Seeded: the same cases every run (CI must not fail by chance).
        rng_seed: proptest::test_runner::RngSeed::Fixed(103),
        ..ProptestConfig::default()
    })]

    /// Random truncations and byte flips (checksum resealed, so that the damage reaches the
    /// graph and the tensors): an error or a model that validates and runs, never a panic.
    #[test]
    fn damaged_model_files_are_refused_or_run(cut in 0usize..100_000, flips in proptest::collection::vec((0usize..100_000, 1u8..=255), 1..4), truncate in any::<bool>()) {
        let model = model(9, Rounding::TiesToEven);
        let mut bytes = model.to_qdf().unwrap().write().unwrap();
        if truncate {
            bytes.truncate(cut % bytes.len());
        } else {
            let n = bytes.len() - 8;
            for (at, x) in flips {
                bytes[at % n] ^= x;
            }
            bytes = reseal(bytes);
        }
        if let Ok(file) = QdfFile::read(&bytes)
            && let Ok(m) = FrozenModel::from_qdf(file)
        {
            let rt = Runtime::new(&m).unwrap();
            let len = rt.input_len();
            let _ = rt.run(&vec![0.5; len], 1);
        }
    }
}
