//! `memory::prefer_exclusive_pages`: a wgpu device started after the call serves its
//! allocations from exclusive pages (Burn's pool report lists only pools that carve shared
//! pages) and computes as before; the call has no effect once the device has started. For
//! cuda, the setting is taken once per process (a GPU machine's check runs the binary with it).

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

#[cfg(feature = "wgpu")]
#[test]
fn wgpu_started_after_the_call_has_exclusive_pages() {
    use burn::tensor::{Device, DeviceKind, Tensor, TensorData};
    use qdarts_kernels::memory::{GpuRuntime, prefer_exclusive_pages};

    if !prefer_exclusive_pages(GpuRuntime::WgpuDefault) {
        eprintln!("no wgpu adapter: skipped");
        return;
    }
    let device = Device::wgpu(DeviceKind::DefaultDevice);
    // Allocations of several sizes, kept alive together, and some arithmetic on them.
    let xs: Vec<Tensor<1>> = (1..=6)
        .map(|k| {
            let n = 1000 * k * k;
            let v: Vec<f32> = (0..n).map(|i| (i % 97) as f32 - 48.0).collect();
            Tensor::<1>::from_data(TensorData::new(v, [n]), &device)
        })
        .collect();
    for (k, x) in xs.iter().enumerate() {
        let n = 1000 * (k + 1) * (k + 1);
        let got = x.clone().mul_scalar(2.0).sum().into_scalar::<f32>();
        let want: f64 = (0..n).map(|i| 2.0 * ((i % 97) as f64 - 48.0)).sum();
        assert!((got as f64 - want).abs() <= 1e-3 * want.abs().max(1.0), "{k}: {got} vs {want}");
    }
    let usage = device.memory_pool_usage().unwrap();
    assert!(usage.bytes_in_use > 0 && usage.bytes_reserved >= usage.bytes_in_use, "{usage:?}");
    let report = device.memory_pool_report().unwrap();
    assert!(report.is_empty(), "pools that carve shared pages: {report:?}");
    // Started: its pools are set.
    assert!(!prefer_exclusive_pages(GpuRuntime::WgpuDefault));
}

#[cfg(feature = "cuda")]
#[test]
fn cuda_setting_is_taken_once() {
    use qdarts_kernels::memory::{GpuRuntime, prefer_exclusive_pages};
    assert!(prefer_exclusive_pages(GpuRuntime::Cuda));
    assert!(!prefer_exclusive_pages(GpuRuntime::Cuda));
}
