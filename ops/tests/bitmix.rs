//! EdMIPS' composite convolution against the explicit weighted sum of per-bit convolutions, the
//! per-width quantizers' grids, and the cost and its gradient against central differences.

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use burn::tensor::activation::softmax;
use burn::tensor::module::conv2d;
use burn::tensor::ops::ConvOptions;
use burn::tensor::{Device, Distribution, Tensor};
use qdarts_ops::cost::{Penalty, expected_cost};
use qdarts_ops::quant::{BitMix, Granularity, ObserverKind, QuantPass, QuantSpec, TensorRole};

fn vals<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
}

fn weight_spec() -> QuantSpec {
    QuantSpec::with(
        8,
        true,
        true,
        Granularity::PerChannel { axis: 0 },
        ObserverKind::ChannelWiseAbsMax,
    )
    .unwrap()
}

fn conv(x: Tensor<4>, w: Tensor<4>) -> Tensor<4> {
    conv2d(x, w, None, ConvOptions::new([1, 1], [1, 1], [1, 1], 1))
}

#[test]
fn the_composite_convolution_is_the_weighted_sum_of_the_per_bit_convolutions() {
    let d = Device::flex();
    let (w, x, logits) = qdarts_ops::seeded(&d, 4, || {
        (
            Tensor::<4>::random([6, 3, 3, 3], Distribution::Normal(0.0, 1.0), &d),
            Tensor::<4>::random([2, 3, 8, 8], Distribution::Normal(0.0, 1.0), &d),
            Tensor::<1>::random([3], Distribution::Normal(0.0, 1.0), &d),
        )
    });
    let mix = BitMix::new(weight_spec(), &[2, 4, 8], "e.conv", TensorRole::Weight, 6, &d).unwrap();
    let p = softmax(logits, 0);
    let composite = conv(x.clone(), mix.forward(w.clone(), p.clone(), QuantPass::OFF));
    let pv = vals(p.clone());
    let explicit = mix
        .quantizers
        .iter()
        .zip(&pv)
        .map(|(q, &p)| conv(x.clone(), q.forward(w.clone())).mul_scalar(p))
        .reduce(|a, b| a.add(b))
        .unwrap();
    let diff = vals(composite.sub(explicit).abs().max())[0];
    assert!(diff < 1e-4, "{diff}");
    // Each width's quantizer puts every output channel on its own grid of at most 2^b − 1
    // symmetric levels.
    for (q, b) in mix.quantizers.iter().zip([2u32, 4, 8]) {
        let qw = vals(q.forward(w.clone()));
        for ch in qw.chunks(27) {
            let mut levels: Vec<i64> = ch.iter().map(|v| (v * 1e5).round() as i64).collect();
            levels.sort_unstable();
            levels.dedup();
            // At most 2^b − 1 levels.
            assert!(levels.len() < (1usize << b), "{b} bits: {} levels", levels.len());
        }
    }
    // One-hot probabilities pick that width's quantized weight.
    let one = Tensor::<1>::from_floats([0.0, 1.0, 0.0], &d);
    let picked = vals(mix.forward(w.clone(), one, QuantPass::OFF));
    assert_eq!(picked, vals(mix.quantizers[1].forward(w)));
    assert!(
        (vals(mix.expected_bits(p))[0] - (2.0 * pv[0] + 4.0 * pv[1] + 8.0 * pv[2])).abs() < 1e-5
    );
}

