//! Max and average pooling with their own forward and backward kernels on flex and on the
//! CubeCL backends.
//!
//! Every mixed op of a DARTS supernet holds a max and an average pool, so a search step runs
//! hundreds of them. Burn's flex pools visit the window of every output one element at a time,
//! and its max pool keeps an `i64` index per output for the backward pass. Here each
//! (image, channel) plane is one task of the rayon pool, laid out flat with its padding
//! (`Flat`), and the window is separable: one pass of `kw` contiguous runs along the rows,
//! then one of `kh` runs down the columns (so a 3×3 window costs six vector passes, not nine
//! scalar visits per output).
//!
//! - Max: the padding is −∞ and a NaN in the window wins (as in PyTorch and Burn). The backward
//!   pass recomputes the maxima instead of storing indices and routes each output's gradient to
//!   the first element of its window, in row-major order, that equals the maximum: the element
//!   the strict `>` scan of PyTorch and Burn picks. A window whose maximum is NaN passes no
//!   gradient.
//! - Average: the sum over the window divided by the number of input elements in it
//!   (`count_include_pad = false`, as DARTS' pools) or by the window size. The division is
//!   exact IEEE division, so averages of integers round as in the integer runtime.
//!
//! Only the summation order differs from Burn's pools (`tests/pool2d.rs` holds the two together).
//!
//! On the CubeCL backends (`wgpu`, `cuda`) the same four operations run as kernels over the
//! `[N, C, H, W]` layout itself, one thread per output (forward) or per input element
//! (backward), reading their inputs through their strides. Burn's CubeCL pools work on a
//! channels-last copy: a copy of the input forward, and of the input, the gradient (and the
//! max pool's indices) backward, each a launch of its own. The windows are summed in Burn's
//! order (row-major, from 0, then divided by the count), so the values are Burn's bit for bit;
//! the max pool's backward recomputes each window's first maximum instead of storing indices.
//!
//! [`avg_pool2d_rounded`] is the average pool of a fake-quantized activation that the integer
//! runtime computes on integers (`QPoolBN`): the average of `x`'s integers on its grid, rounded
//! once, with the float average's gradient. As tensor operations that is two pools and half a
//! dozen elementwise launches; here one pass on every backend with these kernels.
//!
//! Other backends, dtypes and options (dilation, ceil mode, asymmetric padding) use Burn's
//! pools ([`max_pool2d`] and [`avg_pool2d`] decide).

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::{AutodiffBackend, Backend, backend_extension, tensor::FloatTensor};
use burn::tensor::module;
use burn::tensor::ops::{AvgPoolOptions, MaxPoolOptions};
use burn::tensor::{DType, Device, Tensor};

use crate::plane::{Flat, PlaneGeom};

/// The pooling primitives: `x` `[N, C, H, W]`, dilation 1, symmetric padding.
#[backend_extension(Flex: cfg(feature = "flex"), Cube: cfg(feature = "cube"), Autodiff)]
pub trait PoolBackend: Backend {
    /// Max pooling, `[N, C, H', W']`.
    fn pool_max2d(x: FloatTensor<Self>, geom: PlaneGeom) -> FloatTensor<Self>;

    /// The gradient of the input of [`PoolBackend::pool_max2d`] from the input and the output's
    /// gradient.
    fn pool_max2d_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        geom: PlaneGeom,
    ) -> FloatTensor<Self>;

    /// Average pooling, `[N, C, H', W']`; `include_pad` counts the padding in the divisor.
    fn pool_avg2d(x: FloatTensor<Self>, geom: PlaneGeom, include_pad: bool) -> FloatTensor<Self>;

    /// The gradient of the input of [`PoolBackend::pool_avg2d`] from the output's gradient.
    fn pool_avg2d_backward(
        grad: FloatTensor<Self>,
        geom: PlaneGeom,
        include_pad: bool,
    ) -> FloatTensor<Self>;

    /// Average pooling of `x`'s integers on the grid `(mult, step)`, `[1]` (per tensor) or
    /// `[C]` (per channel): `qa = round(avg(round(x·mult)))`, returned as
    /// `avg + (qa·step − avg)` with `avg` the float average (see [`avg_pool2d_rounded`]).
    /// Differentiated as the float average; `mult` and `step` are constants.
    fn pool_avg2d_rounded(
        x: FloatTensor<Self>,
        mult: FloatTensor<Self>,
        step: FloatTensor<Self>,
        geom: PlaneGeom,
        rounding: Rounding,
    ) -> FloatTensor<Self>;
}

