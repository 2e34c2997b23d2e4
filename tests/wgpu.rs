//! The wgpu backend end to end (built with `--features wgpu`): a short search on the embedded
//! data, on a GPU or, without one, on Mesa's software Vulkan driver. CI runs it there.

#![cfg(feature = "wgpu")]
// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use std::process::Command;

mod common;
use common::one_epoch_search;

/// The train rows' losses of a two-step search (64 training images) on `backend`, float
/// unless the config's `sets` (applied after) say otherwise.
fn first_losses(tag: &str, backend: &[&str], sets: &[&str]) -> Vec<f64> {
    let dir = common::scratch("wgpu-start", tag);
    let results = format!("record.results_dir=\"{}\"", dir.display());
    let out = common::qdarts()
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(backend)
        .args(["search", "--set", "search.epochs=1", "--set", "data.limit=128"])
        .args(["--set", "quant.preset=\"float\"", "--set", &results])
        .args(sets.iter().flat_map(|s| ["--set", s]))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let run = std::fs::read_dir(&dir).unwrap().next().unwrap().unwrap().path();
    let losses = train_losses(&run);
    let _ = std::fs::remove_dir_all(&dir);
    losses
}

/// The train rows' losses in `run`'s metrics, two of them.
fn train_losses(run: &std::path::Path) -> Vec<f64> {
    let metrics = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    let rows = metrics.lines().skip(1).map(|l| l.split(',').collect::<Vec<_>>());
    let losses: Vec<f64> =
        rows.filter(|r| r[2] == "train").map(|r| r[3].parse().unwrap()).collect();
    assert_eq!(losses.len(), 2, "{metrics}");
    losses
}

#[test]
fn a_search_on_wgpu_starts_from_flex_s_weights() {
    // The float preset, so that no fake-quant rounding can flip between the backends. The
    // seeded initialisation is drawn on the host for every backend and the batches are the
    // same: both steps' losses are flex's up to float rounding. (Drawn from each backend's own
    // generator, the default search's first loss on cuda was 0.9 % from flex's.)
    let ours = first_losses("wgpu", &["--backend", "wgpu"], &[]);
    let reference = first_losses("flex", &[], &[]);
    for (a, b) in ours.iter().zip(&reference) {
        assert!((a - b).abs() <= 1e-4 * b.abs(), "wgpu {ours:?} against flex {reference:?}");
    }
}

/// The same two steps with the cells in waves on wgpu (every kind of a wave in one chain, the
/// smaller filters zero-padded), with PC-DARTS' partial channels (K = 2) and edge
/// normalization and DARTS-' auxiliary skip on both sides: flex's per-edge losses, the second
/// step's included, which a padding that moved in the first step's update, an edge weight that
/// scaled another edge, a bypassed channel added to the wrong node, or an auxiliary term added
/// to a node its source does not feed, would change.
#[test]
fn a_search_in_waves_on_wgpu_takes_flex_s_per_edge_steps() {
    let guards = [
        "model.partial_channels=2",
        "search.guards.edge_normalization=true",
        "search.guards.aux_skip=0.5",
    ];
    let waves = ["model.batched_cells=true", guards[0], guards[1], guards[2]];
    let ours = first_losses("wgpu-waves", &["--backend", "wgpu"], &waves);
    let reference = first_losses("flex-edges", &[], &guards);
    for (a, b) in ours.iter().zip(&reference) {
        assert!((a - b).abs() <= 1e-4 * b.abs(), "wgpu in waves {ours:?}, flex {reference:?}");
    }
}

/// The default search (tensorrt) runs on wgpu edge by edge, its record whole (128 images, half
/// for the weights: 2 steps of 32, then one validation row), and the same search in waves
/// takes its steps: the two steps' losses to the rounding of the merged launches' sums (a value
/// at an exact rounding boundary may flip a level), which a row of a stacked quantizer that
/// read another edge's range, or a bias rounded to another unit, would move by far more.
#[test]
fn a_search_runs_on_wgpu_and_in_waves_takes_the_per_edge_steps() {
    // Without DARTS-' auxiliary skip: with it, wgpu's first losses edge by edge moved from
    // flex's by more than this bound, in waves less (docs/results/2026-12-07-aux-skip-in-waves.md),
    // so the quantized cell's auxiliary terms are held bit for bit on flex
    // (search/tests/batched.rs) and on wgpu in float.
    let (run, _) = one_epoch_search("wgpu", &["--backend", "wgpu"], &["data.limit=128"], 2);
    let reference = train_losses(&run);
    let _ = std::fs::remove_dir_all(run.parent().unwrap());
    let trt = "quant.preset=\"tensorrt\"";
    let ours =
        first_losses("wgpu-q-waves", &["--backend", "wgpu"], &[trt, "model.batched_cells=true"]);
    for (a, b) in ours.iter().zip(&reference) {
        assert!((a - b).abs() <= 1e-3 * b.abs(), "in waves {ours:?}, edge by edge {reference:?}");
    }
}

