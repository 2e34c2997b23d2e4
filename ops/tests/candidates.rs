//! Candidate ops: shapes against pt.darts, float equality against an independent f64 reference,
//! finite gradients for every parameter, all-zero inputs, the mixed op, and error reporting.

// Test helpers panic on impossible conversions; a panic is the failure report here.
#![allow(clippy::unwrap_used)]

mod reference;

use std::collections::BTreeSet;

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::{Device, Distribution, Gradients, Tensor, TensorData};
use qdarts_genotypes::Primitive;
use qdarts_ops::candidates::{CandidateOp, Pass, QMixedOp, QTensor, QuantSites};
use qdarts_ops::qconfig::{Preset, QuantConfig};
use qdarts_ops::quant::{ErrorTape, QuantPass};
use reference::{Nd, batch_norm, cat, conv2d, pool3, relu, shift};

fn dev() -> Device {
    Device::flex()
}

/// Runs a test body with the backend's generator seeded and held (inputs and weights are
/// random draws; tests run on parallel threads of one process).
fn seeded<T>(body: impl FnOnce() -> T) -> T {
    qdarts_ops::seeded(&dev(), 23, body)
}

fn nd<const D: usize>(t: Tensor<D>) -> Vec<f64> {
    t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap().into_iter().map(f64::from).collect()
}

fn to_nd(t: Tensor<4>) -> Nd {
    let dims = t.dims();
    Nd::new(dims, nd(t))
}

fn input(dims: [usize; 4], device: &Device) -> Tensor<4> {
    Tensor::random(dims, Distribution::Normal(0.0, 1.0), device)
}

fn op(p: Primitive, c: usize, stride: usize, cfg: &QuantConfig, device: &Device) -> CandidateOp {
    CandidateOp::new(p, c, stride, false, cfg, &format!("cells.0.edges.1.{p}"), device).unwrap()
}

#[test]
fn every_op_keeps_spatial_size_at_stride_1_and_halves_it_at_stride_2() {
    seeded(|| {
        // pt.darts OPS on a [2, 4, 8, 8] input: every op returns [2, 4, 8, 8] at stride 1 and
        // [2, 4, 4, 4] at stride 2 (conv_7x1_1x7 included, which pt.darts' FacConv gets wrong:
        // its k×1 conv pads the width too, giving 8 + 2·3 = 14 columns at stride 1).
        let cfg = QuantConfig::preset(Preset::Tensorrt);
        for p in Primitive::ALL {
            for (stride, hw) in [(1, 8), (2, 4)] {
                let out = op(p, 4, stride, &cfg, &dev())
                    .forward(QTensor::float(input([2, 4, 8, 8], &dev())));
                assert_eq!(out.dims(), [2, 4, hw, hw], "{p} at stride {stride}");
            }
        }
    });
}

fn close(name: &str, got: &Nd, want: &Nd, tol: f64) {
    assert_eq!(got.dims, want.dims, "{name}: shape");
    for (i, (g, w)) in got.v.iter().zip(&want.v).enumerate() {
        assert!((g - w).abs() <= tol * (1.0 + w.abs()), "{name}[{i}]: {g} vs reference {w}");
    }
}

fn weight(p: &Param<Tensor<4>>) -> Nd {
    to_nd(p.val())
}

