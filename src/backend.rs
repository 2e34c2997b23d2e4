//! Backend selection: the only place that names a backend. Model code takes a `&Device`.

use anyhow::{Result, bail};
use burn::tensor::Device;
use clap::ValueEnum;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
use qdarts_kernels::memory::GpuRuntime;

/// Which device of the backend: `--device cpu` or `--device cuda:N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceChoice {
    /// The host CPU (flex; LibTorch's CPU device).
    Cpu,
    /// NVIDIA GPU number N (cuda; LibTorch's CUDA device).
    Cuda(usize),
}

impl DeviceChoice {
    /// Parses `cpu`, `cuda` (GPU 0) or `cuda:N`.
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "cpu" => Ok(DeviceChoice::Cpu),
            "cuda" => Ok(DeviceChoice::Cuda(0)),
            _ => match s.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(n)) => Ok(DeviceChoice::Cuda(n)),
                _ => bail!("--device `{s}`: expected `cpu`, `cuda` or `cuda:N` (N a GPU number)"),
            },
        }
    }

    /// As written on the command line.
    pub fn name(self) -> String {
        match self {
            DeviceChoice::Cpu => "cpu".into(),
            DeviceChoice::Cuda(n) => format!("cuda:{n}"),
        }
    }
}

/// How the CubeCL runtimes (cuda, wgpu) pool GPU memory: `--memory-pools`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MemoryPools {
    /// One page per allocation from size buckets: a supernet's step spends far less host time
    /// allocating, at the cost of memory (each page at least its bucket's running average).
    Exclusive,
    /// CubeCL's default: allocations carved from shared pages, less memory, more host time per
    /// allocation while thousands of tensors are alive.
    Adaptive,
}

impl MemoryPools {
    /// As written on the command line.
    pub fn name(self) -> &'static str {
        match self {
            MemoryPools::Exclusive => "exclusive",
            MemoryPools::Adaptive => "adaptive",
        }
    }
}

/// The pools a started device serves its allocations from, as its pool report shows them
/// (exclusive pages list no pool that carves shared pages): `None` without a CubeCL pool
/// (flex, tch).
pub fn pools_in_use(device: &Device) -> Option<MemoryPools> {
    device.memory_pool_usage()?;
    let shared = device.memory_pool_report().is_some_and(|r| !r.is_empty());
    Some(if shared { MemoryPools::Adaptive } else { MemoryPools::Exclusive })
}

/// A compute backend, chosen at run time among those compiled in (cargo features).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    /// Pure-Rust CPU backend (default feature `flex`).
    Flex,
    /// Any GPU through wgpu (Vulkan, Metal, DX12); feature `wgpu`.
    Wgpu,
    /// NVIDIA GPUs through CubeCL; feature `cuda`.
    Cuda,
    /// LibTorch (deprecated by Burn; for users who already have it); feature `tch`.
    Tch,
}

impl BackendKind {
    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Flex => "flex",
            BackendKind::Wgpu => "wgpu",
            BackendKind::Cuda => "cuda",
            BackendKind::Tch => "tch",
        }
    }

    /// The device each backend uses when `--device` names none.
    pub fn default_device(self) -> Option<DeviceChoice> {
        match self {
            BackendKind::Flex | BackendKind::Tch => Some(DeviceChoice::Cpu),
            BackendKind::Cuda => Some(DeviceChoice::Cuda(0)),
            // wgpu picks its adapter itself (`CUBECL_WGPU_DEFAULT_DEVICE` overrides it).
            BackendKind::Wgpu => None,
        }
    }
}

/// Where a command's models run: the backend, its device and its memory pools, as the command
/// line chose them. A value handed to whatever makes a device; nothing about it is kept
/// process-wide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backend {
    kind: BackendKind,
    /// `--device`, when given.
    device: Option<DeviceChoice>,
    /// `--memory-pools`, when given.
    pools: Option<MemoryPools>,
}

impl Backend {
    /// The pure-Rust CPU backend on its one device (the tests' backend).
    #[cfg(test)]
    pub const FLEX: Backend = Backend { kind: BackendKind::Flex, device: None, pools: None };

    /// `kind` on `device` (`--device`) with `pools` (`--memory-pools`), each checked against
    /// the backend: an error says which flag does not go with which backend.
    pub fn choose(
        kind: BackendKind,
        device: Option<&str>,
        pools: Option<MemoryPools>,
    ) -> Result<Backend> {
        let device = device.map(|text| Self::check_device(kind, text)).transpose()?;
        if let Some(pools) = pools
            && !matches!(kind, BackendKind::Cuda | BackendKind::Wgpu)
        {
            bail!(
                "--memory-pools {} does not go with --backend {}: it chooses the CubeCL \
                 runtimes' GPU memory pools (--backend cuda or wgpu)",
                pools.name(),
                kind.name()
            );
        }
        Ok(Backend { kind, device, pools })
    }

