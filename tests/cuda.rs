//! The cuda backend (built with `--features cuda`, kernels through NVRTC: vendor/README.md).
//! Where no NVIDIA GPU can be used (CI), `--backend cuda` must refuse cleanly: exit code 1, the
//! missing driver named, no panic, no run folder. Where one can, a short search runs on it.
//! Either way (with wgpu also built), every kernel that short searches launch is compiled as
//! CUDA C++ by NVRTC, as the cuda backend would compile it for an H100/H200.

#![cfg(feature = "cuda")]
// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use std::process::Command;

mod common;

/// Whether this machine has an NVIDIA GPU that its driver answers for.
fn nvidia_gpu() -> bool {
    Command::new("nvidia-smi").arg("-L").output().is_ok_and(|o| o.status.success())
}

#[test]
fn cuda_runs_a_search_or_refuses_cleanly() {
    let dir = qdarts_record::scratch::scratch_path("cuda");
    let results = format!("record.results_dir=\"{}\"", dir.display());
    let out = common::qdarts()
        .args(["--backend", "cuda", "search", "--set", "search.epochs=1"])
        .args(["--set", "data.limit=128", "--set", &results])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    if nvidia_gpu() {
        assert!(out.status.success(), "{stderr}");
        let run = std::fs::read_dir(&dir).unwrap().next().unwrap().unwrap().path();
        let genotype = std::fs::read_to_string(run.join("genotype.txt")).unwrap();
        assert!(genotype.starts_with("Genotype(normal="), "{genotype}");
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("the cuda backend could not start"), "{stderr}");
        assert!(stderr.contains("NVIDIA GPU and its driver"), "{stderr}");
        assert!(!dir.exists(), "a run folder was made for a backend that never started");
    }
}

#[test]
fn a_device_the_backend_cannot_use_is_refused() {
    for (args, want) in [
        (&["--backend", "cuda", "--device", "cpu"][..], "it takes `cuda:N`"),
        (&["--backend", "cuda", "--device", "cuda:x"], "expected `cpu`, `cuda` or `cuda:N`"),
    ] {
        let out = common::qdarts().args(args).args(["bench", "quant"]).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(want), "{stderr}");
    }
}

/// The CUDA headers NVRTC compiles the kernels against, when this process can load NVRTC: the
/// toolkit's (`CUDA_PATH`, `/usr/local/cuda`) or the `nvidia-cuda-runtime` wheel of the Python
/// venv in `VIRTUAL_ENV` (`scripts/setup_torch.sh` makes one, and puts its NVRTC on
/// `LD_LIBRARY_PATH`). Otherwise why not.
#[cfg(feature = "wgpu")]
fn nvrtc_and_headers() -> Result<std::path::PathBuf, String> {
    use std::path::PathBuf;
    if !qdarts_kernels::cuda_source::nvrtc_available() {
        return Err("NVRTC (libnvrtc.so) is not on the loader's path".into());
    }
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(p) = std::env::var_os("CUDA_PATH") {
        candidates.push(PathBuf::from(p).join("include"));
    }
    candidates.push(PathBuf::from("/usr/local/cuda/include"));
    if let Some(venv) = std::env::var_os("VIRTUAL_ENV") {
        let lib = PathBuf::from(venv).join("lib");
        for python in std::fs::read_dir(&lib).into_iter().flatten().flatten() {
            candidates.push(python.path().join("site-packages/nvidia/cuda_runtime/include"));
        }
    }
    candidates.into_iter().find(|d| d.join("cuda_fp16.h").is_file()).ok_or_else(|| {
        "no CUDA headers (cuda_fp16.h) under CUDA_PATH, /usr/local/cuda or VIRTUAL_ENV's \
         nvidia-cuda-runtime wheel"
            .into()
    })
}