#[test]
fn float_ops_equal_the_reference_definitions() {
    seeded(|| {
        let cfg = QuantConfig::float();
        let x = input([2, 4, 8, 8], &dev());
        let xr = to_nd(x.clone());
        for p in Primitive::ALL {
            for stride in [1, 2] {
                let o = op(p, 4, stride, &cfg, &dev());
                let got = to_nd(o.forward(QTensor::float(x.clone())).value);
                let sep = |d: &qdarts_ops::candidates::QDilConv,
                           x: &Nd,
                           s: usize,
                           pad: usize,
                           dil: usize| {
                    let y = conv2d(&relu(x), &weight(&d.dw.weight), [s, s], [pad, pad], dil, 4);
                    batch_norm(&conv2d(&y, &weight(&d.pw.weight), [1, 1], [0, 0], 1, 1))
                };
                let want = match (&o, p) {
                    (CandidateOp::Zero(_), _) => Nd::zeros(got.dims),
                    (CandidateOp::Identity(_), _) => xr.clone(),
                    (CandidateOp::Pool(_), Primitive::MaxPool3x3) => {
                        batch_norm(&pool3(&xr, stride, true))
                    }
                    (CandidateOp::Pool(_), _) => batch_norm(&pool3(&xr, stride, false)),
                    (CandidateOp::Reduce(r), _) => {
                        let a = conv2d(&relu(&xr), &weight(&r.conv1.weight), [2, 2], [0, 0], 1, 1);
                        let b = conv2d(
                            &shift(&relu(&xr)),
                            &weight(&r.conv2.weight),
                            [2, 2],
                            [0, 0],
                            1,
                            1,
                        );
                        batch_norm(&cat(&a, &b))
                    }
                    (CandidateOp::Sep(s), _) => {
                        let k = s.op1.dw.weight.val().dims()[2];
                        let y = sep(&s.op1, &xr, stride, k / 2, 1);
                        sep(&s.op2, &y, 1, k / 2, 1)
                    }
                    (CandidateOp::Dil(d), _) => {
                        let k = d.dw.weight.val().dims()[2];
                        sep(d, &xr, stride, k - 1, 2)
                    }
                    (CandidateOp::Fac(f), _) => {
                        let y =
                            conv2d(&relu(&xr), &weight(&f.conv1.weight), [stride, 1], [3, 0], 1, 1);
                        batch_norm(&conv2d(&y, &weight(&f.conv2.weight), [1, stride], [0, 3], 1, 1))
                    }
                };
                close(&format!("{p} stride {stride}"), &got, &want, 2e-4);
            }
        }
    });
}

/// Collects, for every float parameter that requires a gradient, whether it got a finite one.
struct GradCheck<'a> {
    grads: &'a Gradients,
    missing: usize,
    non_finite: usize,
    seen: usize,
}

impl ModuleVisitor for GradCheck<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let t = param.val();
        if !t.is_require_grad() {
            return;
        }
        self.seen += 1;
        match t.grad(self.grads) {
            None => self.missing += 1,
            Some(g) => {
                if nd(g).iter().any(|v| !v.is_finite()) {
                    self.non_finite += 1;
                }
            }
        }
    }
}

fn check_grads(m: &impl Module, grads: &Gradients, name: &str) -> usize {
    let mut v = GradCheck { grads, missing: 0, non_finite: 0, seen: 0 };
    m.visit(&mut v);
    assert_eq!(v.missing, 0, "{name}: {} of {} parameters got no gradient", v.missing, v.seen);
    assert_eq!(v.non_finite, 0, "{name}: non-finite gradients");
    v.seen
}

#[test]
fn forward_and_backward_give_finite_gradients_for_every_parameter() {
    seeded(|| {
        let ad = dev().autodiff();
        for preset in [Preset::Tensorrt, Preset::Paddle, Preset::Lsq, Preset::OnnxQdq] {
            let cfg = QuantConfig::preset(preset);
            for p in Primitive::ALL {
                for stride in [1, 2] {
                    let o = op(p, 4, stride, &cfg, &ad);
                    let x = input([2, 4, 8, 8], &ad).require_grad();
                    let out = o.forward(QTensor::float(x.clone())).value;
                    if matches!(p, Primitive::None) {
                        assert!(nd(out).iter().all(|&v| v == 0.0));
                        continue;
                    }
                    let grads = out.square().sum().backward();
                    let name = format!("{preset:?} {p} stride {stride}");
                    check_grads(&o, &grads, &name);
                    let gx = x.grad(&grads).unwrap_or_else(|| panic!("{name}: no input gradient"));
                    assert!(nd(gx).iter().all(|v| v.is_finite()), "{name}: input gradient");
                }
            }
        }
    });
}

