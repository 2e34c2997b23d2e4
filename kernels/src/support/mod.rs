//! What every kernel shares: the two device tests that decide which of this crate's kernels
//! run (flex's, or the CubeCL runtimes'), here; the element loops of the flex kernels
//! ([`lanes`]), their tensor I/O ([`flex`]) and the CubeCL kernels' buffers and launch grids
//! ([`cube`]).

use burn::tensor::{DType, Device};

/// Whether the flex kernels of this crate run for tensors on `device` with this dtype: f32 on
/// the flex device (autodiff or not), with the `flex` feature.
pub(crate) fn on_flex_f32(device: &Device, dtype: DType) -> bool {
    #[cfg(feature = "flex")]
    {
        dtype == DType::F32 && *device == Device::flex()
    }
    #[cfg(not(feature = "flex"))]
    {
        let _ = (device, dtype);
        false
    }
}

/// Whether `device` is one of Burn's CubeCL runtimes (wgpu, cuda), with the `cube` feature.
pub(crate) fn on_cube(device: &Device) -> bool {
    #[cfg(feature = "cube")]
    {
        matches!(device.clone().inner().as_dispatch(), burn::backend::DispatchDevice::Cube(_))
    }
    #[cfg(not(feature = "cube"))]
    {
        let _ = device;
        false
    }
}

pub(crate) mod autodiff;
#[cfg(feature = "cube")]
pub(crate) mod cube;
#[cfg(feature = "flex")]
pub(crate) mod flex;
pub(crate) mod lanes;
