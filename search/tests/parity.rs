//! qdarts against the PyTorch reference (`scripts/torch_reference.py`) on one search step:
//! the second-order α gradient and its parts, then a first-order step (α gradient, α after
//! Adam, loss, every network tensor after SGD), under the `float` and `tensorrt` presets.
//!
//! The fixtures are `search/tests/fixtures/parity/<preset>/` (see its README), or the folder
//! `QDARTS_PARITY_DIR` names (regenerated elsewhere). `-- --nocapture` prints the table.

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use burn::tensor::Device;
use qdarts_engine::tensors;
use qdarts_search::parity::{Check, batch_inputs, check_fixture, compare, compute, read_inputs};

fn committed() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/parity")
}

fn fixtures(root: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("spec.json").is_file())
        .collect();
    dirs.sort();
    assert!(!dirs.is_empty(), "{}: no fixture folders", root.display());
    dirs
}

/// qdarts on a fixture's inputs against its expected outputs.
fn check(dir: &Path) -> (qdarts_ops::qconfig::Preset, Vec<Check>, tensors::TensorMap) {
    let device = Device::flex().autodiff();
    let (spec, state) = read_inputs(dir, &device).unwrap();
    let ours = compute(&spec, state).unwrap();
    let (expected, _) = tensors::read(&dir.join("expected.safetensors")).unwrap();
    (spec.preset, check_fixture(dir, spec.preset, &ours).unwrap(), expected)
}

fn print(dir: &Path, checks: &[Check]) {
    eprintln!("{}", dir.display());
    eprintln!("  {:<48} {:>11} {:>11} {:>9}", "quantity", "max |diff|", "relative", "bound");
    for c in checks {
        let flag = if c.ok { "" } else { "  FAILED" };
        eprintln!(
            "  {:<48} {:>11.3e} {:>11.3e} {:>9.1e}{flag}",
            c.quantity, c.max_abs, c.rel, c.bound
        );
    }
}

fn assert_parity(root: &Path) {
    for dir in fixtures(root) {
        let (_, checks, _) = check(&dir);
        print(&dir, &checks);
        let bad: Vec<&Check> = checks.iter().filter(|c| !c.ok).collect();
        assert!(bad.is_empty(), "{}: {bad:#?}", dir.display());
    }
}

#[test]
fn parity_with_the_pytorch_reference_on_one_search_step() {
    let root = std::env::var_os("QDARTS_PARITY_DIR").map_or_else(committed, PathBuf::from);
    assert_parity(&root);
}

/// The batched cell (`model.batched_cells`, `qdarts parity --batched-cells`) on the float
/// fixtures, small and default shape: the cells in waves from the same weights, BatchNorm
/// statistics and momentum buffers, held to the same bounds as the cells edge by edge; and the
/// tensorrt fixtures, small and default shape, in waves.
#[test]
fn parity_with_the_cells_in_waves() {
    let device = Device::flex().autodiff();
    // A quantized supernet in waves (each quantizer a row of a stacked one): the tensorrt
    // fixtures within what the per-edge cells are held to.
    for dir in [
        committed().join("float"),
        default_shape().join("float"),
        committed().join("tensorrt"),
        default_shape().join("tensorrt"),
    ] {
        let (spec, state) = read_inputs(&dir, &device).unwrap();
        let state = batch_inputs(&dir, &spec, state).unwrap();
        assert!(!state.net.batched.is_empty());
        let ours = compute(&spec, state).unwrap();
        let checks = check_fixture(&dir, spec.preset, &ours).unwrap();
        print(&dir, &checks);
        let bad: Vec<&Check> = checks.iter().filter(|c| !c.ok).collect();
        assert!(bad.is_empty(), "{} in waves: {bad:#?}", dir.display());
    }
}

fn default_shape() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/parity-default-shape")
}

/// The default experiment's supernet (C = 4, 4 cells of 3 nodes, batch 32).
///
/// In float against PyTorch computing the same step in float64 (`torch_reference.py fixtures
/// --float64`): at this shape PyTorch's own float32 step is off its float64 result by up to
/// 7.7e-4 (relative) in the second-order ∇α and 7e-2 in the Hessian term, so a float32
/// reference cannot hold qdarts to the bounds; the Hessian term and the gradient it enters are
/// held to PyTorch's own float32 distance (`check_fixture`;
/// docs/results/2026-12-03-second-order-reference.md, 2026-12-04-second-order-across-cpus.md).
///
/// Under tensorrt against PyTorch's float32 step, held to the reference's own spread: 16
/// variants of the same step with every sum in another order (`--spread 16`;
/// docs/results/2026-12-07-tensorrt-default-shape-parity.md).
#[test]
fn parity_at_the_default_shape() {
    assert_parity(&default_shape());
}