#[test]
fn all_zero_inputs_give_no_nan_in_forward_backward_or_error_reports() {
    seeded(|| {
        let ad = dev().autodiff();
        for preset in [Preset::Tensorrt, Preset::Paddle, Preset::Lsq, Preset::OnnxQdq] {
            let cfg = QuantConfig::preset(preset);
            let m = QMixedOp::new(&Primitive::DARTS, 4, 2, &cfg, "cells.1.edges.0", &ad).unwrap();
            let tape = ErrorTape::default();
            let x = Tensor::<4>::zeros([2, 4, 8, 8], &ad).require_grad();
            let w = Tensor::<1>::full([8], 0.125, &ad).require_grad();
            let rec = Pass::quantizing(QuantPass::recording(Some(&tape)));
            let out = m.forward_in(QTensor::float(x.clone()), w.clone(), rec).value;
            assert!(nd(out.clone()).iter().all(|v| v.is_finite()), "{preset:?}: forward");
            let grads = out.sum().backward();
            check_grads(&m, &grads, &format!("{preset:?}"));
            assert!(nd(x.grad(&grads).unwrap()).iter().all(|v| v.is_finite()));
            assert!(nd(w.grad(&grads).unwrap()).iter().all(|v| v.is_finite()));
            let rows = m.quant_stats(&tape).unwrap();
            assert!(!rows.is_empty());
            for r in rows {
                for v in [r.mse, r.sqnr_db, r.clip_frac, r.scale, r.zero_point] {
                    assert!(v.is_finite(), "{preset:?}: {r:?}");
                }
            }
        }
    });
}

#[test]
fn mixed_op_with_one_hot_weights_equals_the_selected_op_within_one_step() {
    seeded(|| {
        // Training mode on one batch: BN normalizes with that batch's statistics both times, and
        // the moving-average observers are at their fixed point on repeated data, so the only
        // difference left is the mixed op's own requantization of the sum.
        let cfg = QuantConfig::preset(Preset::Tensorrt);
        let x = input([2, 4, 8, 8], &dev());
        for (k, p) in Primitive::DARTS.iter().enumerate() {
            let m =
                QMixedOp::new(&Primitive::DARTS, 4, 1, &cfg, "cells.0.edges.0", &dev()).unwrap();
            let mut w = vec![0.0f32; 8];
            w[k] = 1.0;
            let mixed =
                m.forward(QTensor::float(x.clone()), Tensor::from_floats(w.as_slice(), &dev()));
            let step = mixed.grid.as_ref().map(|g| nd(g.step.clone())[0]).unwrap();
            let single = m.ops[k].forward(QTensor::float(x.clone())).value;
            let diff =
                nd(mixed.value).iter().zip(nd(single)).fold(0f64, |d, (a, b)| d.max((a - b).abs()));
            assert!(diff <= step * 1.0001, "{p}: max difference {diff} above one step {step}");
        }
    });
}

