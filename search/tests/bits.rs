//! The bit-width search and the hardware cost: the cost tables against hand counts of MACs,
//! the cost's gradient against finite differences, a search that records its widths and
//! resumes exactly, a cost that lowers the expected BitOPs, and config errors.

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use std::ops::ControlFlow;
use std::path::Path;

use burn::module::Param;
use burn::tensor::{Device, Tensor};
use qdarts_engine::config::Experiment;
use qdarts_engine::seeded;
use qdarts_genotypes::{Genotype, Primitive};
use qdarts_ops::qconfig::QuantConfig;
use qdarts_search::config::{CostMetric, ExperimentConfig};
use qdarts_search::cost::CostModel;
use qdarts_search::run_search;
use qdarts_search::supernet::{Alphas, SearchNetwork};

mod common;
use common::{scratch, tiny, tiny_shape, tiny_with};

const BITS: &str = "[search.bits]\nweight = [2, 4, 8]\nact = [4, 8]\n";

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn last_cost(run: &Path) -> f64 {
    let text = read(&run.join("cost.csv"));
    let last = text.lines().last().unwrap();
    last.split(',').nth(1).unwrap().parse().unwrap()
}

#[test]
fn the_cost_tables_count_the_macs_of_each_candidate_by_hand() {
    let d = Device::flex();
    let mut shape = tiny_shape(1);
    shape.bits = Some((vec![2, 8], vec![4, 8]));
    let net = SearchNetwork::new(&shape, &QuantConfig::preset(Default::default()), &d).unwrap();
    let (h, w) = (8, 8);
    let m = CostModel::new(&net, (h, w), 2, &Primitive::DARTS, &QuantConfig::default(), None);
    let k = |p: Primitive| Primitive::DARTS.iter().position(|q| *q == p).unwrap();
    // Two separable convs (depthwise k×k + pointwise 1×1), the first strided: `out` is the
    // output side.
    let sep = |c: u64, kk: u64, out: u64| 2 * (c * kk * kk + c * c) * out * out;
    let dil = |c: u64, kk: u64, out: u64| (c * kk * kk + c * c) * out * out;
    // FactorizedReduce: two 1×1 convs to C/2 each.
    let fr = |c: u64, out: u64| 2 * c * (c / 2) * out * out;
    // Cell 0 is normal (C = 4, 8×8). Cells 1 and 2 reduce: C = 8 from 8×8 to 4×4, then
    // C = 16 from 4×4 to 2×2 (its s0 comes through a FactorizedReduce).
    let normal = &m.normal.ops[0];
    assert_eq!(normal[k(Primitive::SepConv3x3)].macs, sep(4, 3, 8));
    assert_eq!(normal[k(Primitive::DilConv5x5)].macs, dil(4, 5, 8));
    assert_eq!(normal[k(Primitive::SepConv3x3)].params, 2 * (4 * 9 + 4 * 4));
    for p in [Primitive::None, Primitive::MaxPool3x3, Primitive::AvgPool3x3, Primitive::SkipConnect]
    {
        assert_eq!(normal[k(p)].macs, 0, "{p}");
    }
    let reduce = &m.reduce.ops;
    // Edge 0 reads s0 at stride 2; edge 4 (node 3 reads node 2) runs at stride 1 inside.
    assert_eq!(reduce[0][k(Primitive::SepConv3x3)].macs, sep(8, 3, 4) + sep(16, 3, 2));
    assert_eq!(reduce[0][k(Primitive::SkipConnect)].macs, fr(8, 4) + fr(16, 2));
    assert_eq!(reduce[4][k(Primitive::DilConv3x3)].macs, dil(8, 3, 4) + dil(16, 3, 2));
    assert_eq!(reduce[4][k(Primitive::SkipConnect)].macs, 0, "an identity at stride 1");
    assert_eq!(reduce[2][k(Primitive::SkipConnect)].macs, fr(8, 4) + fr(16, 2), "node 3 reads s0");
    // The fixed part, all at 8×8 bits: the stem (3×3, 1 → 4 channels at 8×8); the cells'
    // preprocessings: cell 0 4→4 twice at 8×8, cell 1 4→8 and 8→8 at 8×8, cell 2 a
    // FactorizedReduce 8→16 to 4×4 and 16→16 at 4×4; the classifier, 32 features to 10.
    let pre = 2 * (4 * 4 * 64) + (4 * 8 + 8 * 8) * 64 + fr(16, 4) / 2 + 16 * 16 * 16;
    let fixed = 9 * 4 * 64 + pre + 32 * 10;
    assert_eq!(m.fixed_bitops, (fixed * 64) as f64);
    assert!((m.kept - 4.0 / 5.0).abs() < 1e-12, "two of five edges per node pair");
}