#[test]
fn the_spread_widens_only_to_the_reference_variants() {
    // With the reference standing in for qdarts' outputs every group passes; a first-order
    // gradient moved past the widest variant's distance fails, one moved within it passes.
    let dir = default_shape().join("tensorrt");
    let spread: qdarts_search::parity::Spread =
        serde_json::from_slice(&std::fs::read(dir.join(qdarts_search::parity::SPREAD)).unwrap())
            .unwrap();
    let widest = spread.widest("first").unwrap();
    assert!(widest > 1e-3, "the spread does not widen the first-order gradient: {widest}");
    let (expected, _) = tensors::read(&dir.join("expected.safetensors")).unwrap();
    let preset = qdarts_ops::qconfig::Preset::Tensorrt;
    assert!(check_fixture(&dir, preset, &expected).unwrap().iter().all(|c| c.ok));
    let scale = ["first.normal", "first.reduce"]
        .iter()
        .flat_map(|k| expected[*k].values.iter())
        .fold(0f32, |m, v| m.max(v.abs()));
    let moved = |by: f64| {
        let mut ours = expected.clone();
        ours.get_mut("first.normal").unwrap().values[0] += (by * f64::from(scale)) as f32;
        check_fixture(&dir, preset, &ours).unwrap()
    };
    let first = |checks: &[Check]| checks.iter().find(|c| c.quantity == "first").unwrap().ok;
    assert!(first(&moved(0.5 * widest)));
    assert!(!first(&moved(1.1 * widest)));
    // α after the step: one sign flip more than the variant with the most fails.
    let flips = |n: usize| {
        let mut ours = expected.clone();
        for v in ours.get_mut("alphas_after.reduce").unwrap().values.iter_mut().take(n) {
            *v += (2.0 * spread.alpha_lr) as f32;
        }
        let checks = check_fixture(&dir, preset, &ours).unwrap();
        checks.iter().find(|c| c.quantity.starts_with("alphas_after")).unwrap().ok
    };
    assert!(flips(spread.most_flipped()));
    assert!(!flips(spread.most_flipped() + 1));
}

#[test]
fn the_float32_reference_widens_only_its_own_groups() {
    // The float32 floor comes from the reference's float32 outputs, never from qdarts': with
    // the float32 file standing in for qdarts' outputs, each of its groups is exactly at its
    // floor (ok), and every group it lacks keeps the preset's bound.
    let dir = default_shape().join("float");
    let (f32_ref, _) = tensors::read(&dir.join(qdarts_search::parity::FLOAT32_REFERENCE)).unwrap();
    let (mut expected, _) = tensors::read(&dir.join("expected.safetensors")).unwrap();
    let mut ours = expected.clone();
    ours.extend(f32_ref.clone());
    let checks = check_fixture(&dir, qdarts_ops::qconfig::Preset::Float, &ours).unwrap();
    let widened: Vec<&Check> = checks.iter().filter(|c| c.bound > 1e-3).collect();
    assert!(widened.iter().all(|c| c.ok && c.quantity.starts_with("second.")), "{widened:#?}");
    assert_eq!(widened.len(), 2, "{checks:#?}");
    // A first-order gradient moved by 1 % still fails: the floor does not reach it.
    let g = expected.get_mut("first.normal").unwrap();
    g.values[0] += 0.01 * g.values.iter().fold(0f32, |m, v| m.max(v.abs()));
    let checks = check_fixture(&dir, qdarts_ops::qconfig::Preset::Float, &expected).unwrap();
    assert!(checks.iter().any(|c| !c.ok && c.quantity == "first"), "{checks:#?}");
}

#[test]
fn parity_fails_on_a_perturbed_reference() {
    // The same comparison against expected outputs with one α gradient moved by 1 %: the check
    // must catch it (a test that cannot fail proves nothing).
    let dir = committed().join("float");
    let device = Device::flex().autodiff();
    let (spec, state) = read_inputs(&dir, &device).unwrap();
    let ours = compute(&spec, state).unwrap();
    let (mut expected, _) = tensors::read(&dir.join("expected.safetensors")).unwrap();
    assert!(compare(spec.preset, &ours, &expected).iter().all(|c| c.ok));
    let g = expected.get_mut("second.hessian.normal").unwrap();
    g.values[3] *= 1.01;
    g.values[3] += 1e-3;
    let checks = compare(spec.preset, &ours, &expected);
    assert!(
        checks.iter().any(|c| !c.ok && c.quantity == "second.hessian"),
        "a 1 % change of the Hessian term went unnoticed: {checks:#?}"
    );
    expected.remove("loss");
    assert!(compare(spec.preset, &ours, &expected).iter().any(|c| !c.ok), "a missing output");
}

/// A Python with PyTorch: `QDARTS_TORCH_PYTHON`, else `python3` if it imports torch.
fn torch_python() -> Option<PathBuf> {
    let py = std::env::var_os("QDARTS_TORCH_PYTHON")
        .map_or_else(|| PathBuf::from("python3"), PathBuf::from);
    let ok = Command::new(&py)
        .args(["-c", "import torch, safetensors, numpy"])
        .output()
        .is_ok_and(|o| o.status.success());
    ok.then_some(py)
}

#[test]
fn parity_with_fixtures_regenerated_by_pytorch_now() {
    let Some(py) = torch_python() else {
        qdarts_record::scratch::tool_missing(
            "no Python with torch, safetensors and numpy (QDARTS_TORCH_PYTHON)",
        );
        return;
    };
    let out = qdarts_record::scratch::scratch_path("parity");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/torch_reference.py");
    let run = Command::new(py)
        .arg(&script)
        .args(["fixtures", "--inputs"])
        .arg(committed())
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&run.stdout).to_string() + &String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "torch_reference.py fixtures failed:\n{text}");
    eprintln!("{text}");
    assert_parity(&out);
    let _ = std::fs::remove_dir_all(&out);
}
