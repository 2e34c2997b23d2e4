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

    /// The device of this backend, started and checked with a one-element tensor; an error
    /// names the cargo feature that enables a backend not compiled in, or says why a compiled-in
    /// backend could not start (no GPU, no driver).
    pub fn device(self) -> Result<Device> {
        let device = self.device_unchecked()?;
        if self == Backend::Flex {
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
        let probe = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            burn::tensor::Tensor::<1>::zeros([1], &device).into_data()
        }));
        std::panic::set_hook(hook);
        match probe {
            Ok(_) => Ok(device),
            Err(_) => {
                let why = first.lock().ok().and_then(|mut f| f.take());
                let why = why.unwrap_or_else(|| "no reason given".into());
                let hint = match self {
                    Backend::Wgpu => {
                        " (no GPU? Mesa's software Vulkan driver, Debian package \
                         `mesa-vulkan-drivers`, runs wgpu on the CPU)"
                    }
                    Backend::Cuda => " (needs an NVIDIA GPU and its driver)",
                    _ => "",
                };
                bail!("the {} backend could not start: {why}{hint}", self.name())
            }
        }
    }

    fn device_unchecked(self) -> Result<Device> {
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
