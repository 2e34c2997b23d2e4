//! `memory::prefer_exclusive_pages`: a wgpu device started after the call serves its
//! allocations from exclusive pages (Burn's pool report lists only pools that carve shared
//! pages) and computes as before; the call has no effect once the device has started. For
//! cuda, the setting is taken once per process (a GPU machine's check runs the binary with it).
//!
//! How exclusive pages are reused (`vendor/README.md`), on CubeCL's memory management over
//! host memory, where every allocation is the test's own: a freed page goes to the next
//! allocation of its size, found among thousands kept alive, and a small allocation does not
//! take a large free page from the allocation it was made for (also through a wgpu device).

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

#[cfg(feature = "wgpu")]
mod wgpu {
    use burn::tensor::{Device, DeviceKind, Tensor, TensorData};
    use qdarts_kernels::memory::{GpuRuntime, prefer_exclusive_pages};
    use std::sync::{Mutex, MutexGuard, OnceLock};

    /// The default wgpu device, started with exclusive pages by the first test that asks
    /// (`None` without an adapter), and a lock: the pool figures are the device's, not a
    /// test's, so the tests take turns.
    fn device() -> Option<(Device, MutexGuard<'static, ()>)> {
        static STARTED: OnceLock<bool> = OnceLock::new();
        static SERIAL: Mutex<()> = Mutex::new(());
        let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        if !*STARTED.get_or_init(|| prefer_exclusive_pages(GpuRuntime::WgpuDefault)) {
            eprintln!("no wgpu adapter: skipped");
            return None;
        }
        Some((Device::wgpu(DeviceKind::DefaultDevice), serial))
    }

    fn reserved(device: &Device) -> u64 {
        device.memory_pool_usage().unwrap().bytes_reserved
    }

    fn filled(n: usize, device: &Device) -> Tensor<1> {
        let v: Vec<f32> = (0..n).map(|i| (i % 97) as f32 - 48.0).collect();
        Tensor::<1>::from_data(TensorData::new(v, [n]), device)
    }

    /// Waits for the device, so that what the pool holds is what the tensors alive hold.
    fn settle(x: &Tensor<1>) {
        let _ = x.clone().slice(0..1).into_data();
    }

    #[test]
    fn started_after_the_call_it_has_exclusive_pages() {
        let Some((device, _serial)) = device() else { return };
        // Allocations of several sizes, kept alive together, and some arithmetic on them.
        let xs: Vec<Tensor<1>> = (1..=6).map(|k| filled(1000 * k * k, &device)).collect();
        for (k, x) in xs.iter().enumerate() {
            let n = 1000 * (k + 1) * (k + 1);
            let got = x.clone().mul_scalar(2.0).sum().into_scalar::<f32>();
            let want: f64 = (0..n).map(|i| 2.0 * ((i % 97) as f64 - 48.0)).sum();
            let close = (got as f64 - want).abs() <= 1e-3 * want.abs().max(1.0);
            assert!(close, "{k}: {got} vs {want}");
        }
        let usage = device.memory_pool_usage().unwrap();
        assert!(usage.bytes_in_use > 0 && usage.bytes_reserved >= usage.bytes_in_use, "{usage:?}");
        let report = device.memory_pool_report().unwrap();
        assert!(report.is_empty(), "pools that carve shared pages: {report:?}");
        // Started: its pools are set.
        assert!(!prefer_exclusive_pages(GpuRuntime::WgpuDefault));
    }

    #[test]
    fn a_small_allocation_leaves_a_large_free_page_to_a_large_one() {
        let Some((device, _serial)) = device() else { return };
        let big = 1 << 20; // 4 MiB
        // Used a few times, so that the pool's periodic release keeps the page when it is free.
        for _ in 0..5 {
            let x = filled(big, &device);
            settle(&x);
        }
        // Small tensors, more than the smallest buckets have free pages for.
        let small: Vec<Tensor<1>> = (0..400).map(|_| filled(16, &device)).collect();
        settle(&small[0]);
        let before = reserved(&device);
        let y = filled(big, &device);
        settle(&y);
        let grown = reserved(&device).saturating_sub(before);
        assert!(grown < (4 * big) as u64, "the large page was taken: {grown} bytes more");
        drop(small);
    }
}

#[cfg(feature = "cube")]
mod pools {
    use cubecl::MemoryConfiguration;
    use cubecl::ir::MemoryDeviceProperties;
    use cubecl::logging::ServerLogger;
    use cubecl_server::memory_management::{
        ErrorGraph, ManagedMemoryHandle, MemoryManagement, MemoryManagementOptions, PageUpdate,
    };
    use cubecl_server::storage::BytesStorage;
    use std::sync::Arc;

    const KIB: u64 = 1024;
    const MIB: u64 = 1024 * KIB;

