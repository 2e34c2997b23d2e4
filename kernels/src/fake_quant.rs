//! Fused fake quantization: quantize → dequantize in one pass over the tensor, and the
//! straight-through backward in one pass over (input, upstream gradient).
//!
//! It is a Burn backend extension ([`FakeQuantBackend`]) with a hand-written autodiff step, so
//! a fake-quantized activation costs one read and one write instead of the dozen temporaries of
//! the composite version (`qdarts_ops::quant::fake_quant`). Both compute the same f32 operations
//! in the same order, so their outputs and gradients are bit-identical; the golden tests run both.
//!
//! Per element, with the grid's per-channel `mult`, `step`, `zero_point` (`z`):
//!
//! - forward: `r = round(x · mult) + z`, `out = (clamp(r, qmin, qmax) − z) · step`;
//! - backward: `∂x = ∂out` where `qmin ≤ r ≤ qmax`, else 0 (recomputed from `x`; after a
//!   per-tensor observer kernel on the CubeCL backends, read from a clip mask of one bit per
//!   element that the forward wrote, so that the backward does not keep `x`: see
//!   [`crate::observe`]).
//!
//! Backends: `flex` runs a tight loop split across the rayon pool; the CubeCL backends (`wgpu`,
//! `cuda`) run one kernel thread per element ([`cube`](self) submodule). Other backends use the composite
//! version ([`fused_available`] says which applies to a tensor).

use burn::backend::AutodiffBackend;
use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn::backend::{Backend, backend_extension, tensor::FloatTensor};
use burn::tensor::{DType, Device, Tensor};

/// The host-side part of a fused call: integer range, rounding and how the `[C]` grid
/// parameters broadcast over the contiguous tensor (element `i` uses channel
/// `(i / inner) % channels`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FusedLayout {
    /// Smallest integer.
    pub qmin: i32,
    /// Largest integer.
    pub qmax: i32,
    /// Ties away from zero (else ties to even).
    pub ties_away: bool,
    /// Length of the grid parameters (1 per tensor).
    pub channels: usize,
    /// Elements per channel run: the product of the dimensions after the channel axis.
    pub inner: usize,
}

impl FusedLayout {
    /// The layout over a tensor of shape `dims` of a grid on the integers `qmin..=qmax`, per
    /// channel along `axis` (`None`: per tensor), rounding ties away from zero or to even.
    pub fn new(dims: &[usize], axis: Option<usize>, qmin: i32, qmax: i32, ties_away: bool) -> Self {
        let (channels, inner) = match axis {
            Some(a) => (dims[a], dims[a + 1..].iter().product()),
            None => (1, dims.iter().product::<usize>().max(1)),
        };
        FusedLayout { qmin, qmax, ties_away, channels, inner: inner.max(1) }
    }

    /// A grid parameter (`[1]` or `[channels]`) as the kernels take it: detached, one value per
    /// channel (a `[1]` parameter of a per-channel grid broadcast), as a dispatch tensor.
    pub(crate) fn param(&self, p: &Tensor<1>) -> burn::tensor::DispatchTensor {
        let p = p.clone().detach();
        let p = if p.dims()[0] == self.channels { p } else { p.expand([self.channels]) };
        p.into_dispatch()
    }
}

/// The fused fake-quant primitive. `mult`, `step` and `zero_point` are `[channels]`.
#[backend_extension(Flex: cfg(feature = "flex"), Cube: cfg(feature = "cube"), Autodiff)]
pub trait FakeQuantBackend: Backend {
    /// Fake-quantizes `x` (see the module docs).
    fn fake_quant_fused(
        x: FloatTensor<Self>,
        mult: FloatTensor<Self>,
        step: FloatTensor<Self>,
        zero_point: FloatTensor<Self>,
        layout: FusedLayout,
    ) -> FloatTensor<Self>;

    /// The straight-through gradient: `grad` where `x` quantizes inside the range, else 0.
    fn fake_quant_fused_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        mult: FloatTensor<Self>,
        zero_point: FloatTensor<Self>,
        layout: FusedLayout,
    ) -> FloatTensor<Self>;
}