    fn check_device(kind: BackendKind, text: &str) -> Result<DeviceChoice> {
        let choice = DeviceChoice::parse(text)?;
        let fits = matches!(
            (kind, choice),
            (BackendKind::Flex, DeviceChoice::Cpu)
                | (BackendKind::Tch, _)
                | (BackendKind::Cuda, DeviceChoice::Cuda(_))
        );
        if !fits {
            let takes = match kind {
                BackendKind::Flex => "only `cpu`",
                BackendKind::Cuda => "`cuda:N`",
                BackendKind::Wgpu => {
                    "no --device (it picks its adapter; set CUBECL_WGPU_DEFAULT_DEVICE to choose)"
                }
                BackendKind::Tch => unreachable!("tch takes every device"),
            };
            bail!("--device {text} does not go with --backend {}: it takes {takes}", kind.name());
        }
        Ok(choice)
    }

    /// The backend.
    pub fn kind(self) -> BackendKind {
        self.kind
    }

    /// The backend's name on the command line and in reports.
    pub fn name(self) -> &'static str {
        self.kind.name()
    }

    /// The pools asked for: `--memory-pools`, else exclusive pages.
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    pub fn chosen_pools(self) -> MemoryPools {
        self.pools.unwrap_or(MemoryPools::Exclusive)
    }

    /// The device in use: `--device`, else the backend's default.
    pub fn chosen_device(self) -> Option<DeviceChoice> {
        self.device.or_else(|| self.kind.default_device())
    }

    /// The backend with its device, for reports and file names: `flex`, `tch-cpu`,
    /// `tch-cuda0`, `cuda` (GPU 0), `cuda1`.
    pub fn label(self) -> String {
        match (self.kind, self.chosen_device()) {
            (BackendKind::Tch, Some(DeviceChoice::Cpu)) => "tch-cpu".into(),
            (BackendKind::Tch, Some(DeviceChoice::Cuda(n))) => format!("tch-cuda{n}"),
            (BackendKind::Cuda, Some(DeviceChoice::Cuda(n))) if n > 0 => format!("cuda{n}"),
            _ => self.name().to_string(),
        }
    }

    /// `--device` and `--memory-pools` as given, for a child process of the same backend (a
    /// local sweep's trials).
    pub fn device_args(self) -> Vec<String> {
        let mut args = self.device.map_or_else(Vec::new, |d| vec!["--device".into(), d.name()]);
        if let Some(p) = self.pools {
            args.extend(["--memory-pools".into(), p.name().into()]);
        }
        args
    }

    /// The device of this backend, started and checked with a one-element tensor; an error
    /// names the cargo feature that enables a backend not compiled in, or says why a compiled-in
    /// backend could not start (no GPU, no driver).
    pub fn device(self) -> Result<Device> {
        let device = self.device_unchecked()?;
        if self.kind == BackendKind::Flex {
            return Ok(device);
        }
        // GPU runtimes report a missing adapter or driver by panicking on first use, often on
        // a worker thread (the caller then sees only a closed channel): keep the first message.
        let first = std::sync::Arc::new(std::sync::Mutex::new(None::<String>));
        let hook = std::panic::take_hook();
        let seen = first.clone();
        std::panic::set_hook(Box::new(move |info| {
            let payload = info.payload();
            let msg = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "no reason given".into());
            if let Ok(mut f) = seen.lock() {
                f.get_or_insert(msg);
            }
        }));
        // An elementwise kernel, not only an allocation: cuda compiles its kernels at run time
        // (NVRTC, the CUDA toolkit's headers), wgpu its shaders, and either can be missing.
        let probe = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            (burn::tensor::Tensor::<1>::zeros([1], &device) + 1.0).into_data()
        }));
        std::panic::set_hook(hook);
        match probe {
            Ok(_) => Ok(device),
            Err(_) => {
                let why = first.lock().ok().and_then(|mut f| f.take());
                let mut why = why.unwrap_or_else(|| "no reason given".into());
                // cudarc lists every library name it tried: the first clause says it.
                if let Some(i) = why.find(" - searched for library names") {
                    why.truncate(i);
                }
                let hint = match self.kind {
                    BackendKind::Wgpu => {
                        " (no GPU? Mesa's software Vulkan driver, Debian package \
                         `mesa-vulkan-drivers`, runs wgpu on the CPU)"
                    }
                    BackendKind::Cuda => {
                        " (needs an NVIDIA GPU and its driver, libcuda.so, and the CUDA \
                         toolkit's NVRTC, libnvrtc.so, and headers, found through CUDA_PATH or \
                         /usr/local/cuda)"
                    }
                    BackendKind::Tch => {
                        " (LibTorch's CUDA device needs an NVIDIA GPU and its driver)"
                    }
                    BackendKind::Flex => "",
                };
                bail!("the {} backend could not start: {why}{hint}", self.name())
            }
        }
    }

    /// The device, not yet started. The CubeCL runtimes get exclusive memory pages (see
    /// `qdarts_kernels::memory`), in which a supernet's step spends less host time, unless
    /// `--memory-pools adaptive` keeps CubeCL's default.
    fn device_unchecked(self) -> Result<Device> {
        #[cfg(any(feature = "wgpu", feature = "cuda"))]
        let exclusive = self.chosen_pools() == MemoryPools::Exclusive;
        match self.kind {
            #[cfg(feature = "flex")]
            BackendKind::Flex => Ok(Device::flex()),
            #[cfg(feature = "wgpu")]
            BackendKind::Wgpu => {
                if exclusive {
                    qdarts_kernels::memory::prefer_exclusive_pages(GpuRuntime::WgpuDefault);
                }
                Ok(Device::wgpu(burn::tensor::DeviceKind::DefaultDevice))
            }
            #[cfg(feature = "cuda")]
            BackendKind::Cuda => match self.chosen_device() {
                Some(DeviceChoice::Cuda(n)) => {
                    if exclusive {
                        qdarts_kernels::memory::prefer_exclusive_pages(GpuRuntime::Cuda);
                    }
                    Ok(Device::cuda(n))
                }
                other => bail!("--backend cuda cannot run on {other:?}"),
            },
            #[cfg(feature = "tch")]
            #[allow(deprecated)]
            BackendKind::Tch => match self.chosen_device() {
                Some(DeviceChoice::Cuda(n)) => tch_cuda(n),
                _ => Ok(Device::libtorch()),
            },
            #[allow(unreachable_patterns)]
            other => bail!(
                "backend `{}` is not compiled into this binary: rebuild with `--features {}`",
                other.name(),
                other.name()
            ),
        }
    }
}