/// Three sites' mixes stacked (a stacked quantizer per width, a row per site): with each row's
/// own probabilities, the sites' own mixes side by side, bit for bit; each width's observer
/// state written back into each site is the state the site's own mix reached.
#[test]
fn a_stacked_mix_is_each_site_s_mix_with_its_own_probabilities() {
    let d = Device::flex();
    let normal = Distribution::Normal(0.0, 1.0);
    let (ws, logits) = qdarts_ops::seeded(&d, 9, || {
        let ws: Vec<Tensor<4>> = (0..3).map(|_| Tensor::random([4, 2, 3, 3], normal, &d)).collect();
        (ws, Tensor::<2>::random([3, 3], normal, &d))
    });
    let site = |i: usize| {
        let path = format!("e{i}.conv");
        BitMix::new(weight_spec(), &[2, 4, 8], &path, TensorRole::Weight, 4, &d).unwrap()
    };
    let sites: Vec<BitMix> = (0..3).map(site).collect();
    let stacked = BitMix::stacked(&sites.iter().collect::<Vec<_>>(), "stack").unwrap();
    let p = softmax(logits, 1);
    // Two steps: the observers move (the second on doubled weights).
    for step in 0..2 {
        let scale = 1.0 + step as f32;
        let own: Vec<Tensor<4>> = sites
            .iter()
            .zip(&ws)
            .enumerate()
            .map(|(r, (m, w))| {
                let row = p.clone().slice([r..r + 1, 0..3]).reshape([3]);
                m.forward(w.clone().mul_scalar(scale), row, QuantPass::OFF)
            })
            .collect();
        let columns = (0..3).map(|i| p.clone().slice([0..3, i..i + 1]).reshape([3])).collect();
        let all = Tensor::cat(ws.clone(), 0).mul_scalar(scale);
        let mixed = stacked.forward_rows(all, columns, [1, 3, 4 * 2 * 3 * 3], QuantPass::OFF);
        assert_eq!(vals(mixed), vals(Tensor::cat(own, 0)), "step {step}");
    }
    let fresh: Vec<BitMix> = (0..3).map(site).collect();
    for (r, (to, reached)) in fresh.iter().zip(&sites).enumerate() {
        stacked.row_into(r, to);
        for (a, b) in to.quantizers.iter().zip(&reached.quantizers) {
            let (ga, gb) = (a.current_grid(&d), b.current_grid(&d));
            assert_eq!(vals(ga.step), vals(gb.step), "row {r}: {}", a.path());
        }
    }
    // Sites of other widths do not stack.
    let other = BitMix::new(weight_spec(), &[4, 8], "o", TensorRole::Weight, 4, &d).unwrap();
    assert!(BitMix::stacked(&[&sites[0], &other], "bad").is_err());
}

#[test]
fn bit_choices_must_be_distinct_widths_from_2_to_8() {
    let d = Device::flex();
    for bits in [&[][..], &[4, 4], &[1, 8], &[4, 16]] {
        assert!(
            BitMix::new(weight_spec(), bits, "e", TensorRole::Weight, 6, &d).is_err(),
            "{bits:?}"
        );
    }
}

/// `f` at `x` with `x[i] ± h`: the central difference.
fn central(f: &dyn Fn(&[f32]) -> f64, x: &[f32], i: usize, h: f32) -> f64 {
    let (mut up, mut down) = (x.to_vec(), x.to_vec());
    up[i] += h;
    down[i] -= h;
    (f(&up) - f(&down)) / f64::from(2.0 * h)
}

