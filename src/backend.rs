//! Backend selection: the only place that names a backend. Model code takes a `&Device`.

use anyhow::{Result, bail};
use burn::tensor::Device;
use clap::ValueEnum;

/// A compute backend, chosen at run time among those compiled in (cargo features).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// Pure-Rust CPU backend (default feature `flex`).
    Flex,
    /// Any GPU through wgpu (Vulkan, Metal, DX12); feature `wgpu`.
    Wgpu,
    /// NVIDIA GPUs through CubeCL; feature `cuda`.
    Cuda,
    /// LibTorch (deprecated by Burn; for users who already have it); feature `tch`.
    Tch,
}

impl Backend {
    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Flex => "flex",
            Backend::Wgpu => "wgpu",
            Backend::Cuda => "cuda",
            Backend::Tch => "tch",
        }
    }

    /// The device of this backend, or an error naming the cargo feature that enables it.
    pub fn device(self) -> Result<Device> {
        match self {
            #[cfg(feature = "flex")]
            Backend::Flex => Ok(Device::flex()),
            #[cfg(feature = "wgpu")]
            Backend::Wgpu => Ok(Device::wgpu(burn::tensor::DeviceKind::DefaultDevice)),
            #[cfg(feature = "cuda")]
            Backend::Cuda => Ok(Device::cuda(0)),
            #[cfg(feature = "tch")]
            #[allow(deprecated)]
            Backend::Tch => Ok(Device::libtorch()),
            #[allow(unreachable_patterns)]
            other => bail!(
                "backend `{}` is not compiled into this binary: rebuild with `--features {}`",
                other.name(),
                other.name()
            ),
        }
    }
}