/// The environment variable naming a folder into which every CubeCL kernel the process
/// compiles is written as the CUDA C++ the cuda backend would compile
/// (`qdarts_kernels::cuda_source`): how a machine without an NVIDIA GPU checks, with
/// `--backend wgpu`, that a run's kernels compile for one.
pub const CUDA_SOURCES_ENV: &str = "QDARTS_CUDA_SOURCES";

/// Starts the capture [`CUDA_SOURCES_ENV`] asks for, making its folder; nothing when unset.
pub fn capture_cuda_sources_from_env() -> Result<()> {
    let Some(dir) = std::env::var_os(CUDA_SOURCES_ENV) else { return Ok(()) };
    let dir = std::path::PathBuf::from(dir);
    #[cfg(feature = "cuda")]
    {
        use anyhow::Context;
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("{CUDA_SOURCES_ENV}: making {}", dir.display()))?;
        qdarts_kernels::cuda_source::capture_into(&dir)
            .map_err(|e| anyhow::anyhow!("{CUDA_SOURCES_ENV}: {e}"))
    }
    #[cfg(not(feature = "cuda"))]
    bail!(
        "{CUDA_SOURCES_ENV}={}: this build has no CUDA C++ compiler to write kernels with \
         (build with --features cuda)",
        dir.display()
    )
}

/// Whether the device's tensors live in memory that neither the Rust heap counters nor a
/// CubeCL pool see (LibTorch's allocators), so that a peak measured here would be wrong.
pub fn allocates_outside_rust(device: &Device) -> bool {
    #[cfg(feature = "tch")]
    {
        matches!(device.clone().inner().as_dispatch(), burn::backend::DispatchDevice::LibTorch(_))
    }
    #[cfg(not(feature = "tch"))]
    {
        let _ = device;
        false
    }
}

/// LibTorch's CUDA device `n`, after asking LibTorch whether it sees that GPU: LibTorch's own
/// failure on a machine without one is a C++ exception that aborts the process.
#[cfg(feature = "tch")]
#[allow(deprecated)]
fn tch_cuda(n: usize) -> Result<Device> {
    let count = tch::Cuda::device_count();
    if count <= 0 || n >= count as usize {
        let seen = if count <= 0 {
            "LibTorch sees no CUDA GPU: no NVIDIA GPU, or its driver (libcuda.so) is missing or \
             could not be loaded"
                .to_string()
        } else {
            format!("LibTorch sees {count} CUDA GPU(s), numbered from 0")
        };
        bail!("the tch backend could not start on cuda:{n}: {seen}");
    }
    Ok(Device::libtorch_cuda(n))
}