#[test]
fn the_expected_bitops_gradient_matches_central_differences() {
    // 3 edges × 4 ops, 3 weight widths and 2 activation widths per op.
    let (e, k) = (3usize, 4usize);
    let macs: Vec<f32> = (0..e * k).map(|i| [0.0, 0.0, 2.0, 5.0][i % k] + i as f32 * 0.1).collect();
    let wb = [2.0f32, 4.0, 8.0];
    let ab = [4.0f32, 8.0];
    let n_alpha = e * k;
    let n_w = e * k * 3;
    let n_a = e * k * 2;
    let cost = |theta: &[f32], d: &Device| -> Tensor<1> {
        let alpha = Tensor::<1>::from_floats(&theta[..n_alpha], d).reshape([e, k]);
        let gw = Tensor::<1>::from_floats(&theta[n_alpha..n_alpha + n_w], d).reshape([e * k, 3]);
        let ga = Tensor::<1>::from_floats(&theta[n_alpha + n_w..], d).reshape([e * k, 2]);
        let ew = softmax(gw, 1).mul(Tensor::<1>::from_floats(wb, d).reshape([1, 3])).sum_dim(1);
        let ea = softmax(ga, 1).mul(Tensor::<1>::from_floats(ab, d).reshape([1, 2])).sum_dim(1);
        let per = Tensor::<1>::from_floats(macs.as_slice(), d).reshape([e, k]);
        expected_cost(softmax(alpha, 1), per, ew.reshape([e, k]), Some(ea.reshape([e, k])))
    };
    let d = Device::flex().autodiff();
    let theta: Vec<f32> = qdarts_ops::seeded(&Device::flex(), 9, || {
        vals(Tensor::<1>::random(
            [n_alpha + n_w + n_a],
            Distribution::Normal(0.0, 1.0),
            &Device::flex(),
        ))
    });
    let t = Tensor::<1>::from_floats(theta.as_slice(), &d).require_grad();
    // The same cost as a function of one tracked vector.
    let alpha = t.clone().slice(0..n_alpha).reshape([e, k]);
    let gw = t.clone().slice(n_alpha..n_alpha + n_w).reshape([e * k, 3]);
    let ga = t.clone().slice(n_alpha + n_w..n_alpha + n_w + n_a).reshape([e * k, 2]);
    let ew = softmax(gw, 1).mul(Tensor::<1>::from_floats(wb, &d).reshape([1, 3])).sum_dim(1);
    let ea = softmax(ga, 1).mul(Tensor::<1>::from_floats(ab, &d).reshape([1, 2])).sum_dim(1);
    let per = Tensor::<1>::from_floats(macs.as_slice(), &d).reshape([e, k]);
    let c = expected_cost(softmax(alpha, 1), per, ew.reshape([e, k]), Some(ea.reshape([e, k])));
    let grads = c.backward();
    let g = vals(t.grad(&grads).unwrap());
    let f = |th: &[f32]| f64::from(vals(cost(th, &Device::flex()))[0]);
    for (i, gi) in g.iter().enumerate() {
        let fd = central(&f, &theta, i, 1e-2);
        assert!((fd - f64::from(*gi)).abs() < 2e-2 + 1e-2 * fd.abs(), "θ[{i}]: {gi} vs {fd}");
    }
    assert!(g.iter().filter(|v| v.abs() > 1e-3).count() > theta.len() / 2);
}

#[test]
fn the_expected_cost_weighs_each_op_by_its_probability_and_expected_bits() {
    let d = Device::flex();
    let t = |v: [f32; 2]| Tensor::<1>::from_floats(v, &d).reshape([1, 2]);
    // 0.25·4 MACs·2·8 + 0.75·8 MACs·8·4 = 16 + 192.
    let bitops = expected_cost(t([0.25, 0.75]), t([4.0, 8.0]), t([2.0, 8.0]), Some(t([8.0, 4.0])));
    assert!((vals(bitops)[0] - 208.0).abs() < 1e-4);
    // Size: weights × weight bits only (bits, not bytes: divide by 8 for bytes).
    let size = expected_cost(t([0.25, 0.75]), t([10.0, 0.0]), t([4.0, 8.0]), None);
    assert!((vals(size)[0] - 10.0).abs() < 1e-5);
}

#[test]
fn the_hinge_penalty_is_zero_under_the_target_and_linear_over_it() {
    let d = Device::flex();
    let p = Penalty::Hinge { target: 100.0, weight: 0.5 };
    let at = |c: f32| vals(p.of(Tensor::<1>::from_floats([c], &d)))[0];
    assert_eq!(at(80.0), 0.0);
    assert_eq!(at(100.0), 0.0);
    assert!((at(150.0) - 0.25).abs() < 1e-6);
    assert!((at(300.0) - 1.0).abs() < 1e-6);
    let log = Penalty::Log { weight: 2.0 };
    let v = vals(log.of(Tensor::<1>::from_floats([std::f32::consts::E], &d)))[0];
    assert!((v - 2.0).abs() < 1e-5);
}