/// The mixed op's candidates share one ReLU of the edge's input; the definition runs each
/// candidate on its own (its own ReLU, as pt.darts' ops do). Two modules from one seed, the
/// same input and mixing weights: the same output bit for bit (float and tensorrt, whose
/// observers then see the same tensors), and the same gradients of the input, the mixing
/// weights and every parameter up to the order of the sums.
#[test]
fn mixed_op_sharing_one_relu_is_each_candidate_on_its_own() {
    let ad = dev().autodiff();
    for preset in [None, Some(Preset::Tensorrt)] {
        let cfg = preset.map_or_else(QuantConfig::float, QuantConfig::preset);
        for stride in [1, 2] {
            let name = format!("{preset:?} stride {stride}");
            let build = || {
                seeded(|| {
                    QMixedOp::new(&Primitive::ALL, 4, stride, &cfg, "cells.1.edges.0", &ad).unwrap()
                })
            };
            let (shared, alone) = (build(), build());
            let (x, w) = seeded(|| {
                let x = input([2, 4, 8, 8], &ad);
                let w = Tensor::<1>::random([Primitive::ALL.len()], Distribution::Default, &ad);
                (x, w)
            });

            let (x1, w1) = (x.clone().require_grad(), w.clone().require_grad());
            let out1 = shared.forward(QTensor::float(x1.clone()), w1.clone()).value;
            let g1 = out1.clone().square().sum().backward();

            let (x2, w2) = (x.require_grad(), w.require_grad());
            let wq = alone.mix.as_ref().map_or(w2.clone(), |q| q.forward(w2.clone()));
            let mut sum: Option<Tensor<4>> = None;
            for (i, op) in alone.ops.iter().enumerate() {
                let y = op.forward(QTensor::float(x2.clone())).value;
                let wi = wq.clone().slice(i..i + 1).reshape([1, 1, 1, 1]);
                sum = Some(match sum {
                    None => y.mul(wi),
                    Some(acc) => acc.add(y.mul(wi)),
                });
            }
            let out2 = qdarts_ops::candidates::quantize_opt(
                &alone.act,
                sum.unwrap(),
                qdarts_ops::quant::QuantPass::OFF,
            )
            .value;
            let g2 = out2.clone().square().sum().backward();

            let within = |what: &str, a: Vec<f64>, b: Vec<f64>, rel: f64| {
                assert_eq!(a.len(), b.len(), "{name}: {what}");
                let scale = b.iter().fold(1e-12f64, |m, v| m.max(v.abs()));
                let d = a.iter().zip(&b).fold(0f64, |d, (p, q)| d.max((p - q).abs()));
                assert!(d <= rel * scale, "{name}: {what} differs by {d} (largest {scale})");
            };
            within("output", nd(out1), nd(out2), 0.0);
            let near = |what: &str, a, b| within(what, a, b, 1e-5);
            near("input gradient", nd(x1.grad(&g1).unwrap()), nd(x2.grad(&g2).unwrap()));
            near("mixing-weight gradient", nd(w1.grad(&g1).unwrap()), nd(w2.grad(&g2).unwrap()));
            let (p1, p2) = (param_grads(&shared, &g1), param_grads(&alone, &g2));
            assert_eq!(p1.len(), p2.len(), "{name}: parameters");
            assert!(!p1.is_empty());
            for (i, (a, b)) in p1.into_iter().zip(p2).enumerate() {
                near(&format!("parameter {i} gradient"), a, b);
            }
        }
    }
}

/// The gradient of every float parameter of `m`, in visiting order.
fn param_grads(m: &impl Module, grads: &Gradients) -> Vec<Vec<f64>> {
    struct Collect<'a> {
        grads: &'a Gradients,
        out: Vec<Vec<f64>>,
    }
    impl ModuleVisitor for Collect<'_> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            if let Some(g) = p.val().grad(self.grads) {
                self.out.push(nd(g));
            }
        }
    }
    let mut c = Collect { grads, out: Vec::new() };
    m.visit(&mut c);
    c.out
}

