//! The devices of the backends compiled into this build, for the test suites that run on each;
//! and seeded draws from a backend's process-wide generator.

use burn::tensor::{Device, Distribution, Shape, Tensor};

/// Flex (the default), and the other backends compiled in (`--features wgpu`, `--features cuda`,
/// `--features tch`; wgpu runs on Mesa's software Vulkan driver where there is no GPU, tch on
/// LibTorch's CPU device), each with its name. cuda is left out, with a note on stderr, on a
/// machine where it cannot start (no NVIDIA GPU or driver), unless `QDARTS_REQUIRE_CUDA` is
/// set, as on a GPU machine's check (`scripts/gpu_check.sh`). `QDARTS_TEST_BACKENDS` (a
/// comma-separated list of names, e.g. `cuda,tch`) keeps only those: one backend's failure then
/// does not hide another's.
///
/// # Panics
/// If `QDARTS_REQUIRE_CUDA` is set and cuda does not start, or `QDARTS_TEST_BACKENDS` names a
/// backend this build lacks.
#[allow(clippy::vec_init_then_push)] // Each push has its own feature gate.
pub fn compiled() -> Vec<(&'static str, Device)> {
    let all = every_compiled();
    let Some(list) = std::env::var_os("QDARTS_TEST_BACKENDS") else {
        return all;
    };
    let list = list.to_string_lossy().into_owned();
    let wanted: Vec<&str> = list.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
    for w in &wanted {
        assert!(
            all.iter().any(|(name, _)| name == w),
            "QDARTS_TEST_BACKENDS names '{w}', which this build lacks or which does not start"
        );
    }
    all.into_iter().filter(|(name, _)| wanted.contains(name)).collect()
}

#[allow(clippy::vec_init_then_push)] // Each push has its own feature gate.
fn every_compiled() -> Vec<(&'static str, Device)> {
    #[allow(unused_mut)]
    let mut all = Vec::new();
    #[cfg(feature = "flex")]
    all.push(("flex", Device::flex()));
    #[cfg(feature = "wgpu")]
    all.push(("wgpu", Device::wgpu(burn::tensor::DeviceKind::DefaultDevice)));
    #[cfg(feature = "cuda")]
    if let Some(d) = cuda() {
        all.push(("cuda", d));
    }
    #[cfg(feature = "tch")]
    #[allow(deprecated)]
    all.push(("tch", Device::libtorch()));
    all
}

/// CUDA device 0 when it starts (one element goes there and back), else `None` with a note.
#[cfg(feature = "cuda")]
fn cuda() -> Option<Device> {
    use std::sync::OnceLock;
    static STARTS: OnceLock<bool> = OnceLock::new();
    let starts = *STARTS.get_or_init(|| {
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let ok = std::panic::catch_unwind(|| {
            burn::tensor::Tensor::<1>::zeros([1], &Device::cuda(0)).into_data()
        })
        .is_ok();
        std::panic::set_hook(hook);
        if !ok {
            assert!(
                std::env::var_os("QDARTS_REQUIRE_CUDA").is_none(),
                "QDARTS_REQUIRE_CUDA is set but the cuda backend does not start"
            );
            eprintln!("note: cuda does not start here (no NVIDIA GPU or driver): not tested");
        }
        ok
    });
    starts.then(|| Device::cuda(0))
}

/// Serializes seeding and use of the backend's process-wide generator.
static SEED_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Seeds `device`'s generator and the host's (flex's, which [`random`] draws from) and runs
/// `draw` (which draws initial weights or random inputs) while no other seeded block of this
/// process can interleave its draws: a backend's generator is one per process, and two
/// searches (or two tests) in one process would otherwise take numbers from each other. Blocks
/// must not nest.
pub fn seeded<T>(device: &Device, seed: u64, draw: impl FnOnce() -> T) -> T {
    let _guard = SEED_LOCK.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let _inside = InSeeded::enter();
    #[cfg(feature = "flex")]
    Device::flex().seed(seed);
    device.seed(seed);
    draw()
}

std::thread_local! {
    /// Whether this thread is inside a [`seeded`] block (and so holds [`SEED_LOCK`]).
    static IN_SEEDED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Marks this thread as inside a [`seeded`] block until dropped (a panic included).
struct InSeeded;

impl InSeeded {
    fn enter() -> Self {
        IN_SEEDED.with(|f| f.set(true));
        InSeeded
    }
}

impl Drop for InSeeded {
    fn drop(&mut self) {
        IN_SEEDED.with(|f| f.set(false));
    }
}

/// `Tensor::random` drawn on the host, from flex's generator, and copied to `device`: a seeded
/// initialisation (inside [`seeded`]) is then the same numbers on every backend, so that a
/// search on a GPU starts from the supernet the CPU's starts from (each CubeCL and LibTorch
/// backend has a generator of its own, with other numbers for the same seed). On flex it is
/// `Tensor::random` itself. A build without flex draws on `device`.
///
/// Outside a [`seeded`] block the draw waits for the lock, so that an unseeded draw (a test's
/// random input, say) never takes numbers from the middle of another thread's seeded block.
pub fn random<const D: usize>(
    shape: impl Into<Shape>,
    distribution: Distribution,
    device: &Device,
) -> Tensor<D> {
    let _guard = (!IN_SEEDED.with(std::cell::Cell::get))
        .then(|| SEED_LOCK.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
    #[cfg(feature = "flex")]
    {
        let host = Device::flex();
        let drawn = Tensor::<D>::random(shape, distribution, &host);
        Tensor::from_data(drawn.into_data(), device)
    }
    #[cfg(not(feature = "flex"))]
    Tensor::random(shape, distribution, device)
}