#[test]
fn a_cuda_sources_folder_that_cannot_be_made_is_a_clear_error() {
    let out = common::qdarts()
        .env("QDARTS_CUDA_SOURCES", "/proc/qdarts-no-such/cu")
        .args(["bench", "quant"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("QDARTS_CUDA_SOURCES") && err.contains("/proc/qdarts-no-such/cu"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[cfg(feature = "wgpu")]
#[test]
fn every_kernel_of_short_searches_on_wgpu_compiles_for_cuda_with_nvrtc() {
    use std::collections::BTreeMap;

    use qdarts_kernels::cuda_source::{REFUSED_EXT, SOURCE_EXT, nvrtc};

    let include = match nvrtc_and_headers() {
        Ok(dir) => dir,
        Err(why) => {
            assert!(
                std::env::var_os("QDARTS_REQUIRE_NVRTC").is_none(),
                "QDARTS_REQUIRE_NVRTC is set, but {why}"
            );
            eprintln!("note: {why}: the kernels' CUDA C++ is not compiled here");
            return;
        }
    };
    // The check can fail: NVRTC's own refusal comes back as its log.
    let refused = nvrtc(
        "extern \"C\" __global__ void k(float* x) { x[0] = undeclared; }",
        &include,
        "sm_90a",
    );
    assert!(refused.as_ref().is_err_and(|log| log.contains("undeclared")), "{refused:?}");

    let dir = common::scratch("cuda", "sources");
    let config =
        common::write_config(&dir, "tiny.toml", &common::tiny_search("cuda-sources", 7, 1));
    // Every preset first order, and the second order (its finite-difference passes hold the
    // rounding and ReLU masks, and step virtually) with a per-tensor and a learned quantizer;
    // the cells in waves (`model.batched_cells`), float and quantized, both orders.
    let runs: [(&str, &str, &str, bool); 10] = [
        ("float", "float", "first", false),
        ("tensorrt", "tensorrt", "first", false),
        ("onnx", "onnx_qdq", "first", false),
        ("paddle", "paddle", "first", false),
        ("lsq", "lsq", "first", false),
        ("second-tensorrt", "tensorrt", "second", false),
        ("second-lsq", "lsq", "second", false),
        ("waves-float", "float", "first", true),
        ("waves-tensorrt", "tensorrt", "first", true),
        ("waves-second-tensorrt", "tensorrt", "second", true),
    ];
    // Each distinct source once, with the name of a kernel that compiled to it.
    let mut sources: BTreeMap<String, String> = BTreeMap::new();
    let mut refusals = Vec::new();
    for (tag, preset, order, waves) in runs {
        let folder = dir.join(tag);
        let out = common::qdarts()
            .env("QDARTS_CUDA_SOURCES", &folder)
            .args(["--backend", "wgpu", "search", "--config"])
            .arg(&config)
            .args(["--set", &format!("quant.preset=\"{preset}\"")])
            .args(["--set", &format!("search.order=\"{order}\"")])
            .args(["--set", &format!("model.batched_cells={waves}")])
            .output()
            .unwrap();
        assert!(out.status.success(), "{tag}: {}", String::from_utf8_lossy(&out.stderr));
        let mut files = 0;
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            let (head, body) = text.split_once('\n').unwrap();
            let name = head.trim_start_matches("// ").to_string();
            match path.extension().and_then(|e| e.to_str()) {
                Some(SOURCE_EXT) => {
                    sources.entry(body.to_string()).or_insert(name);
                }
                Some(REFUSED_EXT) => refusals.push(format!("{tag}: {name}: {body}")),
                _ => panic!("{}: not a captured kernel", path.display()),
            }
            files += 1;
        }
        assert!(files > 0, "{tag}: nothing captured");
    }
    assert!(refusals.is_empty(), "CubeCL's CUDA C++ compiler refused:\n{}", refusals.join("\n"));

    // Each of qdarts' kernel modules that launches kernels in a search is among them.
    let ours: Vec<&String> =
        sources.values().filter(|n| n.starts_with("qdarts_kernels::")).collect();
    for module in [
        "batch_norm",
        "bias",
        "direct_conv",
        "fake_quant",
        "hold",
        "observe",
        "optim",
        "pool2d",
        "quant_sum",
        "relu",
        "scale",
    ] {
        let prefix = format!("qdarts_kernels::{module}::");
        assert!(
            ours.iter().any(|n| n.starts_with(&prefix)),
            "no kernel of {module} captured among {ours:#?}"
        );
    }

    // NVRTC compiles one program per call, so the sources go to every core.
    let sources: Vec<(&String, &String)> = sources.iter().collect();
    let failed: Vec<String> = on_every_core(&sources, |(source, name)| {
        nvrtc(source, &include, "sm_90a").err().map(|log| format!("{name}:\n{log}"))
    })
    .into_iter()
    .flatten()
    .collect();
    eprintln!(
        "{} distinct kernel sources ({} of qdarts' own) compiled for sm_90a, {} refused",
        sources.len(),
        ours.len(),
        failed.len()
    );
    assert!(failed.is_empty(), "NVRTC refused:\n{}", failed.join("\n\n"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `f` of every item, in the items' order, on as many threads as this machine has cores.
#[cfg(feature = "wgpu")]
fn on_every_core<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let per_core = items.len().div_ceil(cores).max(1);
    std::thread::scope(|scope| {
        let parts: Vec<_> = items
            .chunks(per_core)
            .map(|part| scope.spawn(|| part.iter().map(&f).collect::<Vec<R>>()))
            .collect();
        parts.into_iter().flat_map(|part| part.join().unwrap()).collect()
    })
}