#[test]
fn the_expected_cost_gradient_matches_finite_differences() {
    let d = Device::flex();
    let ad = d.clone().autodiff();
    let mut shape = tiny_shape(1);
    shape.bits = Some((vec![2, 4, 8], vec![4, 8]));
    let cfg = QuantConfig::default();
    let (net, alphas) = seeded(&ad, 3, || {
        let net = SearchNetwork::new(&shape, &cfg, &ad).unwrap();
        let a = Alphas::new(2, 8, &ad).with_bits(8, 3, 2, &ad);
        (net, a)
    });
    // Spread the bit parameters so that the softmaxes are not uniform.
    let bits = alphas.bits.as_ref().unwrap();
    let [e, k, b] = bits.weight_normal.val().dims();
    let ramp: Vec<f32> = (0..e * k * b).map(|i| ((i * 37) % 11) as f32 * 0.1 - 0.5).collect();
    let w0 = Tensor::<1>::from_floats(ramp.as_slice(), &ad).reshape([e, k, b]);
    let mut alphas = alphas;
    alphas.bits.as_mut().unwrap().weight_normal =
        Param::from_tensor(w0.clone()).set_require_grad(true);
    let m = CostModel::new(&net, (8, 8), 2, &Primitive::DARTS, &cfg, shape.bits.clone());
    for metric in [CostMetric::Bitops, CostMetric::Size] {
        let mut g = m.expected(metric, &alphas.arch()).backward();
        let grads = qdarts_search::architect::AlphaGrads::take(&mut g, &alphas);
        let gw = grads.bits.unwrap()[0].clone().into_data().try_to_vec::<f32>().unwrap();
        let ga = grads.normal.into_data().try_to_vec::<f32>().unwrap();
        let at = |wn: Vec<f32>, an: Option<(usize, f32)>| -> f64 {
            let mut a = alphas.clone();
            a.bits.as_mut().unwrap().weight_normal =
                Param::from_tensor(Tensor::<1>::from_floats(wn.as_slice(), &ad).reshape([e, k, b]));
            if let Some((i, h)) = an {
                let mut v = a.normal.val().into_data().try_to_vec::<f32>().unwrap();
                v[i] += h;
                let [ne, nk] = a.normal.val().dims();
                a.normal = Param::from_tensor(
                    Tensor::<1>::from_floats(v.as_slice(), &ad).reshape([ne, nk]),
                );
            }
            f64::from(m.expected(metric, &a.arch()).into_scalar::<f32>())
        };
        let h = 1e-2f32;
        // A sep_conv_3x3 bit parameter on edge 0 and one on the last edge; α of sep_conv_5x5.
        let sep3 = Primitive::DARTS.iter().position(|p| *p == Primitive::SepConv3x3).unwrap();
        for i in [sep3 * b, sep3 * b + 2, (e - 1) * k * b + sep3 * b + 1] {
            let (mut up, mut down) = (ramp.clone(), ramp.clone());
            up[i] += h;
            down[i] -= h;
            let fd = (at(up, None) - at(down, None)) / (2.0 * f64::from(h));
            let an = f64::from(gw[i]);
            assert!(
                (fd - an).abs() <= 2e-2 * an.abs().max(1.0),
                "{metric:?} bit {i}: fd {fd}, grad {an}"
            );
        }
        let i = sep3 + 1;
        let fd = (at(ramp.clone(), Some((i, h))) - at(ramp.clone(), Some((i, -h))))
            / (2.0 * f64::from(h));
        let an = f64::from(ga[i]);
        assert!(
            (fd - an).abs() <= 2e-2 * an.abs().max(1.0),
            "{metric:?} α {i}: fd {fd}, grad {an}"
        );
    }
}