/// Whether [`fake_quant_fused`] runs natively for tensors on `device` with this dtype.
pub fn fused_available(device: &Device, dtype: DType) -> bool {
    if dtype != DType::F32 {
        return false;
    }
    #[allow(unused_mut)]
    let mut native = false;
    #[cfg(feature = "flex")]
    {
        native |= *device == Device::flex();
    }
    native || crate::lanes::on_cube(device)
}

/// Fused fake quantization of `x` on the grid (`mult`, `step`, `zero_point`, each `[1]` or
/// `[layout.channels]`) with the straight-through gradient. The grid parameters are treated as
/// constants (detached), as in the composite version.
///
/// # Panics
/// If [`fused_available`] is false for `x`.
pub fn fake_quant_fused<const D: usize>(
    x: Tensor<D>,
    mult: &Tensor<1>,
    step: &Tensor<1>,
    zero_point: &Tensor<1>,
    layout: FusedLayout,
) -> Tensor<D> {
    assert!(
        fused_available(&x.device(), x.dtype()),
        "fused fake quant is not available on {:?} for {:?}",
        x.device(),
        x.dtype()
    );
    let param = |p: &Tensor<1>| layout.param(p);
    let out = <burn::backend::Dispatch as FakeQuantBackend>::fake_quant_fused(
        x.into_dispatch(),
        param(mult),
        param(step),
        param(zero_point),
        layout,
    );
    Tensor::from_dispatch(out)
}

/// The autodiff step of a fused fake quantization: the straight-through gradient, from the
/// input, the grid's multiplier and zero point, and the layout. (Also the step of
/// [`crate::observe::observe_fake_quant`]'s output.)
#[derive(Debug)]
pub(crate) struct FakeQuantStep;

impl<B: Backend + FakeQuantBackend> Backward<B, 1> for FakeQuantStep {
    type State = (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>, FusedLayout);

    fn backward(
        self,
        ops: Ops<Self::State, 1>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let (x, mult, zero_point, layout) = ops.state;
        unary::<B, _>(ops.parents, ops.node, grads, |grad| {
            B::fake_quant_fused_backward(x, grad, mult, zero_point, layout)
        });
    }
}

impl<B: Backend + FakeQuantBackend, C: CheckpointStrategy> FakeQuantBackend for Autodiff<B, C> {
    fn fake_quant_fused(
        x: FloatTensor<Self>,
        mult: FloatTensor<Self>,
        step: FloatTensor<Self>,
        zero_point: FloatTensor<Self>,
        layout: FusedLayout,
    ) -> FloatTensor<Self> {
        let (mult, step, zp) =
            (mult.into_primitive(), step.into_primitive(), zero_point.into_primitive());
        match FakeQuantStep.prepare::<C>([x.node()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let xp = x.primitive().clone();
                let out = B::fake_quant_fused(xp.clone(), mult.clone(), step, zp.clone(), layout);
                prep.finish((xp, mult, zp, layout), out)
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(B::fake_quant_fused(x.into_primitive(), mult, step, zp, layout))
            }
        }
    }

    fn fake_quant_fused_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        mult: FloatTensor<Self>,
        zero_point: FloatTensor<Self>,
        layout: FusedLayout,
    ) -> FloatTensor<Self> {
        Self::from_inner(B::fake_quant_fused_backward(
            x.into_primitive(),
            grad.into_primitive(),
            mult.into_primitive(),
            zero_point.into_primitive(),
            layout,
        ))
    }
}

/// 1.5·2²³: adding and subtracting it rounds an f32 below 2²² to an integer, ties to even
/// (the sum lies where the f32 spacing is 1, and the constant is even).
const MAGIC: f32 = 12_582_912.0;

/// Per-channel constants of the element loop.
#[derive(Debug, Clone, Copy)]
struct Chan {
    mult: f32,
    step: f32,
    zp: f32,
    /// `x · mult` is clamped to `[lo, hi]` before rounding: one unit beyond the range on each
    /// side, so out-of-range values stay out of range and the magic rounding stays exact.
    lo: f32,
    hi: f32,
}

