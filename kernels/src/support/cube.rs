//! Buffers, launch grids and the in-cube sum shared by the CubeCL kernels (fused fake-quant,
//! BatchNorm, the optimizer step, ...).

use burn::tensor::DType;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::{calculate_cube_count_elemwise, prelude::*};

/// A contiguous uninitialised tensor of `t`'s shape and dtype on its device.
pub(crate) fn empty_like(t: &CubeTensor) -> CubeTensor {
    empty_shaped(t, t.meta.shape().to_vec())
}

/// A contiguous uninitialised tensor of `shape` with `t`'s dtype on its device.
pub(crate) fn empty_shaped(t: &CubeTensor, shape: Vec<usize>) -> CubeTensor {
    empty_device_contiguous_dtype(t.client.clone(), t.device.clone(), shape.into(), t.dtype)
}

/// The threads of a cube that reduces `count` values with [`cube_sum`] (or another tree): a
/// power of two from 32 to 256, one thread per 32 values. The tree costs a barrier per halving,
/// and where a driver runs a cube's threads on a CPU (lavapipe) every barrier switches between
/// all its groups of threads: a cube far wider than its values is mostly barriers.
pub(crate) fn reduce_units(count: usize) -> u32 {
    (count / 32).next_power_of_two().clamp(32, 256) as u32
}

/// The sum of every unit's `value` over the cube (a tree in `shared`, `CUBE_DIM_X` long, in a
/// fixed order), returned to every unit; `shared` is free again on return.
#[cube]
pub(crate) fn cube_sum(shared: &mut Shared<[f32]>, value: f32) -> f32 {
    let unit = UNIT_POS_X as usize;
    shared[unit] = value;
    sync_cube();
    let mut active = CUBE_DIM_X as usize / 2;
    while active > 0 {
        if unit < active {
            let other = shared[unit + active];
            shared[unit] += other;
        }
        sync_cube();
        active /= 2;
    }
    let total = shared[0];
    sync_cube();
    total
}

/// `round(v)` with ties away from zero or to even, exactly; NaN and ±∞ pass through.
#[cube]
pub(crate) fn round_ties(v: f32, #[comptime] ties_away: bool) -> f32 {
    let a = f32::abs(v);
    let fl = f32::floor(a);
    // Exact: `a` and `floor(a)` are non-negative and share an exponent range.
    let frac = a - fl;
    let up = if ties_away {
        frac >= 0.5
    } else {
        let half = fl * 0.5;
        let odd = half != f32::floor(half);
        frac > 0.5 || (frac == 0.5 && odd)
    };
    let r = select(up, fl + 1.0, fl);
    select(v < 0.0, -r, r)
}

/// The buffer offset of element `i` (in row-major order of its shape) of `x`, whatever its
/// strides. In 32 bits: [`f32_strided`] checks a tensor first.
#[cube]
pub(crate) fn strided_at(x: &Tensor<f32>, i: usize) -> usize {
    let mut rest = i as u32;
    let mut at = 0u32;
    let mut d = x.rank();
    while d > 0 {
        d -= 1;
        let size = x.shape(d) as u32;
        at += (rest % size) * x.stride(d) as u32;
        rest /= size;
    }
    at as usize
}

/// Element `i` (in row-major order) of `x`: through its strides, or at `i` when it is
/// contiguous.
#[cube]
pub(crate) fn read(x: &Tensor<f32>, i: usize, #[comptime] strided: bool) -> f32 {
    let mut at = i;
    if strided {
        at = strided_at(x, i);
    }
    x[at]
}

/// `v ≤ 0` (±0 and the negatives down to −∞; never NaN), decided on the bits. Vulkan's
/// shading languages let a driver assume that no float is NaN, and NVIDIA's rewrites
/// `select(v <= 0, 0, v)` into a `max` that drops a NaN; an integer comparison it cannot.
#[cube]
pub(crate) fn at_most_zero(v: f32) -> bool {
    let bits = u32::reinterpret(v);
    let magnitude = bits & 0x7fff_ffff;
    magnitude == 0 || (bits >= 0x8000_0000 && magnitude <= 0x7f80_0000)
}