#[test]
fn a_bit_search_records_its_widths_and_resumes_to_the_uninterrupted_result() {
    let cost = "[search.cost]\nmetric = \"bitops\"\ntarget = 2.0e5\nweight = 0.5\n";
    let extra = format!("{BITS}{cost}");
    let go = |_: &qdarts_engine::Progress| ControlFlow::Continue(());
    let whole =
        run_search(&tiny(&scratch("bits-whole"), &extra), &Device::flex(), None, &mut { go })
            .unwrap();
    let g = Genotype::from_json(&read(&whole.run_dir.join("genotype.json"))).unwrap();
    let (nb, rb) = (g.normal_bits.clone().unwrap(), g.reduce_bits.clone().unwrap());
    assert_eq!(nb.iter().map(Vec::len).collect::<Vec<_>>(), vec![2, 2]);
    for (cell, bits) in [(&g.normal, &nb), (&g.reduce, &rb)] {
        for (edges, bs) in cell.iter().zip(bits) {
            for (e, b) in edges.iter().zip(bs) {
                let searched = e.op.has_weights()
                    || (e.op == Primitive::SkipConnect
                        && std::ptr::eq(cell, &g.reduce)
                        && e.input < 2);
                if searched {
                    assert!([2, 4, 8].contains(&b.weight) && [4, 8].contains(&b.act), "{e:?} {b}");
                } else {
                    assert_eq!((b.weight, b.act), (8, 8), "{e:?}: the config's widths");
                }
            }
        }
    }
    // genotype.txt stays pt.darts' text, without widths.
    let text = read(&whole.run_dir.join("genotype.txt"));
    assert!(text.starts_with("Genotype(normal=") && !text.contains("w8"), "{text}");
    let bits = read(&whole.run_dir.join("bits.csv"));
    assert!(bits.starts_with("epoch,cell_type,edge,op,site,bits,weight\n"), "{bits}");
    assert!(
        bits.contains(",normal,0,sep_conv_3x3,weight,2,")
            && bits.contains(",reduce,0,skip_connect,act,8,")
    );
    assert!(!bits.contains("max_pool_3x3"), "ops without convolutions have no widths");
    assert_eq!(read(&whole.run_dir.join("cost.csv")).lines().count(), 3, "header and two epochs");

    let cfg = tiny(&scratch("bits-stopped"), &extra);
    let stop = |p: &qdarts_engine::Progress| {
        if p.epoch * p.steps + p.step == 3 {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    };
    let part = run_search(&cfg, &Device::flex(), None, &mut { stop }).unwrap();
    assert!(!part.finished);
    let done = run_search(&cfg, &Device::flex(), Some(&part.run_dir), &mut { go }).unwrap();
    assert_eq!(done.genotype, whole.genotype);
    for f in ["alphas.csv", "bits.csv", "cost.csv", "genotype.json"] {
        assert_eq!(read(&whole.run_dir.join(f)), read(&done.run_dir.join(f)), "{f}");
    }
}

#[test]
fn a_cost_penalty_lowers_the_expected_bitops() {
    let steps = ["search.epochs=3", "search.alpha_lr=0.05"];
    let free = tiny_with(&scratch("bits-free"), BITS, &steps);
    // A target far below anything reachable: the hinge is always active.
    let cost = "[search.cost]\nmetric = \"bitops\"\ntarget = 1.0e3\nweight = 1.0\n";
    let paid = tiny_with(&scratch("bits-paid"), &format!("{BITS}{cost}"), &steps);
    let go = |_: &qdarts_engine::Progress| ControlFlow::Continue(());
    let free = run_search(&free, &Device::flex(), None, &mut { go }).unwrap();
    let paid = run_search(&paid, &Device::flex(), None, &mut { go }).unwrap();
    let (f, p) = (last_cost(&free.run_dir), last_cost(&paid.run_dir));
    assert!(p < 0.9 * f, "expected BitOPs with the cost {p}, without {f}");
    // The expected width of every searched op at the last epoch, from bits.csv.
    let mean_width = |run: &Path, site: &str| {
        let text = read(&run.join("bits.csv"));
        let rows: Vec<Vec<String>> = text
            .lines()
            .skip(1)
            .map(|l| l.split(',').map(String::from).collect())
            .filter(|r: &Vec<String>| r[0] == "2" && r[4] == site)
            .collect();
        let sum: f64 =
            rows.iter().map(|r| r[5].parse::<f64>().unwrap() * r[6].parse::<f64>().unwrap()).sum();
        // Each op's widths sum to one: divide by the number of ops.
        sum / rows.iter().map(|r| r[6].parse::<f64>().unwrap()).sum::<f64>()
    };
    for site in ["weight", "act"] {
        let (f, p) = (mean_width(&free.run_dir, site), mean_width(&paid.run_dir, site));
        assert!(p < f, "{site}: mean expected width with the cost {p}, without {f}");
    }
}

#[test]
fn bad_bit_and_cost_configs_name_the_key() {
    let dir = scratch("bits-bad");
    let p = Path::new("tiny.toml");
    let text = common::tiny_text(&dir, BITS);
    let err = |sets: &[&str]| -> String {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        ExperimentConfig::parse(&text, p, &sets).unwrap_err().to_string()
    };
    let e = err(&["search.bits.weight=[2, 2]"]);
    assert!(e.contains("search.bits.weight") && e.contains("each once"), "{e}");
    let e = err(&["search.bits.act=[9]"]);
    assert!(e.contains("search.bits.act") && e.contains("9 bits"), "{e}");
    let e = err(&["search.bits.act=[]"]);
    assert!(e.contains("search.bits.act"), "{e}");
    let e = err(&["quant.preset=\"float\""]);
    assert!(e.contains("search.bits") && e.contains("float"), "{e}");
    let with_cost = |c: &str| {
        let t = common::tiny_text(&dir, &format!("{BITS}[search.cost]\n{c}\n"));
        ExperimentConfig::parse(&t, p, &[]).map(|_| ()).map_err(|e| e.to_string())
    };
    let e = with_cost("metric = \"bitops\"\nweight = 1.0").unwrap_err();
    assert!(e.contains("search.cost.target") && e.contains("needs a target"), "{e}");
    let e = with_cost("metric = \"size\"\nweight = 1.0\ntarget = -3.0").unwrap_err();
    assert!(e.contains("search.cost.target"), "{e}");
    let e =
        with_cost("metric = \"size\"\nweight = 1.0\npenalty = \"log\"\ntarget = 3.0").unwrap_err();
    assert!(e.contains("no target"), "{e}");
    let e = with_cost("metric = \"latency\"\nweight = 1.0").unwrap_err();
    assert!(e.contains("latency"), "{e}");
    with_cost("metric = \"size\"\nweight = 0.1\npenalty = \"log\"").unwrap();
    // The default charge trains the bit widths: it needs a bit-width search.
    let t =
        common::tiny_text(&dir, "[search.cost]\nmetric = \"bitops\"\nweight = 1.0\ntarget = 1e6\n");
    let e = ExperimentConfig::parse(&t, p, &[]).unwrap_err().to_string();
    assert!(e.contains("search.cost.charge") && e.contains("[search.bits]"), "{e}");
    let t = common::tiny_text(
        &dir,
        "[search.cost]\nmetric = \"bitops\"\nweight = 1.0\ntarget = 1e6\ncharge = \"ops_and_bits\"\n",
    );
    ExperimentConfig::parse(&t, p, &[]).unwrap();
    let e = ExperimentConfig::parse(&t, p, &["model.partial_channels=2".into()]).unwrap_err();
    assert!(e.to_string().contains("partial_channels"), "{e}");
}

/// The supernet's hand-written `QuantSites` (network, cells, preprocessing, node sums, the
/// candidates) list every quantizer Burn's traversal reaches, once, with and without partial
/// channels and a bit-width search.
#[test]
fn the_supernet_lists_every_quantizer_of_its_module_tree() {
    use qdarts_ops::candidates::check_quant_sites;
    use qdarts_ops::qconfig::Preset;
    let d = Device::flex();
    for preset in [Preset::Tensorrt, Preset::Lsq, Preset::OnnxQdq] {
        for partial in [1, 2] {
            for bits in [None, Some((vec![2, 4, 8], vec![4, 8]))] {
                let mut shape = tiny_shape(partial);
                shape.bits = bits.clone();
                let net = SearchNetwork::new(&shape, &QuantConfig::preset(preset), &d).unwrap();
                let n = check_quant_sites(&net)
                    .unwrap_or_else(|e| panic!("{preset:?}, K={partial}, bits {bits:?}: {e}"));
                assert!(n > 100, "{preset:?}: only {n} quantizers");
            }
        }
    }
}
