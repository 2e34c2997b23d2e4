//! Freeze on a network with negative BatchNorm weights: a flipped channel's integers are
//! negated, and one that holds −128 (full-range int8 weights) keeps them with a negative
//! weight scale; the integer model still agrees with the fake-quant network.

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use burn::module::{Module, ModuleMapper, Param};
use burn::tensor::{Device, Tensor};
use qdarts_engine::Progress;
use qdarts_engine::config::Experiment;
use qdarts_record::RunDir;
use qdarts_train::eval::{evaluate_frozen, input_spec};
use qdarts_train::freeze::freeze;
use qdarts_train::{
    TrainConfig, TrainedRun, open_trained, resolve_genotype, run_train_in, test_set,
};

fn scratch(name: &str) -> PathBuf {
    qdarts_record::scratch::scratch(&format!("freeze-{name}"))
}

/// Negates γ of every other channel of every affine BatchNorm.
struct FlipGammas {
    last: String,
}

impl ModuleMapper for FlipGammas {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.last = name.to_string();
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        if self.last != "gamma" || D != 1 {
            return param;
        }
        param.map(|g| {
            let n = g.dims()[0];
            let signs: Vec<f32> = (0..n).map(|i| if i % 2 == 1 { -1.0 } else { 1.0 }).collect();
            let s = Tensor::<1>::from_floats(signs.as_slice(), &g.device()).reshape(g.dims());
            g.mul(s)
        })
    }
}

#[test]
fn negative_gamma_and_minus_128_weights_freeze_and_agree() {
    let dir = scratch("gamma");
    let text = format!(
        r#"
        name = "gamma"
        seed = 3
        genotype = "DARTS_V2"
        [data]
        dataset = "fashion-mnist"
        limit = 128
        test_limit = 400
        [model]
        init_channels = 4
        layers = 3
        auxiliary = false
        [train]
        epochs = 1
        batch_size = 32
        [quant]
        preset = "tensorrt"
        # Full-range int8 weights: the most negative weight of a channel rounds to −128.
        [quant.weight]
        bits = 8
        granularity = {{ per_channel = {{ axis = 0 }} }}
        observer = {{ kind = "min_max" }}
        [record]
        results_dir = "{}"
        "#,
        dir.display()
    );
    let file = dir.join("train.toml");
    std::fs::write(&file, text).unwrap();
    let cfg = TrainConfig::load(&file, &[]).unwrap();
    let genotype = resolve_genotype(&cfg.genotype).unwrap();
    let run = RunDir::create(&dir, "gamma").unwrap();
    let go = &mut |_: &Progress| ControlFlow::Continue(());
    assert!(run_train_in(&cfg, &genotype, &Device::flex(), &run, false, go).unwrap());
    let root: &Path = run.root();
    let trained = open_trained(root, &Device::flex()).unwrap();
    let net = trained.net.map(&mut FlipGammas { last: String::new() });
    let set = test_set(&cfg).unwrap();
    let model = freeze(&net, &genotype, &input_spec(&cfg, &set), &Device::flex()).unwrap();
    // Some flipped channel held −128 and carries its sign in a negative weight scale.
    let signed = model
        .tensors
        .values()
        .filter(|t| t.name.ends_with(".weight") && t.scale.iter().any(|s| *s < 0.0))
        .count();
    assert!(signed > 0, "no flipped channel held −128: the test does not exercise the sign");
    let trained = TrainedRun { net, ..trained };
    let ev = evaluate_frozen(&trained, &model, &set, 1, 0, &Device::flex()).unwrap();
    assert!(ev.report.agreement >= 0.995, "agreement {}", ev.report.agreement);
}

/// The evaluation network's hand-written `QuantSites` (network, cells, auxiliary head,
/// classifier, the genotype's ops) list every quantizer Burn's traversal reaches, once, for
/// published genotypes and one with per-op widths.
#[test]
fn the_eval_network_lists_every_quantizer_of_its_module_tree() {
    use qdarts_ops::candidates::check_quant_sites;
    use qdarts_ops::qconfig::{Preset, QuantConfig};
    use qdarts_train::network::{EvalNetwork, EvalShape};
    let d = Device::flex();
    let shape = EvalShape {
        c_in: 1,
        size: 16,
        classes: 10,
        channels: 4,
        layers: 5,
        stem_multiplier: 3,
        auxiliary: true,
    };
    let mut with_bits = qdarts_genotypes::known("DARTS_V2").unwrap();
    let widths = |cell: &[Vec<qdarts_genotypes::Edge>], weight, act| {
        let b = qdarts_genotypes::Bits { weight, act };
        Some(cell.iter().map(|node| vec![b; node.len()]).collect())
    };
    with_bits.normal_bits = widths(&with_bits.normal, 4, 8);
    with_bits.reduce_bits = widths(&with_bits.reduce, 2, 4);
    for (name, genotype) in [
        ("DARTS_V2", qdarts_genotypes::known("DARTS_V2").unwrap()),
        ("NASNet", qdarts_genotypes::known("NASNet").unwrap()),
        ("DARTS_V2 with widths", with_bits),
    ] {
        for preset in [Preset::Tensorrt, Preset::Lsq] {
            let net =
                EvalNetwork::new(&shape, &genotype, &QuantConfig::preset(preset), &d).unwrap();
            let n = check_quant_sites(&net).unwrap_or_else(|e| panic!("{name}, {preset:?}: {e}"));
            assert!(n > 50, "{name}: only {n} quantizers");
        }
    }
}
