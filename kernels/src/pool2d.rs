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
use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, unary};
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
    crate::lanes::on_flex_f32(device, dtype)
        || (dtype == DType::F32 && crate::lanes::on_cube(device))
}

/// The geometry of a pooling this module's kernels run: on flex or CubeCL f32, symmetric
/// padding of at most half the window (so no window is all padding), dilation 1, floor mode.
fn plane_geom(
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

/// The autodiff step of an average pool (also [`PoolBackend::pool_avg2d_rounded`]'s).
#[derive(Debug)]
struct AvgStep;

impl<B: Backend + PoolBackend> Backward<B, 1> for AvgStep {
    type State = (PlaneGeom, bool);

    fn backward(
        self,
        ops: Ops<Self::State, 1>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let (geom, include_pad) = ops.state;
        unary::<B, _>(ops.parents, ops.node, grads, |grad| {
            B::pool_avg2d_backward(grad, geom, include_pad)
        });
    }
}

/// `forward` of `x` on `B`, differentiated as an average pool of `geom` (and whether the
/// padding counts).
fn avg_step<B: Backend + PoolBackend, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    state: (PlaneGeom, bool),
    forward: impl FnOnce(FloatTensor<B>) -> FloatTensor<B>,
) -> FloatTensor<Autodiff<B, C>> {
    match AvgStep.prepare::<C>([x.node()]).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish(state, forward(x.into_primitive())),
        OpsKind::UnTracked(prep) => prep.finish(forward(x.into_primitive())),
    }
}

impl<B: Backend + PoolBackend, C: CheckpointStrategy> PoolBackend for Autodiff<B, C> {
    fn pool_max2d(x: FloatTensor<Self>, geom: PlaneGeom) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct MaxStep;

        impl<B: Backend + PoolBackend> Backward<B, 1> for MaxStep {
            type State = (FloatTensor<B>, PlaneGeom);

            fn backward(
                self,
                ops: Ops<Self::State, 1>,
                grads: &mut Gradients,
                _checkpointer: &mut Checkpointer,
            ) {
                let (x, geom) = ops.state;
                unary::<B, _>(ops.parents, ops.node, grads, |grad| {
                    B::pool_max2d_backward(x, grad, geom)
                });
            }
        }

        match MaxStep.prepare::<C>([x.node()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let xp = x.primitive().clone();
                let out = B::pool_max2d(xp.clone(), geom);
                prep.finish((xp, geom), out)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::pool_max2d(x.into_primitive(), geom)),
        }
    }

    fn pool_max2d_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        geom: PlaneGeom,
    ) -> FloatTensor<Self> {
        Self::from_inner(B::pool_max2d_backward(x.into_primitive(), grad.into_primitive(), geom))
    }

    fn pool_avg2d(x: FloatTensor<Self>, geom: PlaneGeom, include_pad: bool) -> FloatTensor<Self> {
        avg_step::<B, C>(x, (geom, include_pad), |x| B::pool_avg2d(x, geom, include_pad))
    }

    fn pool_avg2d_backward(
        grad: FloatTensor<Self>,
        geom: PlaneGeom,
        include_pad: bool,
    ) -> FloatTensor<Self> {
        Self::from_inner(B::pool_avg2d_backward(grad.into_primitive(), geom, include_pad))
    }

    fn pool_avg2d_rounded(
        x: FloatTensor<Self>,
        mult: FloatTensor<Self>,
        step: FloatTensor<Self>,
        geom: PlaneGeom,
        rounding: Rounding,
    ) -> FloatTensor<Self> {
        let (mult, step) = (mult.into_primitive(), step.into_primitive());
        avg_step::<B, C>(x, (geom, rounding.include_pad), |x| {
            B::pool_avg2d_rounded(x, mult, step, geom, rounding)
        })
    }
}

/// `d[k] = op(d[k], s[k])`.
#[inline(always)]
fn combine(d: &mut [f32], s: &[f32], op: impl Fn(f32, f32) -> f32) {
    for (d, &s) in d.iter_mut().zip(s) {
        *d = op(*d, s);
    }
}

/// The larger of the two, NaN winning; on a tie the first (`a`, the earlier tap) stays.
#[inline(always)]
fn max_nan(a: f32, b: f32) -> f32 {
    // `|`, not `||`: no branch, so the loops over this vectorize.
    if (b > a) | b.is_nan() { b } else { a }
}

impl Flat {
    /// The stride-1 window result `acc` (`len`) of the padded plane `xp`, separably: `tmp`
    /// (`hp·wp`) takes the row pass.
    #[inline(always)]
    fn window(&self, xp: &[f32], tmp: &mut [f32], acc: &mut [f32], op: impl Fn(f32, f32) -> f32) {
        let ([kh, kw], len) = (self.g.kernel, self.len);
        if len == 0 {
            return;
        }
        // Row pass over every start of the flat plane that the column pass reads.
        let m = self.padded() + 1 - kw;
        let tmp = &mut tmp[..m];
        tmp.copy_from_slice(&xp[..m]);
        for j in 1..kw {
            combine(tmp, &xp[j..j + m], &op);
        }
        let acc = &mut acc[..len];
        acc.copy_from_slice(&tmp[..len]);
        for i in 1..kh {
            combine(acc, &tmp[i * self.wp..][..len], &op);
        }
    }