#[test]
fn every_quantizer_reports_under_a_unique_stable_path() {
    seeded(|| {
        let cfg = QuantConfig::preset(Preset::Tensorrt);
        let m = QMixedOp::new(&Primitive::DARTS, 4, 1, &cfg, "cells.3.edges.5", &dev()).unwrap();
        let tape = ErrorTape::default();
        let rec = Pass::quantizing(QuantPass::recording(Some(&tape)));
        let x = QTensor::float(input([2, 4, 8, 8], &dev()));
        m.forward_in(x, Tensor::full([8], 0.125, &dev()), rec);
        let rows = m.quant_stats(&tape).unwrap();
        let paths: BTreeSet<&str> = rows.iter().map(|r| r.layer.as_str()).collect();
        assert_eq!(paths.len(), rows.len(), "duplicate paths");
        assert_eq!(rows.len(), m.quantizers().len(), "a quantizer did not report");
        for want in [
            "cells.3.edges.5.sep_conv_3x3.op1.pw.weight",
            "cells.3.edges.5.sep_conv_3x3.op1.dw.act",
            "cells.3.edges.5.sep_conv_3x3.op2.act",
            "cells.3.edges.5.dil_conv_5x5.dw.weight",
            "cells.3.edges.5.none.act",
            "cells.3.edges.5.mix",
            "cells.3.edges.5.act",
        ] {
            assert!(paths.contains(want), "missing {want}; have {paths:?}");
        }
        let none = rows.iter().find(|r| r.layer.ends_with("none.act")).unwrap();
        assert!(none.scale.is_finite() && none.scale > 0.0, "zero op scale {}", none.scale);
        // BatchNorm's multiplier is quantized on its own only when asked for.
        assert!(!paths.iter().any(|p| p.ends_with("bn.weight")), "{paths:?}");
        let cfg = QuantConfig { quantize_bn_multiplier: true, ..cfg };
        let m = QMixedOp::new(&Primitive::DARTS, 4, 1, &cfg, "cells.3.edges.5", &dev()).unwrap();
        let paths: BTreeSet<String> = m.quantizers().iter().map(|q| q.path().to_string()).collect();
        for want in
            ["cells.3.edges.5.sep_conv_3x3.op2.bn.weight", "cells.3.edges.5.max_pool_3x3.bn.weight"]
        {
            assert!(paths.contains(want), "missing {want}");
        }
    });
}

#[test]
fn batch_norm_updates_running_statistics_in_training_mode_only() {
    seeded(|| {
        use qdarts_ops::candidates::{Ctx, QBatchNorm};
        let cfg = QuantConfig::float();
        let d = dev();
        let ctx = Ctx::new(&cfg, "bn", "bn", &d);
        let bn = QBatchNorm::new(1, false, &ctx).unwrap();
        assert!(bn.gamma.is_none() && bn.beta.is_none(), "affine-free BN has no γ, β");
        let ad = dev().autodiff();
        let ctx_ad = Ctx::new(&cfg, "bn", "bn", &ad);
        let out = QBatchNorm::new(1, false, &ctx_ad).unwrap();
        let y = out.forward(Tensor::<4>::ones([1, 1, 2, 2], &ad).require_grad()).sum().backward();
        check_grads(&out, &y, "affine-free BN");
        // Channel values 1, 2, 3, 6: mean 3, unbiased variance 14/3 (PyTorch's running update).
        let x = Tensor::<4>::from_data(
            TensorData::new(vec![1.0f32, 2.0, 3.0, 6.0], [1, 1, 2, 2]),
            &dev(),
        );
        bn.forward(x.clone());
        let mean = nd(bn.running_mean.value())[0];
        let var = nd(bn.running_var.value())[0];
        assert!((mean - 0.1 * 3.0).abs() < 1e-6, "{mean}");
        assert!((var - (0.9 + 0.1 * 14.0 / 3.0)).abs() < 1e-6, "{var}");
        // A second training forward (e.g. the architecture step's) updates them again...
        bn.forward(x.clone());
        assert!((nd(bn.running_mean.value())[0] - (0.9 * 0.3 + 0.3)).abs() < 1e-6);
        // ...but a validation copy normalizes with them and leaves them alone.
        let frozen = bn.valid();
        let before = nd(frozen.running_mean.value());
        let y = nd(frozen.forward(x));
        assert_eq!(nd(frozen.running_mean.value()), before);
        let (m, v) = (before[0], nd(frozen.running_var.value())[0]);
        assert!((y[0] - (1.0 - m) / (v + 1e-5).sqrt()).abs() < 1e-5);
    });
}