/// How [`PoolBackend::pool_avg2d_rounded`] counts and rounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rounding {
    /// Whether the padding counts in the divisor.
    pub include_pad: bool,
    /// Ties round away from zero (else to even).
    pub ties_away: bool,
}

/// Whether [`max_pool2d`] and [`avg_pool2d`] can run this module's kernels for tensors on
/// `device` with this dtype: f32 on flex or on a CubeCL backend.
pub fn pool_available(device: &Device, dtype: DType) -> bool {
    crate::support::on_flex_f32(device, dtype)
        || (dtype == DType::F32 && crate::support::on_cube(device))
}

/// The geometry of a pooling this module's kernels run: on flex or CubeCL f32, symmetric
/// padding of at most half the window (so no window is all padding), dilation 1, floor mode.
pub(crate) fn plane_geom(
    x: &Tensor<4>,
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [(usize, usize); 2],
) -> Option<PlaneGeom> {
    let [_, _, h, w] = x.dims();
    let symmetric = padding.iter().zip(kernel).all(|(&(b, e), k)| b == e && 2 * b <= k);
    (symmetric && pool_available(&x.device(), x.dtype())).then_some(PlaneGeom {
        input: [h, w],
        kernel,
        stride,
        padding: padding.map(|(b, _)| b),
        dilation: [1, 1],
    })
}

/// Burn's `max_pool2d`, run by this module's kernels where they apply.
pub fn max_pool2d(x: Tensor<4>, options: MaxPoolOptions<2>) -> Tensor<4> {
    let plain = options.dilation == [1, 1] && !options.ceil_mode;
    match plane_geom(&x, options.kernel_size, options.stride, options.padding).filter(|_| plain) {
        Some(geom) => Tensor::from_dispatch(<burn::backend::Dispatch as PoolBackend>::pool_max2d(
            x.into_dispatch(),
            geom,
        )),
        None => module::max_pool2d(x, options),
    }
}

/// Burn's `avg_pool2d`, run by this module's kernels where they apply.
pub fn avg_pool2d(x: Tensor<4>, options: AvgPoolOptions<2>) -> Tensor<4> {
    let geom = plane_geom(&x, options.kernel_size, options.stride, options.padding);
    match geom.filter(|_| !options.ceil_mode) {
        Some(geom) => Tensor::from_dispatch(<burn::backend::Dispatch as PoolBackend>::pool_avg2d(
            x.into_dispatch(),
            geom,
            options.count_include_pad,
        )),
        None => module::avg_pool2d(x, options),
    }
}

/// The average pool of `x`'s integers on a quantization grid, as the integer runtime pools a
/// fake-quantized activation: `q = round(x·mult)` (ties away from zero or to even), then
/// `qa = round(avg_pool(q))`; returned as `avg + (qa·step − avg)` with `avg = avg_pool(x)`, so
/// that the value is the dequantized integer average (up to the last bit of that sum) and the
/// gradient is the float average's. `mult` and `step` are `[1]` or one value per channel
/// (axis 1), and are not differentiated. The same bits as those tensor expressions with this
/// module's pools.
///
/// `None` where this module's kernels do not run (see [`pool_available`]; ceil mode, dilation,
/// asymmetric padding) or the grid has another length: the caller computes it as tensor
/// operations.
pub fn avg_pool2d_rounded(
    x: Tensor<4>,
    mult: Tensor<1>,
    step: Tensor<1>,
    ties_away: bool,
    options: AvgPoolOptions<2>,
) -> Option<Tensor<4>> {
    let geom = plane_geom(&x, options.kernel_size, options.stride, options.padding)
        .filter(|_| !options.ceil_mode)?;
    let c = x.dims()[1];
    let fits = |p: &Tensor<1>| {
        let n = p.dims()[0];
        (n == 1 || n == c) && p.dtype() == DType::F32 && p.device() == x.device()
    };
    if !fits(&mult) || !fits(&step) || mult.dims() != step.dims() {
        return None;
    }
    let rounding = Rounding { include_pad: options.count_include_pad, ties_away };
    Some(Tensor::from_dispatch(<burn::backend::Dispatch as PoolBackend>::pool_avg2d_rounded(
        x.into_dispatch(),
        mult.detach().into_dispatch(),
        step.detach().into_dispatch(),
        geom,
        rounding,
    )))
}

#[cfg(feature = "cube")]
pub(crate) mod cube;

mod autodiff;
mod cpu;
#[cfg(feature = "flex")]
mod flex;