/// A searched site whose bit softmax puts all its weight on one width is the site built at
/// that width: a conv's weights (same values, same quantized conv) and an activation
/// quantizer; and a whole searched op at a one-hot width is the op at that width where no
/// bias is folded (FactorizedReduce on a float input). Ops with a conv after a quantized
/// activation differ by the BN bias, which the searched op leaves float (there is no single
/// accumulator grid to round it to) and the fixed op rounds onto its accumulator unit.
#[test]
fn a_searched_site_at_a_one_hot_width_is_the_site_built_at_that_width() {
    use qdarts_genotypes::Primitive;
    use qdarts_ops::candidates::{
        BitProbs, CandidateOp, ConvShape, Ctx, OpBits, Pass, QConv, QTensor, quantize_site,
    };
    use qdarts_ops::qconfig::{QuantConfig, Site};
    let d = Device::flex();
    let cfg = QuantConfig::default();
    let x = qdarts_ops::seeded(&d, 9, || {
        Tensor::<4>::random([2, 4, 8, 8], Distribution::Normal(0.0, 1.0), &d)
    });
    let hot = |choices: &[u32], b: u32| {
        let v: Vec<f32> = choices.iter().map(|&c| if c == b { 1.0 } else { 0.0 }).collect();
        Tensor::<1>::from_floats(v.as_slice(), &d)
    };
    let max_diff = |a: Vec<f32>, b: Vec<f32>| {
        a.iter().zip(&b).map(|(u, v)| (u - v).abs()).fold(0.0f32, f32::max)
    };
    let (wc, ac): (&[u32], &[u32]) = (&[2, 4, 8], &[4, 8]);
    let search = OpBits::Search { weight: wc, act: ac };
    for (wb, ab) in [(2u32, 4u32), (4, 8), (8, 4)] {
        let fixed = OpBits::Fixed { weight: wb, act: ab };
        let ctx = |bits| Ctx::new(&cfg, "sep_conv_3x3", "c", &d).with_bits(bits);
        let conv = |bits| {
            qdarts_ops::seeded(&d, 11, || {
                QConv::new(ConvShape::square(4, 6, 3, 1, 1), &ctx(bits)).unwrap()
            })
        };
        let (f, s) = (conv(fixed), conv(search));
        let diff = max_diff(
            vals(f.forward(x.clone())),
            vals(s.forward_mixed(x.clone(), Pass::mixing(Some(&hot(wc, wb))))),
        );
        assert!(diff < 1e-5, "conv w{wb}: max difference {diff}");
        let eight = conv(OpBits::Config);
        if wb != 8 {
            assert!(max_diff(vals(f.forward(x.clone())), vals(eight.forward(x.clone()))) > 1e-3);
        }
        let (q, m) = (ctx(fixed).quantizer(Site::Act, "act", 1).unwrap(), ctx(search));
        let mix = m.bit_mix(Site::Act, "act", 1).unwrap();
        assert!(m.quantizer(Site::Act, "act", 1).unwrap().is_none(), "the mix replaces it");
        let a = quantize_site(&q, &None, x.clone(), Pass::default()).value;
        let b = quantize_site(&None, &mix, x.clone(), Pass::mixing(Some(&hot(ac, ab)))).value;
        assert!(max_diff(vals(a), vals(b)) < 1e-6, "act a{ab}");
        // The whole op where no bias is folded.
        let op = |bits| {
            qdarts_ops::seeded(&d, 11, || {
                CandidateOp::with_bits(Primitive::SkipConnect, 4, 2, false, &cfg, "e", &d, bits)
                    .unwrap()
            })
        };
        let probs = BitProbs { weight: hot(wc, wb), act: hot(ac, ab) };
        let a = op(fixed).forward(QTensor::float(x.clone())).value;
        let b = op(search).forward_in(QTensor::float(x.clone()), Pass::mixing(Some(&probs))).value;
        assert!(max_diff(vals(a), vals(b)) < 1e-5, "FactorizedReduce w{wb}a{ab}");
    }
}