impl Chan {
    fn new(mult: f32, step: f32, zp: f32, layout: &FusedLayout) -> Self {
        Chan {
            mult,
            step,
            zp,
            lo: layout.qmin as f32 - zp - 1.0,
            hi: layout.qmax as f32 - zp + 1.0,
        }
    }

    /// `round(x · mult) + z`, unclamped (NaN stays NaN). Branch-free, so the element loops
    /// vectorize.
    #[inline(always)]
    fn rounded<const AWAY: bool>(&self, x: f32) -> f32 {
        let v = x * self.mult;
        let v = if v < self.lo { self.lo } else { v };
        let v = if v > self.hi { self.hi } else { v };
        let r = if AWAY {
            // |v| < 2^22 here, so the integer conversion truncates exactly (NaN gives 0 and
            // is put back below).
            let t = (v as i32) as f32;
            let f = v - t;
            let up = if f >= 0.5 { 1.0 } else { 0.0 };
            let down = if f <= -0.5 { 1.0 } else { 0.0 };
            let r = t + up - down;
            if v.is_nan() { v } else { r }
        } else {
            (v + MAGIC) - MAGIC
        };
        r + self.zp
    }
}

/// Runs `f(chan, range)` over the contiguous element ranges that share a channel, in parallel
/// chunks.
fn for_each_run(
    n: usize,
    chans: &[Chan],
    layout: &FusedLayout,
    out: &mut [f32],
    f: impl Fn(&Chan, usize, &mut [f32]) + Sync,
) {
    use rayon::prelude::*;
    const CHUNK: usize = 1 << 15;
    out.par_chunks_mut(CHUNK).enumerate().for_each(|(k, block)| {
        let start = k * CHUNK;
        let end = (start + block.len()).min(n);
        let mut i = start;
        crate::lanes::wide(
            #[inline(always)]
            || {
                while i < end {
                    let run = i / layout.inner;
                    let stop = ((run + 1) * layout.inner).min(end);
                    f(&chans[run % layout.channels], i, &mut block[i - start..stop - start]);
                    i = stop;
                }
            },
        );
    });
}

/// The forward element loop over one channel run.
#[inline(always)]
fn forward<const AWAY: bool>(c: &Chan, src: &[f32], dst: &mut [f32], qmin: f32, qmax: f32) {
    for (o, &v) in dst.iter_mut().zip(src) {
        let r = c.rounded::<AWAY>(v);
        let q = if r < qmin { qmin } else { r };
        let q = if q > qmax { qmax } else { q };
        *o = (q - c.zp) * c.step;
    }
}

/// The backward element loop over one channel run: zeroes the gradient `g` where `x` quantizes
/// outside the range (in place, so an owned gradient buffer is reused).
#[inline(always)]
fn backward<const AWAY: bool>(c: &Chan, xs: &[f32], g: &mut [f32], qmin: f32, qmax: f32) {
    for (o, &v) in g.iter_mut().zip(xs) {
        let r = c.rounded::<AWAY>(v);
        *o = if r < qmin || r > qmax { 0.0 } else { *o };
    }
}

#[cfg(feature = "cube")]
pub(crate) mod cube;

#[cfg(feature = "flex")]
mod flex_impl {
    use burn::backend::flex::{Flex, FlexTensor};
    use burn::tensor::{DType, Shape, TensorData};

    use super::{Chan, FakeQuantBackend, FusedLayout, backward, for_each_run, forward};

    /// The values of a grid tensor (mult, step, zero point: f32 by construction).
    ///
    /// # Panics
    /// If it is not f32, as [`contiguous_f32`].
    fn host(t: &FlexTensor) -> Vec<f32> {
        let (_, t) = contiguous_f32(t.clone());
        t.as_slice::<f32>().expect("a contiguous f32 tensor has a slice").to_vec()
    }

    fn chans(
        mult: &FlexTensor,
        step: Option<&FlexTensor>,
        zp: &FlexTensor,
        l: &FusedLayout,
    ) -> Vec<Chan> {
        let (m, z) = (host(mult), host(zp));
        let s = step.map(host).unwrap_or_else(|| vec![0.0; m.len()]);
        let pick = |v: &[f32], c: usize| if v.len() == 1 { v[0] } else { v[c] };
        (0..l.channels).map(|c| Chan::new(pick(&m, c), pick(&s, c), pick(&z, c), l)).collect()
    }