/// PyTorch's `channel_shuffle` (PC-DARTS): output channel `i·g + k` is input channel
/// `k·(C/g) + i`.
#[test]
fn channel_shuffle_is_the_pc_darts_permutation() {
    seeded(|| {
        let (n, c, g, hw) = (2, 12, 4, 3);
        let vals: Vec<f32> = (0..n * c * hw * hw).map(|v| v as f32).collect();
        let x = Tensor::<1>::from_floats(vals.as_slice(), &dev()).reshape([n, c, hw, hw]);
        let out = nd(qdarts_ops::candidates::channel_shuffle(x, g));
        let per = c / g;
        for b in 0..n {
            for i in 0..per {
                for k in 0..g {
                    let (o, src) = (i * g + k, k * per + i);
                    for p in 0..hw * hw {
                        let got = out[(b * c + o) * hw * hw + p];
                        assert_eq!(got, vals[(b * c + src) * hw * hw + p] as f64, "channel {o}");
                    }
                }
            }
        }
    });
}

/// PC-DARTS' mixed op on the float config: the candidates see the first C/K channels, the
/// others bypass the edge (max-pooled 2×2 when it reduces), and the result is shuffled.
#[test]
fn partial_channel_mixed_op_matches_its_definition() {
    seeded(|| {
        let float = QuantConfig::float();
        let (c, k) = (8, 4);
        for stride in [1, 2] {
            let m =
                QMixedOp::partial(&Primitive::DARTS, c, stride, k, &float, "e", &dev()).unwrap();
            let x = input([2, c, 8, 8], &dev());
            let w: Vec<f32> = (0..8).map(|i| 0.05 + 0.02 * i as f32).collect();
            let wt = Tensor::<1>::from_floats(w.as_slice(), &dev());
            let out = m.forward(QTensor::float(x.clone()), wt.clone()).value;
            let ho = 8 / stride;
            assert_eq!(out.dims(), [2, c, ho, ho]);

            // The same thing written out: Σ w_i op_i(x[:, :C/K]) ++ bypass, then shuffled.
            let head = QTensor::float(x.clone().slice([0..2, 0..c / k]));
            let mut sum = Tensor::<4>::zeros([2, c / k, ho, ho], &dev());
            for (i, op) in m.ops.iter().enumerate() {
                sum = sum.add(op.forward(head.clone()).value.mul_scalar(w[i]));
            }
            let mut rest = x.slice([0..2, c / k..c]);
            if stride == 2 {
                rest = burn::tensor::module::max_pool2d(
                    rest,
                    burn::tensor::ops::MaxPoolOptions::new([2, 2]).with_stride([2, 2]),
                );
            }
            let want = qdarts_ops::candidates::channel_shuffle(Tensor::cat(vec![sum, rest], 1), k);
            let diff = nd(out).iter().zip(nd(want)).fold(0f64, |d, (a, b)| d.max((a - b).abs()));
            assert!(diff < 1e-5, "stride {stride}: {diff}");
        }
        assert!(QMixedOp::partial(&Primitive::DARTS, 6, 1, 4, &float, "e", &dev()).is_err());
        assert!(QMixedOp::partial(&Primitive::DARTS, 6, 1, 0, &float, "e", &dev()).is_err());
    });
}

