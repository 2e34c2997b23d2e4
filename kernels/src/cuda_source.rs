//! The CubeCL kernels a run compiles, written out as the CUDA C++ the cuda backend would hand
//! NVRTC, and NVRTC's verdict on them, without an NVIDIA GPU (feature `cuda`).
//!
//! The cuda backend turns each kernel into CUDA C++ (CubeCL's C++ compiler) and compiles that
//! at run time with NVRTC, for the GPU it finds. A machine without a GPU cannot start a CUDA
//! device, so a kernel whose C++ NVRTC refuses would show only on the next GPU. Both compilers
//! run without one: [`capture_into`] shows every kernel that any CubeCL server of the process
//! compiles (wgpu's, on a machine without a GPU) to CubeCL's CUDA C++ compiler, with the
//! options the cuda backend uses on a Hopper GPU, and writes the source to a folder; [`nvrtc`]
//! compiles one such source the way the cuda backend does (NVRTC, `-lineinfo`, the toolkit's
//! headers), for an architecture of the caller's choice.
//!
//! The qdarts binary captures when `QDARTS_CUDA_SOURCES` names a folder; `tests/cuda.rs`
//! compiles what a search step of each kind launches. The kernels are those wgpu launched: a
//! kernel that chooses its code from the device's properties (Burn's matrix products, for one)
//! is compiled with the variant wgpu chose, not the one a CUDA device would pick. qdarts' own
//! kernels choose nothing from the device.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use cubecl_cuda::compiler::{CudaBackend, CudaCompilationOptions, CudaCompiler};
use cubecl_server::compiler::Compiler;
use cubecl_server::kernel::{CubeKernel, define_kernel, set_kernel_tap};

/// The file name of a captured kernel: `NNNN-<name>.cu`, or `NNNN-<name>.err` with the
/// reason when CubeCL's CUDA C++ compiler refused it. The first line of either is `// ` and
/// the kernel's full name (its Rust type).
pub const SOURCE_EXT: &str = "cu";
/// See [`SOURCE_EXT`].
pub const REFUSED_EXT: &str = "err";

static FOLDER: OnceLock<PathBuf> = OnceLock::new();
static CAPTURED: AtomicUsize = AtomicUsize::new(0);

/// Writes every kernel compiled from now on (the first launch of each variant, on any CubeCL
/// server of this process) into `dir` as CUDA C++ (see [`SOURCE_EXT`]). `dir` must exist. An
/// error when a capture was already started in this process.
pub fn capture_into(dir: &Path) -> Result<(), String> {
    if !dir.is_dir() {
        return Err(format!("{}: no such folder", dir.display()));
    }
    if FOLDER.set(dir.to_path_buf()).is_err() || !set_kernel_tap(write_kernel) {
        return Err("kernels are already being captured in this process".into());
    }
    Ok(())
}

/// The tap: runs on the server thread that compiles `kernel`, so it reports by file only.
fn write_kernel(kernel: &dyn CubeKernel) {
    let Some(dir) = FOLDER.get() else { return };
    let n = CAPTURED.fetch_add(1, Ordering::Relaxed);
    let name = kernel.name();
    let (ext, text) = match to_cuda(kernel) {
        Ok(source) => (SOURCE_EXT, source),
        Err(why) => (REFUSED_EXT, why),
    };
    let file = dir.join(format!("{n:04}-{}.{ext}", short_name(name)));
    // Nowhere to report a failed write from this thread: the file is missing, and the
    // numbering shows the gap.
    let _ = std::fs::write(file, format!("// {name}\n{text}"));
}

/// `kernel` through CubeCL's CUDA C++ compiler, with the options the cuda backend sets for a
/// compute capability 9.0 GPU (`vendor/cubecl-cuda/src/runtime.rs`).
fn to_cuda(kernel: &dyn CubeKernel) -> Result<String, String> {
    let definition = define_kernel(kernel).map_err(|e| format!("expansion failed: {e}"))?;
    let mut options = CudaCompilationOptions::default();
    let cpp = &mut options.cpp;
    cpp.warp_size = 32;
    cpp.supports_features.fast_math = true;
    cpp.supports_features.dp4a = true;
    cpp.supports_features.grid_constants = true;
    cpp.supports_features.fast_tanh = true;
    cpp.supports_features.clusters = true;
    cpp.supports_features.elect_sync = true;
    let repr = CudaCompiler::new(CudaBackend::Cpp)
        .compile(definition, &options)
        .map_err(|e| format!("CubeCL's CUDA C++ compiler refused it: {e}"))?;
    Ok(repr.to_string())
}

/// The last path segment of a kernel's type name, without generics, as a file name.
fn short_name(name: &str) -> String {
    let plain = name.split('<').next().unwrap_or(name);
    let last = plain.rsplit("::").next().unwrap_or(plain);
    last.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect()
}

/// Whether this process can load NVRTC (`libnvrtc.so`, found the way the cuda backend finds
/// it: the loader's path, `LD_LIBRARY_PATH`).
pub fn nvrtc_available() -> bool {
    // SAFETY: only loads the library (if it can) and keeps it for the process; calls nothing.
    #[allow(unsafe_code)]
    unsafe {
        cudarc::nvrtc::sys::is_culib_present()
    }
}

/// Compiles CUDA C++ `source` to PTX with NVRTC as the cuda backend does (`-lineinfo`, the
/// headers in `include`), for `arch` (e.g. `sm_90a`). The PTX's length, or NVRTC's log.
/// Call only when [`nvrtc_available`].
pub fn nvrtc(source: &str, include: &Path, arch: &'static str) -> Result<usize, String> {
    let options = cudarc::nvrtc::CompileOptions {
        arch: Some(arch),
        include_paths: vec![include.display().to_string()],
        options: vec!["-lineinfo".into()],
        ..Default::default()
    };
    match cudarc::nvrtc::compile_ptx_with_opts(source, options) {
        Ok(ptx) => Ok(ptx.to_src().len()),
        Err(cudarc::nvrtc::CompileError::CompileError { log, .. }) => {
            Err(log.to_string_lossy().into_owned())
        }
        Err(e) => Err(format!("{e:?}")),
    }
}