/// `a < b` as IEEE 754 has it, false when either is NaN, also where the driver assumes
/// no NaN (see [`at_most_zero`]: it may turn `select(a < b, b, a)` into a `max` that returns
/// the number): `is_nan` is an integer test on every CubeCL backend, which it cannot fold.
#[cube]
pub(crate) fn lt(a: f32, b: f32) -> bool {
    !f32::is_nan(a) && !f32::is_nan(b) && a < b
}

/// `t`, checked to be f32 with every element count and buffer offset within the kernels'
/// 32-bit indices (`op` names the caller in the panic), for a kernel that reads it through
/// its strides.
pub(crate) fn f32_strided(t: CubeTensor, op: &str) -> CubeTensor {
    assert_eq!(t.dtype, DType::F32, "{op}: expected f32");
    let (dims, strides) = (t.meta.shape(), t.meta.strides());
    let last: usize = dims.iter().zip(strides.iter()).map(|(&d, &s)| d.saturating_sub(1) * s).sum();
    let fits = u32::try_from(last).is_ok() && u32::try_from(t.meta.num_elements()).is_ok();
    assert!(fits, "{op}: {:?} exceeds the kernels' u32 indices", t.meta.shape());
    t
}

/// [`f32_strided`] for each of `ts`, which must share one shape (`op` names the caller in
/// the panic).
pub(crate) fn f32_strided_alike<const N: usize>(ts: [CubeTensor; N], op: &str) -> [CubeTensor; N] {
    let ts = ts.map(|t| f32_strided(t, op));
    for t in &ts[1..] {
        assert_eq!(t.meta.shape(), ts[0].meta.shape(), "{op}: shapes differ");
    }
    ts
}

/// [`f32_strided`], laid out contiguously (copied when it is not).
pub(crate) fn f32_contiguous(t: CubeTensor, op: &str) -> CubeTensor {
    into_contiguous(f32_strided(t, op))
}

/// The launch grid of a one-thread-per-element kernel over `n` elements.
pub(crate) fn elementwise(client: &cubecl::client::Client, n: usize) -> (CubeCount, CubeDim) {
    let cube_dim = CubeDim::new(client, n);
    (calculate_cube_count_elemwise(client, n, cube_dim), cube_dim)
}

/// Where the parts of a [`packed`] buffer lie: part `t` is elements
/// `starts[t]..starts[t] + sizes[t]` of the flat buffer.
pub(crate) struct Packing {
    /// The flat buffer that one launch writes every part into.
    pub flat: CubeTensor,
    /// Each part's first element in `flat`, a multiple of the memory alignment.
    pub starts: Vec<usize>,
    /// Each part's shape.
    shapes: Vec<Vec<usize>>,
}

/// One uninitialised buffer with `t`'s dtype on its device holding parts of `shapes`, each
/// from an offset on the runtime's memory alignment, so that [`Packing::parts`] are views
/// of it (Burn's `slice` copies where a part's start or end is off that alignment).
pub(crate) fn packed(t: &CubeTensor, shapes: Vec<Vec<usize>>) -> Packing {
    let size = t.dtype.size();
    let align = (t.client.properties().memory.alignment as usize / size).max(1);
    let mut starts = Vec::with_capacity(shapes.len());
    let mut total = 0;
    for shape in &shapes {
        starts.push(total);
        total += shape.iter().product::<usize>().next_multiple_of(align);
    }
    Packing { flat: empty_shaped(t, vec![total.max(1)]), starts, shapes }
}

impl Packing {
    /// One past each part's last element in the flat buffer.
    pub fn ends(&self) -> impl Iterator<Item = usize> + '_ {
        let sizes = self.shapes.iter().map(|s| s.iter().product::<usize>());
        self.starts.iter().zip(sizes).map(|(start, n)| start + n)
    }

    /// Each part as a contiguous tensor of its shape, a view of the flat buffer (no copy).
    pub fn parts(self) -> Vec<CubeTensor> {
        let Packing { flat, starts, shapes } = self;
        let size = flat.dtype.size() as u64;
        let total = flat.meta.num_elements() as u64 * size;
        starts
            .into_iter()
            .zip(shapes)
            .map(|(start, shape)| {
                let (from, len) = (start as u64 * size, shape.iter().product::<usize>() as u64);
                let handle =
                    flat.handle.clone().offset_start(from).offset_end(total - from - len * size);
                let (client, device) = (flat.client.clone(), flat.device.clone());
                CubeTensor::new_contiguous(client, device, shape.into(), handle, flat.dtype)
            })
            .collect()
    }
}