#[test]
fn partial_channel_mixed_op_quantizes_its_output_and_trains() {
    seeded(|| {
        let ad = dev().autodiff();
        let cfg = QuantConfig::preset(Preset::Tensorrt);
        let m = QMixedOp::partial(&Primitive::DARTS, 8, 2, 4, &cfg, "e", &ad).unwrap();
        let x = input([2, 8, 8, 8], &ad).require_grad();
        let w = Tensor::<1>::full([8], 0.125, &ad).require_grad();
        let out = m.forward(QTensor::float(x.clone()), w.clone());
        assert!(out.grid.is_some(), "the concatenation is requantized onto one grid");
        // A BatchNorm-terminated op sums to zero up to quantization noise: project the output
        // on a fixed random direction, so that the gradients below measure something.
        let dir = input(out.value.dims(), &ad);
        let grads = out.value.mul(dir).sum().backward();
        check_grads(&m, &grads, "partial");
        let gw = nd(w.grad(&grads).unwrap());
        assert!(gw.iter().all(|v| v.is_finite()), "{gw:?}");
        // Only `none` (index 0) contributes nothing.
        assert!(gw[1..].iter().all(|v| *v != 0.0), "{gw:?}");
    });
}

/// Every quantizer Burn's traversal reaches is listed by the hand-written `QuantSites` impls,
/// once, for every candidate (and `conv_7x1_1x7`) at both strides, under every preset, with
/// BatchNorm's multiplier quantized, with partial channels and under a bit-width search.
#[test]
fn quant_sites_list_every_quantizer_of_the_module_tree() {
    use qdarts_ops::candidates::{OpBits, check_quant_sites, visited_quantizers};
    seeded(|| {
        let mut prims = Primitive::DARTS.to_vec();
        prims.push(Primitive::Conv7x1_1x7);
        let mut cfgs: Vec<(String, QuantConfig)> =
            [Preset::Tensorrt, Preset::OnnxQdq, Preset::Paddle, Preset::Lsq, Preset::Float]
                .into_iter()
                .map(|p| (format!("{p:?}"), QuantConfig::preset(p)))
                .collect();
        cfgs.push((
            "bn multiplier".into(),
            QuantConfig { quantize_bn_multiplier: true, ..QuantConfig::default() },
        ));
        let searched = OpBits::Search { weight: &[2, 4, 8], act: &[4, 8] };
        for (name, cfg) in &cfgs {
            for stride in [1, 2] {
                for (k, bits) in [(1, OpBits::Config), (2, OpBits::Config), (1, searched)] {
                    if *name == "Float" && bits != OpBits::Config {
                        continue;
                    }
                    let m =
                        QMixedOp::with_bits(&prims, 4, stride, k, cfg, "e", &dev(), bits).unwrap();
                    let n = check_quant_sites(&m)
                        .unwrap_or_else(|e| panic!("{name}, stride {stride}, K={k}: {e}"));
                    if *name != "Float" {
                        assert!(n > prims.len(), "{name}: only {n} quantizers");
                    }
                }
            }
        }
        // The check fails on an impl that leaves a field's quantizers out, and on one that
        // lists a quantizer twice.
        let cfg = QuantConfig::default();
        let leaky = Leaky {
            kept: op(Primitive::SepConv3x3, 4, 1, &cfg, &dev()),
            left_out: op(Primitive::DilConv3x3, 4, 1, &cfg, &dev()),
            twice: false,
        };
        let err = check_quant_sites(&leaky).unwrap_err();
        assert!(err.contains("not listed"), "{err}");
        assert_eq!(
            visited_quantizers(&leaky).len(),
            leaky.kept.quantizers().len() + leaky.left_out.quantizers().len()
        );
        let twice = Leaky { twice: true, ..leaky };
        let err = check_quant_sites(&twice).unwrap_err();
        assert!(err.contains("listed twice"), "{err}");
    });
}

/// A module whose `QuantSites` impl forgets one of its fields (or lists one twice).
#[derive(Module, Debug)]
struct Leaky {
    kept: CandidateOp,
    left_out: CandidateOp,
    #[module(skip)]
    twice: bool,
}

impl QuantSites for Leaky {
    fn quantizers(&self) -> Vec<&qdarts_ops::quant::FakeQuantizer> {
        let mut qs = self.kept.quantizers();
        if self.twice {
            qs.extend(self.kept.quantizers());
            qs.extend(self.left_out.quantizers());
        }
        qs
    }
}