    /// The number of input elements (or, with `include_pad`, window elements) under each
    /// strided output row (`[0]`) and column (`[1]`).
    fn counts(&self, include_pad: bool) -> [Vec<f32>; 2] {
        let out = self.output();
        [0, 1].map(|a| {
            let (k, s, p, n) =
                (self.g.kernel[a], self.g.stride[a], self.g.padding[a], self.g.input[a]);
            (0..out[a])
                .map(|o| {
                    let start = o * s;
                    let inside = (start + k).min(p + n) - start.max(p);
                    (if include_pad { k } else { inside }) as f32
                })
                .collect()
        })
    }

    /// One max-pooled plane `y` `[H', W']`.
    #[inline(always)]
    fn max_forward(&self, x: &[f32], y: &mut [f32], [xp, tmp, acc]: &mut [Vec<f32>; 3]) {
        self.pad_with(x, xp, f32::NEG_INFINITY);
        self.window(xp, tmp, acc, max_nan);
        self.gather(acc, y);
    }

    /// One input-gradient plane `dx` `[H, W]` of max pooling.
    #[inline(always)]
    fn max_backward(&self, x: &[f32], dy: &[f32], dx: &mut [f32], s: &mut [Vec<f32>; 5]) {
        let [xp, tmp, m1, dy1, dxp] = s;
        let len = self.len;
        if len == 0 {
            dx.fill(0.0);
            return;
        }
        self.pad_with(x, xp, f32::NEG_INFINITY);
        self.window(xp, tmp, m1, max_nan);
        self.spread(dy, dy1);
        dxp.fill(0.0);
        let (m1, dy1, first) = (&m1[..len], &dy1[..len], &mut tmp[..len]);
        // The first tap, in row-major order, equal to each output's maximum: the last match
        // of a scan in reverse. Then each tap passes the gradients of the outputs it won.
        // (Branch-free selects, so both loops vectorize.)
        first.fill(f32::NAN);
        for (t, &off) in self.offsets.iter().enumerate().rev() {
            let tap = t as f32;
            for ((f, &x), &m) in first.iter_mut().zip(&xp[off..off + len]).zip(m1) {
                *f = if x == m { tap } else { *f };
            }
        }
        for (t, &off) in self.offsets.iter().enumerate() {
            let tap = t as f32;
            for ((d, &f), &g) in dxp[off..off + len].iter_mut().zip(&*first).zip(dy1) {
                *d += if f == tap { g } else { 0.0 };
            }
        }
        self.unpad(dxp, dx);
    }

    /// One average-pooled plane `y` `[H', W']`.
    #[inline(always)]
    fn avg_forward(
        &self,
        x: &[f32],
        y: &mut [f32],
        [rows, cols]: &[Vec<f32>; 2],
        [xp, tmp, acc]: [&mut [f32]; 3],
    ) {
        self.pad(x, xp);
        self.window(xp, tmp, acc, |a, b| a + b);
        self.gather_with(acc, y, |r, c, v| v / (rows[r] * cols[c]));
    }

    /// One input-gradient plane `dx` `[H, W]` of average pooling: the transposed row and column
    /// passes of the output gradient over its divisors.
    #[inline(always)]
    fn avg_backward(
        &self,
        dy: &[f32],
        dx: &mut [f32],
        [rows, cols]: &[Vec<f32>; 2],
        [g1, hg, dxp]: &mut [Vec<f32>; 3],
    ) {
        let ([kh, kw], len) = (self.g.kernel, self.len);
        dxp.fill(0.0);
        if len > 0 {
            let m = self.padded() + 1 - kw;
            self.spread_with(dy, g1, |r, c, v| v / (rows[r] * cols[c]));
            let hg = &mut hg[..m];
            hg.fill(0.0);
            for i in 0..kh {
                combine(&mut hg[i * self.wp..][..len], &g1[..len], |a, b| a + b);
            }
            for j in 0..kw {
                combine(&mut dxp[j..j + m], hg, |a, b| a + b);
            }
        }
        self.unpad(dxp, dx);
    }
}

#[cfg(feature = "cube")]
mod cube;

#[cfg(feature = "flex")]
mod flex_impl {
    use burn::backend::flex::{Flex, FlexTensor};

    use super::{Flat, PlaneGeom, PoolBackend, Rounding};
    use crate::lanes::flex::{f32s, slice, tensor};
    use crate::lanes::planes;

    /// The kernel's name in a dtype panic.
    const KERNEL: &str = "pooling";