    fn exclusive() -> MemoryManagement<BytesStorage> {
        MemoryManagement::from_configuration(
            BytesStorage::default(),
            &MemoryDeviceProperties::new(128 * MIB, 32),
            MemoryConfiguration::ExclusivePages,
            Arc::new(ServerLogger::default()),
            MemoryManagementOptions::new("test"),
        )
    }

    fn reserve(memory: &mut MemoryManagement<BytesStorage>, size: u64) -> ManagedMemoryHandle {
        memory.reserve(size, PageUpdate::Allow, &mut ErrorGraph::default()).unwrap()
    }

    /// Pages the dynamic pools hold now, and the most they held at once (the sum of each
    /// bucket's own peak: an upper bound where buckets peak at different times).
    fn pages(memory: &MemoryManagement<BytesStorage>) -> (u64, u64) {
        let report = memory.memory_report();
        (
            report.dynamic.iter().map(|p| p.pages).sum(),
            report.dynamic.iter().map(|p| p.pages_peak).sum(),
        )
    }

    /// Two live handles never share a page.
    fn distinct(handles: &[ManagedMemoryHandle]) {
        let mut seen = std::collections::HashSet::new();
        for h in handles {
            let location = h.descriptor().location();
            assert!(seen.insert(format!("{location:?}")), "page handed out twice: {location:?}");
        }
    }

    #[test]
    fn a_freed_page_is_found_among_thousands_kept_alive() {
        let mut memory = exclusive();
        let size = 8 * KIB;
        let kept: Vec<_> = (0..3000).map(|_| reserve(&mut memory, size)).collect();
        // Temporaries, each freed before the next is made: one page serves them all.
        for _ in 0..300 {
            drop(reserve(&mut memory, size));
        }
        assert!(pages(&memory).1 <= 3001, "temporaries: {:?}", pages(&memory));
        // Rounds of 1 500 made, kept together, then freed, behind the 3 000 kept throughout,
        // as a step's activations are: each round gets the pages the round before freed. A
        // pool that did not find them would hold a new page per allocation until its periodic
        // release (1 000 allocations at the earliest) freed the old ones.
        for round in 0..6 {
            let now: Vec<_> = (0..1500).map(|_| reserve(&mut memory, size)).collect();
            let mut all = kept.clone();
            all.extend(now.iter().cloned());
            distinct(&all);
            // A freed page may wait for the sweep that finds it (64 pages a reservation).
            let (held, peak) = pages(&memory);
            assert!(peak <= 3001 + 1500 + 64, "round {round}: {held} pages held, {peak} at most");
        }
    }

    #[test]
    fn pages_freed_in_any_order_are_reused_and_never_shared() {
        let mut memory = exclusive();
        // Sizes of three buckets, freed in a scrambled order (a fixed linear congruence).
        let sizes = [3 * KIB, 40 * KIB, 700 * KIB];
        let mut live: Vec<Option<ManagedMemoryHandle>> =
            (0..1200).map(|i| Some(reserve(&mut memory, sizes[i % 3]))).collect();
        let first = pages(&memory).0;
        let mut state = 12345u64;
        for _ in 0..6000 {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let i = (state >> 33) as usize % live.len();
            live[i] = match live[i].take() {
                Some(_) => None,
                None => Some(reserve(&mut memory, sizes[i % 3])),
            };
            if state.is_multiple_of(97) {
                distinct(&live.iter().flatten().cloned().collect::<Vec<_>>());
            }
        }
        distinct(&live.iter().flatten().cloned().collect::<Vec<_>>());
        // Never more pages than the first 1 200, and a sweep's worth per bucket.
        let (_, peak) = pages(&memory);
        assert!(peak <= first + 3 * 64, "{peak} pages at most, {first} at first");
    }

    #[test]
    fn a_small_allocation_leaves_a_large_free_page_to_a_large_one() {
        let mut memory = exclusive();
        // Used a few times, so that the periodic release keeps the page when it is free.
        for _ in 0..5 {
            drop(reserve(&mut memory, 4 * MIB));
        }
        let small = reserve(&mut memory, 16);
        let before = memory.memory_report().usage().bytes_reserved;
        let large = reserve(&mut memory, 4 * MIB);
        let grown = memory.memory_report().usage().bytes_reserved - before;
        assert!(grown < 4 * MIB, "the large page went to 16 bytes: {grown} bytes more");
        distinct(&[small, large]);
    }
}

#[cfg(feature = "cuda")]
#[test]
fn cuda_setting_is_taken_once() {
    use qdarts_kernels::memory::{GpuRuntime, prefer_exclusive_pages};
    assert!(prefer_exclusive_pages(GpuRuntime::Cuda));
    assert!(!prefer_exclusive_pages(GpuRuntime::Cuda));
}