    /// The shape of `x` and a contiguous view of it.
    ///
    /// # Panics
    /// If `x` is not f32 (the dispatching wrapper only calls the kernel for f32).
    fn contiguous_f32(x: FlexTensor) -> (Shape, FlexTensor) {
        assert_eq!(x.dtype(), DType::F32, "fused fake quant: expected f32");
        (x.layout().shape().clone(), x.to_contiguous())
    }

    fn finish(out: Vec<f32>, shape: Shape) -> FlexTensor {
        FlexTensor::from_data(TensorData::new(out, shape))
    }

    /// A writable f32 buffer with a tensor's values: the tensor itself when it is contiguous,
    /// covers its whole buffer and has no other owner, else a copy.
    enum Owned {
        InPlace(FlexTensor),
        Copy(Vec<f32>),
    }

    impl Owned {
        fn as_mut_slice(&mut self) -> &mut [f32] {
            match self {
                Owned::InPlace(t) => t.storage_mut::<f32>(),
                Owned::Copy(v) => v,
            }
        }

        fn into_tensor(self, shape: Shape) -> FlexTensor {
            match self {
                Owned::InPlace(t) => t,
                Owned::Copy(v) => finish(v, shape),
            }
        }
    }

    fn owned_f32(t: FlexTensor) -> Owned {
        let n = t.layout().num_elements();
        let whole = t.layout().contiguous_offsets() == Some((0, n))
            && t.bytes().len() == n * size_of::<f32>();
        if whole && t.is_unique() && t.dtype() == DType::F32 {
            Owned::InPlace(t)
        } else {
            let c = t.to_contiguous();
            Owned::Copy(c.as_slice::<f32>().map(<[f32]>::to_vec).unwrap_or_else(|| {
                panic!("fused fake quant backward: expected an f32 gradient, got {:?}", t.dtype())
            }))
        }
    }

    impl FakeQuantBackend for Flex {
        fn fake_quant_fused(
            x: FlexTensor,
            mult: FlexTensor,
            step: FlexTensor,
            zero_point: FlexTensor,
            layout: FusedLayout,
        ) -> FlexTensor {
            let (shape, x) = contiguous_f32(x);
            let xs = x.as_slice::<f32>().expect("a contiguous f32 tensor has a slice");
            let chans = chans(&mult, Some(&step), &zero_point, &layout);
            let mut out = vec![0.0f32; xs.len()];
            let (qmin, qmax, away) = (layout.qmin as f32, layout.qmax as f32, layout.ties_away);
            for_each_run(
                xs.len(),
                &chans,
                &layout,
                &mut out,
                #[inline(always)]
                |c, i, dst| {
                    let src = &xs[i..i + dst.len()];
                    match away {
                        true => forward::<true>(c, src, dst, qmin, qmax),
                        false => forward::<false>(c, src, dst, qmin, qmax),
                    }
                },
            );
            finish(out, shape)
        }

        fn fake_quant_fused_backward(
            x: FlexTensor,
            grad: FlexTensor,
            mult: FlexTensor,
            zero_point: FlexTensor,
            layout: FusedLayout,
        ) -> FlexTensor {
            let (shape, x) = contiguous_f32(x);
            let xs = x.as_slice::<f32>().expect("a contiguous f32 tensor has a slice");
            let chans = chans(&mult, None, &zero_point, &layout);
            // The upstream gradient is usually owned here: mask it in place.
            let mut out = owned_f32(grad);
            let (qmin, qmax, away) = (layout.qmin as f32, layout.qmax as f32, layout.ties_away);
            for_each_run(
                xs.len(),
                &chans,
                &layout,
                out.as_mut_slice(),
                #[inline(always)]
                |c, i, dst| {
                    let src = &xs[i..i + dst.len()];
                    match away {
                        true => backward::<true>(c, src, dst, qmin, qmax),
                        false => backward::<false>(c, src, dst, qmin, qmax),
                    }
                },
            );
            out.into_tensor(shape)
        }
    }
}