    impl PoolBackend for Flex {
        fn pool_max2d(x: FlexTensor, g: PlaneGeom) -> FlexTensor {
            let (xd, x) = f32s(&x, KERNEL);
            let xs = slice(&x);
            let f = Flat::new(g);
            let ([h, w], [oh, ow]) = (g.input, f.output());
            let out = planes(
                xd[0] * xd[1],
                oh * ow,
                [f.padded(), f.padded(), f.len],
                #[inline(always)]
                |p, y, s| {
                    f.max_forward(&xs[p * h * w..][..h * w], y, s);
                },
            );
            tensor(out, vec![xd[0], xd[1], oh, ow])
        }

        fn pool_max2d_backward(x: FlexTensor, grad: FlexTensor, g: PlaneGeom) -> FlexTensor {
            let ((xd, x), (_, gy)) = (f32s(&x, KERNEL), f32s(&grad, KERNEL));
            let (xs, gs) = (slice(&x), slice(&gy));
            let f = Flat::new(g);
            let ([h, w], [oh, ow]) = (g.input, f.output());
            let (pad, len) = (f.padded(), f.len);
            let out = planes(
                xd[0] * xd[1],
                h * w,
                [pad, pad, len, len, pad],
                #[inline(always)]
                |p, dx, s| {
                    f.max_backward(&xs[p * h * w..][..h * w], &gs[p * oh * ow..][..oh * ow], dx, s);
                },
            );
            tensor(out, xd)
        }

        fn pool_avg2d(x: FlexTensor, g: PlaneGeom, include_pad: bool) -> FlexTensor {
            let (xd, x) = f32s(&x, KERNEL);
            let xs = slice(&x);
            let f = Flat::new(g);
            let ([h, w], [oh, ow]) = (g.input, f.output());
            let counts = f.counts(include_pad);
            let out = planes(
                xd[0] * xd[1],
                oh * ow,
                [f.padded(), f.padded(), f.len],
                #[inline(always)]
                |p, y, [xp, tmp, acc]| {
                    let s = [xp.as_mut_slice(), tmp.as_mut_slice(), acc.as_mut_slice()];
                    f.avg_forward(&xs[p * h * w..][..h * w], y, &counts, s);
                },
            );
            tensor(out, vec![xd[0], xd[1], oh, ow])
        }

        fn pool_avg2d_backward(grad: FlexTensor, g: PlaneGeom, include_pad: bool) -> FlexTensor {
            let (gd, gy) = f32s(&grad, KERNEL);
            let gs = slice(&gy);
            let f = Flat::new(g);
            let ([h, w], [oh, ow]) = (g.input, f.output());
            let counts = f.counts(include_pad);
            let out = planes(
                gd[0] * gd[1],
                h * w,
                [f.len, f.padded(), f.padded()],
                #[inline(always)]
                |p, dx, s| {
                    f.avg_backward(&gs[p * oh * ow..][..oh * ow], dx, &counts, s);
                },
            );
            tensor(out, vec![gd[0], gd[1], h, w])
        }

        fn pool_avg2d_rounded(
            x: FlexTensor,
            mult: FlexTensor,
            step: FlexTensor,
            g: PlaneGeom,
            r: Rounding,
        ) -> FlexTensor {
            let ((xd, x), (_, mult), (_, step)) =
                (f32s(&x, KERNEL), f32s(&mult, KERNEL), f32s(&step, KERNEL));
            let (xs, ms, ss) = (slice(&x), slice(&mult), slice(&step));
            let f = Flat::new(g);
            let ([h, w], [oh, ow]) = (g.input, f.output());
            let counts = f.counts(r.include_pad);
            let round = |v: f32| if r.ties_away { v.round() } else { v.round_ties_even() };
            let pad = f.padded();
            let out = planes(
                xd[0] * xd[1],
                oh * ow,
                [pad, pad, f.len, h * w, oh * ow],
                #[inline(always)]
                |p, y, [xp, tmp, acc, q, qa]| {
                    // Per channel: planes are (image, channel) in order.
                    let ch = if ms.len() == 1 { 0 } else { p % xd[1] };
                    let (m, st) = (ms[ch], ss[ch]);
                    let x = &xs[p * h * w..][..h * w];
                    for (q, &v) in q.iter_mut().zip(x) {
                        *q = round(v * m);
                    }
                    f.avg_forward(q, qa, &counts, [&mut xp[..], &mut tmp[..], &mut acc[..]]);
                    f.avg_forward(x, y, &counts, [&mut xp[..], &mut tmp[..], &mut acc[..]]);
                    // The expressions' value: avg + (qa·step − avg).
                    for (y, &qa) in y.iter_mut().zip(&*qa) {
                        *y += round(qa) * st - *y;
                    }
                },
            );
            tensor(out, vec![xd[0], xd[1], oh, ow])
        }
    }
}
