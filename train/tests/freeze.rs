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
use qdarts_record::RunDir;
use qdarts_train::eval::{evaluate_frozen, input_spec};
use qdarts_train::freeze::freeze;
use qdarts_train::{
    TrainConfig, TrainedRun, open_trained, resolve_genotype, run_train_in, test_set,
};

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("qdarts-freeze-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
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