/// A bit-width search (EdMIPS' mixes of every searched site, widths 2 to 8) with quantized
/// BatchNorm multipliers, in waves on wgpu: every width's quantizer a stacked one, each row
/// mixed by its op's softmax, the mixed filters in the merged convolutions (the kernels' path;
/// flex runs the kinds apart). Both steps finite and within 1 % of flex's per-edge losses: at
/// two bits a level that one backend's sums flip moves a loss by that order (the per-edge search
/// on wgpu against flex's: 0.54 % at the first step; docs/results/2026-12-07-bits-in-waves.md).
/// What each row mixes, and with which op's widths, is held bit for bit on flex
/// (search/tests/batched.rs), where the mixes are the same code.
#[test]
fn a_bit_width_search_runs_in_waves_on_wgpu() {
    let bits = ["search.bits.weight=[2, 4, 8]", "search.bits.act=[4, 8]"];
    let trt = ["quant.preset=\"tensorrt\"", "quant.quantize_bn_multiplier=true"];
    let sets = [&bits[..], &trt[..]].concat();
    let waves = [&sets[..], &["model.batched_cells=true"]].concat();
    let ours = first_losses("wgpu-bits-waves", &["--backend", "wgpu"], &waves);
    let reference = first_losses("flex-bits-edges", &[], &sets);
    for (a, b) in ours.iter().zip(&reference) {
        assert!((a - b).abs() <= 1e-2 * b.abs(), "in waves {ours:?}, edge by edge {reference:?}");
    }
}

/// One search step against the PyTorch fixture (float preset), second-order terms included:
/// within the CPU backends' bounds. (The tensorrt fixture is not: its fake-quant roundings
/// flip at exact boundaries across devices, see docs/results/2026-11-25-gpu-h100.md.)
#[test]
fn the_float_search_step_matches_pytorch_on_wgpu() {
    float_parity_on_wgpu(&[]);
}

/// The same with the cells in waves (the batched cell's kernels on a CubeCL runtime: grouped
/// 1×1 convolutions, one product per wave for the node sums).
#[test]
fn the_float_search_step_in_waves_matches_pytorch_on_wgpu() {
    float_parity_on_wgpu(&["--batched-cells"]);
}

fn float_parity_on_wgpu(extra: &[&str]) {
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/search/tests/fixtures/parity/float");
    let out = Command::new(env!("CARGO_BIN_EXE_qdarts"))
        .args(["--backend", "wgpu", "parity", fixture])
        .args(extra)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("1 fixture(s) within bounds on wgpu"), "{stdout}");
    assert!(!stdout.contains("FAILED"), "{stdout}");
}

/// With every Vulkan and EGL driver hidden there is no adapter: a clear error, exit code 1, and
/// no run folder, rather than a panic.
#[test]
fn no_adapter_is_a_clear_error() {
    let dir = qdarts_record::scratch::scratch_path("wgpu-none");
    let results = format!("record.results_dir=\"{}\"", dir.display());
    let out = Command::new(env!("CARGO_BIN_EXE_qdarts"))
        .args(["search", "--backend", "wgpu", "--set", &results])
        .env("VK_ICD_FILENAMES", "/nonexistent/icd.json")
        .env("VK_DRIVER_FILES", "/nonexistent/icd.json")
        .env("__EGL_VENDOR_LIBRARY_FILENAMES", "/nonexistent/egl.json")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("the wgpu backend could not start"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!dir.exists(), "a run folder was made for a backend that never started");
}

/// `qdarts --backend wgpu GLOBAL bench search --order first --quant float --batch B --reps 1
/// --warmup 0 --csv <file>`, which must succeed: its standard output and the CSV's header and
/// first row.
fn bench_on_wgpu(tag: &str, global: &[&str], batch: &str) -> (String, Vec<String>, String) {
    let dir = common::scratch("wgpu-bench", tag);
    let csv = dir.join("bench.csv");
    let out = common::qdarts()
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["--backend", "wgpu"])
        .args(global)
        .args(["bench", "search", "--order", "first", "--quant", "float", "--batch", batch])
        .args(["--reps", "1", "--warmup", "0", "--csv"])
        .arg(&csv)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&csv).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let header = text.lines().next().unwrap().split(',').map(str::to_string).collect();
    let row = text.lines().nth(1).unwrap().to_string();
    (String::from_utf8_lossy(&out.stdout).to_string(), header, row)
}

/// The value of column `name` in a CSV row under `header`.
fn column<'a>(header: &[String], row: &'a str, name: &str) -> Option<&'a str> {
    let col = header.iter().position(|h| h == name).unwrap();
    row.split(',').nth(col)
}

/// `bench search` on wgpu reports the pool's peak: the device starts with exclusive pages,
/// which go back during a step, so the peak is sampled through one more step (a sampler thread
/// beside the step, which must neither block it nor be left running).
#[test]
fn bench_search_reports_a_sampled_peak_on_wgpu() {
    let (_, header, row) = bench_on_wgpu("peak", &[], "4");
    let peak: u64 = column(&header, &row, "peak_bytes").unwrap().parse().unwrap_or(0);
    // The default supernet at batch 4 holds megabytes of weights and activations.
    assert!(peak > 1 << 20, "peak {peak} bytes: {row}");
    // The binary's default, as the started device's pool report shows it.
    assert_eq!(column(&header, &row, "pools"), Some("exclusive"), "{row}");
}

#[test]
fn memory_pools_adaptive_keeps_cubecls_default_pools_on_wgpu() {
    let (stdout, header, row) = bench_on_wgpu("adaptive", &["--memory-pools", "adaptive"], "2");
    assert!(stdout.contains("on wgpu (adaptive memory pools)"), "{stdout}");
    // Read from the device's pool report, not from the flag: shared pages are listed there.
    assert_eq!(column(&header, &row, "pools"), Some("adaptive"), "{row}");
}
