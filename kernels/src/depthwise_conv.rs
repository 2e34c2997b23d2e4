//! Depthwise convolution (`groups = c_in = c_out`, one filter per channel) with its own forward
//! and backward kernels on flex.
//!
//! The separable and dilated candidate ops run one or two depthwise convolutions each, so a
//! DARTS supernet holds hundreds of them. Burn's generic backward treats a grouped convolution
//! as `groups` separate convolutions: the weight gradient is a loop of one `conv2d` and one
//! `slice_assign` per channel, and the input gradient is a transposed convolution made of one
//! rank-1 GEMM and one scatter per (image, channel). Here each (image, channel) plane is one
//! task of the rayon pool, and every kernel is a few loops over contiguous rows:
//!
//! - forward: `y[o] = Σ_t w[t] · x[o·s + t·d − p]` over the taps `t` (per axis);
//! - input gradient: the transpose, `∂x[o·s + t·d − p] += w[t] · ∂y[o]`;
//! - weight gradient: `∂w[t] = Σ_{n, o} ∂y[n, o] · x[n, o·s + t·d − p]`, one partial per plane,
//!   summed over the batch in a fixed order, so the result does not depend on thread timing.
//!
//! When both gradients are wanted (training), one kernel computes both per plane, reading and
//! laying out each plane of `∂y` once. A strided convolution runs its forward and input
//! gradient on the padded plane split into its stride phases (`Phases`), computing only the
//! outputs the stride keeps instead of the stride-1 output; the results are bitwise those of
//! the stride-1 layout (`Phases`' docs say why, and a unit test holds the two together).
//!
//! Only the summation order differs from Burn's convolution (`tests/depthwise_conv.rs` holds the two
//! together). Other convolutions go to [`crate::pointwise_conv::conv2d`] (a 1×1 convolution is a
//! matrix product there on flex; on the CubeCL backends every convolution runs
//! [`crate::direct_conv`]'s kernels; anything else Burn's `conv2d`), as do other backends and
//! dtypes ([`conv2d`] decides).

use burn::backend::AutodiffBackend;
use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, binary};
use burn::backend::{Backend, backend_extension, tensor::FloatTensor};
use burn::tensor::ops::ConvOptions;
use burn::tensor::{DType, Device, Tensor};

use crate::lanes::{correlate, dots};
use crate::plane::Flat;
pub use crate::plane::PlaneGeom;

/// The depthwise convolution primitive: `x` `[N, C, H, W]`, `weight` `[C, 1, kh, kw]`.
#[backend_extension(Flex: cfg(feature = "flex"), Autodiff)]
pub trait DepthwiseBackend: Backend {
    /// The convolution, `[N, C, H', W']`.
    fn depthwise_conv2d(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        geom: PlaneGeom,
    ) -> FloatTensor<Self>;

    /// The gradient of the input from the output's, `[N, C, H, W]`.
    fn depthwise_conv2d_x_backward(
        grad: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        geom: PlaneGeom,
    ) -> FloatTensor<Self>;

    /// The gradient of the weight from the input and the output's gradient, `[C, 1, kh, kw]`.
    fn depthwise_conv2d_weight_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        geom: PlaneGeom,
    ) -> FloatTensor<Self>;

    /// Both gradients at once, `(input's, weight's)`: bitwise the two functions above, with
    /// each plane of the output's gradient read (and laid out flat) once for both.
    fn depthwise_conv2d_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        geom: PlaneGeom,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);
}

/// Whether [`conv2d`] runs this module's kernels for tensors on `device` with this dtype.
pub fn depthwise_available(device: &Device, dtype: DType) -> bool {
    crate::lanes::on_flex_f32(device, dtype)
}

/// Burn's `conv2d` without bias, except that a depthwise convolution (`groups` = input channels
/// = output channels) runs this module's kernels where [`depthwise_available`], and a 1×1 one
/// is a matrix product ([`crate::pointwise_conv::conv2d`]).
pub fn conv2d(x: Tensor<4>, weight: Tensor<4>, options: ConvOptions<2>) -> Tensor<4> {
    let [_, c, h, w] = x.dims();
    let [co, ci_g, kh, kw] = weight.dims();
    let depthwise = options.groups == c && co == c && ci_g == 1 && c > 1;
    if !depthwise || !depthwise_available(&x.device(), x.dtype()) {
        return crate::pointwise_conv::conv2d(x, weight, options);
    }
    let geom = PlaneGeom {
        input: [h, w],
        kernel: [kh, kw],
        stride: options.stride,
        padding: options.padding_begin(),
        dilation: options.dilation,
    };
    let out = <burn::backend::Dispatch as DepthwiseBackend>::depthwise_conv2d(
        x.into_dispatch(),
        weight.into_dispatch(),
        geom,
    );
    Tensor::from_dispatch(out)
}

impl<B: Backend + DepthwiseBackend, C: CheckpointStrategy> DepthwiseBackend for Autodiff<B, C> {
    fn depthwise_conv2d(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        geom: PlaneGeom,
    ) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct DepthwiseStep;

        impl<B: Backend + DepthwiseBackend> Backward<B, 2> for DepthwiseStep {
            type State = (FloatTensor<B>, FloatTensor<B>, PlaneGeom);

            fn backward(
                self,
                ops: Ops<Self::State, 2>,
                grads: &mut Gradients,
                _checkpointer: &mut Checkpointer,
            ) {
                let (x, weight, geom) = ops.state;
                if let [Some(node_x), Some(node_w)] = &ops.parents {
                    let grad = grads.consume::<B>(&ops.node);
                    let (dx, dw) = B::depthwise_conv2d_backward(x, grad, weight, geom);
                    grads.register::<B>(node_x.id, dx);
                    grads.register::<B>(node_w.id, dw);
                    return;
                }
                binary::<B, _, _>(
                    ops.parents,
                    ops.node,
                    grads,
                    |grad| B::depthwise_conv2d_x_backward(grad, weight, geom),
                    |grad| B::depthwise_conv2d_weight_backward(x, grad, geom),
                );
            }
        }

        match DepthwiseStep.prepare::<C>([x.node(), weight.node()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let (xp, wp) = (x.primitive().clone(), weight.primitive().clone());
                let out = B::depthwise_conv2d(xp.clone(), wp.clone(), geom);
                prep.finish((xp, wp, geom), out)
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(B::depthwise_conv2d(x.into_primitive(), weight.into_primitive(), geom))
            }
        }
    }

    fn depthwise_conv2d_x_backward(
        grad: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        geom: PlaneGeom,
    ) -> FloatTensor<Self> {
        Self::from_inner(B::depthwise_conv2d_x_backward(
            grad.into_primitive(),
            weight.into_primitive(),
            geom,
        ))
    }

    fn depthwise_conv2d_weight_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        geom: PlaneGeom,
    ) -> FloatTensor<Self> {
        Self::from_inner(B::depthwise_conv2d_weight_backward(
            x.into_primitive(),
            grad.into_primitive(),
            geom,
        ))
    }

    fn depthwise_conv2d_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        geom: PlaneGeom,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (dx, dw) = B::depthwise_conv2d_backward(
            x.into_primitive(),
            grad.into_primitive(),
            weight.into_primitive(),
            geom,
        );
        (Self::from_inner(dx), Self::from_inner(dw))
    }
}

impl Flat {
    /// The largest tap offset: the zero margin the input gradient's scratch needs on each side.
    fn reach(&self) -> usize {
        self.offsets.last().copied().unwrap_or(0)
    }

    /// `(offset, weight)` of every tap of every channel, channel after channel, from the
    /// weights `[C·kh·kw]`: the forward's [`correlate`] taps.
    fn forward_taps(&self, w: &[f32]) -> Vec<(usize, f32)> {
        let offsets = self.offsets.iter().cycle();
        offsets.zip(w).map(|(&off, &wv)| (off, wv)).collect()
    }

    /// The input gradient's taps: `∂x_p[j] = Σ_t w_t · ∂y1[j − off_t]` read as a correlation
    /// over the interior `j ≥ j0` of the padded plane and the flat output gradient behind a
    /// zero margin of [`Flat::reach`] entries.
    fn backward_taps(&self, w: &[f32]) -> Vec<(usize, f32)> {
        let base = self.interior().start + self.reach();
        let offsets = self.offsets.iter().cycle();
        offsets.zip(w).map(|(&off, &wv)| (base - off, wv)).collect()
    }

    /// The span of the padded plane that holds the input, first row to last.
    fn interior(&self) -> std::ops::Range<usize> {
        let ([h, w], [ph, pw]) = (self.g.input, self.g.padding);
        let start = ph * self.wp + pw;
        start..if h == 0 { start } else { (ph + h - 1) * self.wp + pw + w }
    }

    /// One output plane `y` `[H', W']` from the input plane and the channel's `taps`
    /// ([`Flat::forward_taps`]).
    #[inline(always)]
    fn forward(
        &self,
        x: &[f32],
        taps: &[(usize, f32)],
        y: &mut [f32],
        xp: &mut [f32],
        acc: &mut [f32],
    ) {
        self.pad(x, xp);
        correlate(&mut acc[..self.len], xp, taps);
        self.gather(acc, y);
    }

    /// One input-gradient plane `dx` `[H, W]` from the output gradient's plane and the
    /// channel's `taps` ([`Flat::backward_taps`]); `dy1` holds the flat output gradient behind
    /// and before a zero margin ([`Flat::reach`] entries each).
    #[inline(always)]
    fn x_backward(
        &self,
        dy: &[f32],
        taps: &[(usize, f32)],
        dx: &mut [f32],
        dy1: &mut [f32],
        dxp: &mut [f32],
    ) {
        if self.len == 0 {
            dx.fill(0.0);
            return;
        }
        self.spread_behind_margin(dy, dy1);
        self.x_backward_spread(dy1, taps, dx, dxp);
    }

    /// Lays the output gradient's plane `dy` out flat ([`Flat::spread`]) in `dy1`, behind and
    /// before a zero margin of [`Flat::reach`] entries.
    #[inline(always)]
    fn spread_behind_margin(&self, dy: &[f32], dy1: &mut [f32]) {
        let m = self.reach();
        dy1[..m].fill(0.0);
        dy1[m + self.len..].fill(0.0);
        self.spread(dy, &mut dy1[m..m + self.len]);
    }

    /// [`Flat::x_backward`] from the gradient already laid out by
    /// [`Flat::spread_behind_margin`] (`len > 0`).
    #[inline(always)]
    fn x_backward_spread(
        &self,
        dy1: &[f32],
        taps: &[(usize, f32)],
        dx: &mut [f32],
        dxp: &mut [f32],
    ) {
        correlate(&mut dxp[self.interior()], dy1, taps);
        self.unpad(dxp, dx);
    }

    /// One plane's share of the weight gradient, `dw` `[kh·kw]`.
    #[inline(always)]
    fn weight_backward(
        &self,
        x: &[f32],
        dy: &[f32],
        dw: &mut [f32],
        xp: &mut [f32],
        dy1: &mut [f32],
    ) {
        self.pad(x, xp);
        self.spread(dy, dy1);
        dots(dy1, xp, &self.offsets, dw);
    }

    /// [`Flat::x_backward`] and [`Flat::weight_backward`] of one plane, the output gradient
    /// laid out once for both; `dy1` as for [`Flat::x_backward`].
    #[inline(always)]
    fn backward(
        &self,
        [x, dy]: [&[f32]; 2],
        taps: &[(usize, f32)],
        [dx, dw]: [&mut [f32]; 2],
        [dy1, dxp, xp]: [&mut Vec<f32>; 3],
    ) {
        if self.len == 0 {
            dx.fill(0.0);
            dw.fill(0.0);
            return;
        }
        self.spread_behind_margin(dy, dy1);
        self.x_backward_spread(dy1, taps, dx, dxp);
        self.pad(x, xp);
        let m = self.reach();
        dots(&dy1[m..m + self.len], xp, &self.offsets, dw);
    }
}

/// One depthwise convolution's per-plane kernels, as the flex implementation runs them: the
/// stride-1 layout ([`Flat`]) or, for a strided convolution, the phase layout ([`Phases`]).
/// Each method's `scratch` buffers have the sizes its `*_scratch` method gives.
trait PlaneConv: Sync {
    /// The layout of the stride-1 convolution.
    fn flat(&self) -> &Flat;
    /// `(offset, weight)` of every tap of every channel for [`PlaneConv::forward`], `taps`
    /// entries per channel, channel after channel, from the weights `[C·kh·kw]`.
    fn forward_taps(&self, w: &[f32]) -> Vec<(usize, f32)>;
    /// The same for [`PlaneConv::x_backward`].
    fn backward_taps(&self, w: &[f32]) -> Vec<(usize, f32)>;
    fn forward_scratch(&self) -> [usize; 2];
    /// One output plane `y` `[H', W']` from the input plane `x` `[H, W]`.
    fn forward(&self, x: &[f32], taps: &[(usize, f32)], y: &mut [f32], scratch: &mut [Vec<f32>; 2]);
    fn x_scratch(&self) -> [usize; 2];
    /// One input-gradient plane `dx` `[H, W]` from the output gradient's plane `dy`.
    fn x_backward(
        &self,
        dy: &[f32],
        taps: &[(usize, f32)],
        dx: &mut [f32],
        scratch: &mut [Vec<f32>; 2],
    );
    fn backward_scratch(&self) -> [usize; 4];
    /// [`PlaneConv::x_backward`] and the plane's share of the weight gradient `dw` `[kh·kw]`
    /// ([`Flat::weight_backward`]) at once, bitwise the two alone.
    fn backward(
        &self,
        x_dy: [&[f32]; 2],
        taps: &[(usize, f32)],
        dx_dw: [&mut [f32]; 2],
        scratch: &mut [Vec<f32>; 4],
    );
}

impl PlaneConv for Flat {
    fn flat(&self) -> &Flat {
        self
    }
    fn forward_taps(&self, w: &[f32]) -> Vec<(usize, f32)> {
        Flat::forward_taps(self, w)
    }
    fn backward_taps(&self, w: &[f32]) -> Vec<(usize, f32)> {
        Flat::backward_taps(self, w)
    }
    fn forward_scratch(&self) -> [usize; 2] {
        [self.padded(), self.len]
    }
    #[inline(always)]
    fn forward(
        &self,
        x: &[f32],
        taps: &[(usize, f32)],
        y: &mut [f32],
        [xp, acc]: &mut [Vec<f32>; 2],
    ) {
        Flat::forward(self, x, taps, y, xp, acc);
    }
    fn x_scratch(&self) -> [usize; 2] {
        [self.len + 2 * self.reach(), self.padded()]
    }
    #[inline(always)]
    fn x_backward(
        &self,
        dy: &[f32],
        taps: &[(usize, f32)],
        dx: &mut [f32],
        [dy1, dxp]: &mut [Vec<f32>; 2],
    ) {
        Flat::x_backward(self, dy, taps, dx, dy1, dxp);
    }
    fn backward_scratch(&self) -> [usize; 4] {
        let [dy1, dxp] = self.x_scratch();
        [dy1, dxp, self.padded(), 0]
    }
    #[inline(always)]
    fn backward(
        &self,
        x_dy: [&[f32]; 2],
        taps: &[(usize, f32)],
        dx_dw: [&mut [f32]; 2],
        [dy1, dxp, xp, _]: &mut [Vec<f32>; 4],
    ) {
        Flat::backward(self, x_dy, taps, dx_dw, [dy1, dxp, xp]);
    }
}

/// A strided depthwise convolution on the padded plane split into its `sh·sw` phases (the
/// entries at padded row `≡ a (mod sh)` and column `≡ b (mod sw)`, each `hq × wq`, one after
/// the other), so that the kernels compute only the outputs the stride keeps.
///
/// - Forward: output `(r, c)` reads padded `(r·sh + i·dh, c·sw + j·dw)`, which is entry
///   `(r + ⌊i·dh/sh⌋, c + ⌊j·dw/sw⌋)` of phase `(i·dh mod sh, j·dw mod sw)`: every tap is again
///   one offset over an output laid out with row length `wq`, and each output sums the same
///   products from zero in the same tap order as [`Flat`]'s stride-1 output there.
/// - Input gradient: padded `(R, C)` receives `w_t · ∂y(r, c)` only from the taps of its own
///   phase, at `r = ⌊R/sh⌋ − ⌊i·dh/sh⌋` (and likewise for columns): one correlation per phase
///   over the output gradient laid out with row length `row` behind a zero margin. [`Flat`]'s
///   correlation adds, in the same tap order, also `w_t · 0` for the taps of other phases and
///   the rows and columns the stride skips; an addend `±0` leaves a sum that started at `+0`
///   unchanged (such a sum is never `−0`), so both give the same bits for finite weights.
/// - Weight gradient: [`Flat::weight_backward`] (its partial sums run over the stride-1 flat
///   index, which a phase layout would regroup).
pub(crate) struct Phases {
    f: Flat,
    /// Rows and columns of each phase.
    hq: usize,
    wq: usize,
    /// Row length of the output gradient's layout for the input gradient: `W' + ⌊(kw−1)·dw/sw⌋`.
    row: usize,
    /// Where output-gradient row 0 starts in that layout: one row past the deepest tap's reach.
    front: usize,
    /// Each tap's forward offset, row-major over `(i, j)`.
    forward: Vec<usize>,
    /// The input gradient's taps: per phase `(a, b)`, `a·sw + b` in order, its taps `(t, offset)`
    /// in tap order.
    phases: Vec<Vec<(usize, usize)>>,
}

impl Phases {
    pub(crate) fn new(g: PlaneGeom) -> Self {
        let f = Flat::new(g);
        let ([sh, sw], [dh, dw], [kh, kw]) = (g.stride, g.dilation, g.kernel);
        let (hq, wq) = (f.hp.div_ceil(sh), f.wp.div_ceil(sw));
        let [_, ow] = f.output();
        let (reach_r, reach_c) = ((kh.max(1) - 1) * dh / sh, (kw.max(1) - 1) * dw / sw);
        let row = ow + reach_c;
        let front = (reach_r + 1) * row;
        let taps = || (0..kh).flat_map(move |i| (0..kw).map(move |j| (i * dh, j * dw)));
        let base = |ri: usize, cj: usize| ((ri % sh) * sw + cj % sw) * hq * wq;
        let forward = taps().map(|(ri, cj)| base(ri, cj) + ri / sh * wq + cj / sw).collect();
        let mut phases = vec![Vec::new(); sh * sw];
        for (t, (ri, cj)) in taps().enumerate() {
            phases[(ri % sh) * sw + cj % sw].push((t, front - ri / sh * row - cj / sw));
        }
        Phases { f, hq, wq, row, front, forward, phases }
    }

    /// Entries of the forward's flat output (row length `wq`).
    fn forward_len(&self) -> usize {
        let [oh, ow] = self.f.output();
        if oh == 0 || ow == 0 { 0 } else { (oh - 1) * self.wq + ow }
    }

    /// The input gradient's scratch: the laid-out output gradient and one phase's result.
    fn x_sizes(&self) -> [usize; 2] {
        [self.front + self.hq * self.row, self.hq * self.row]
    }

    /// The input gradient of one plane ([`PlaneConv::x_backward`]).
    #[inline(always)]
    fn x_backward_phased(
        &self,
        dy: &[f32],
        taps: &[(usize, f32)],
        dx: &mut [f32],
        d: &mut [f32],
        dq: &mut [f32],
    ) {
        let g = self.f.g;
        let ([oh, ow], [h, w], [ph, pw], [sh, sw]) =
            (self.f.output(), g.input, g.padding, g.stride);
        if oh == 0 || ow == 0 {
            dx.fill(0.0);
            return;
        }
        d.fill(0.0);
        for r in 0..oh {
            d[self.front + r * self.row..][..ow].copy_from_slice(&dy[r * ow..][..ow]);
        }
        let mut at = 0;
        for (phase, list) in self.phases.iter().enumerate() {
            let (a, b) = (phase / sw, phase % sw);
            let mine = &taps[at..at + list.len()];
            at += list.len();
            if mine.is_empty() {
                continue; // dx is zeroed: no tap reaches this phase.
            }
            correlate(dq, d, mine);
            // Padded (q·sh + a, u·sw + b) is input (q·sh + a − ph, u·sw + b − pw); columns
            // u ≥ row are beyond every tap's reach (their gradient stays 0).
            for q in 0..self.hq {
                let Some(r) = (q * sh + a).checked_sub(ph).filter(|&r| r < h) else {
                    continue;
                };
                let src = &dq[q * self.row..][..self.row];
                let dst = &mut dx[r * w..][..w];
                let first = pw.saturating_sub(b).div_ceil(sw);
                for (u, &v) in src.iter().enumerate().skip(first) {
                    let c = u * sw + b - pw;
                    if c >= w {
                        break;
                    }
                    dst[c] = v;
                }
            }
        }
    }
}

impl PlaneConv for Phases {
    fn flat(&self) -> &Flat {
        &self.f
    }
    fn forward_taps(&self, w: &[f32]) -> Vec<(usize, f32)> {
        let offsets = self.forward.iter().cycle();
        offsets.zip(w).map(|(&off, &wv)| (off, wv)).collect()
    }
    fn backward_taps(&self, w: &[f32]) -> Vec<(usize, f32)> {
        let taps = self.forward.len();
        let order: Vec<(usize, usize)> = self.phases.iter().flatten().copied().collect();
        w.chunks_exact(taps.max(1))
            .flat_map(|wc| order.iter().map(move |&(t, off)| (off, wc[t])))
            .collect()
    }
    fn forward_scratch(&self) -> [usize; 2] {
        [self.phases.len() * self.hq * self.wq, self.forward_len()]
    }
    #[inline(always)]
    fn forward(
        &self,
        x: &[f32],
        taps: &[(usize, f32)],
        y: &mut [f32],
        [xq, acc]: &mut [Vec<f32>; 2],
    ) {
        let g = self.f.g;
        let ([h, w], [ph, pw], [sh, sw], [_, ow]) = (g.input, g.padding, g.stride, self.f.output());
        xq.fill(0.0);
        let plane = self.hq * self.wq;
        for r in 0..h {
            let rr = r + ph;
            let rows = &mut xq[(rr % sh) * sw * plane + rr / sh * self.wq..];
            let src = &x[r * w..][..w];
            // Column phase b holds the input columns c ≡ b − pw (mod sw), every sw-th.
            for b in 0..sw {
                let c0 = (b + sw - pw % sw) % sw;
                let dst = &mut rows[b * plane + (c0 + pw) / sw..];
                for (d, &v) in dst.iter_mut().zip(src.iter().skip(c0).step_by(sw)) {
                    *d = v;
                }
            }
        }
        let acc = &mut acc[..self.forward_len()];
        correlate(acc, xq, taps);
        for (r, out) in y.chunks_exact_mut(ow.max(1)).enumerate() {
            out.copy_from_slice(&acc[r * self.wq..][..ow]);
        }
    }
    fn x_scratch(&self) -> [usize; 2] {
        self.x_sizes()
    }
    #[inline(always)]
    fn x_backward(
        &self,
        dy: &[f32],
        taps: &[(usize, f32)],
        dx: &mut [f32],
        [d, dq]: &mut [Vec<f32>; 2],
    ) {
        self.x_backward_phased(dy, taps, dx, d, dq);
    }
    fn backward_scratch(&self) -> [usize; 4] {
        let [d, dq] = self.x_sizes();
        [d, dq, self.f.padded(), self.f.len]
    }
    #[inline(always)]
    fn backward(
        &self,
        [x, dy]: [&[f32]; 2],
        taps: &[(usize, f32)],
        [dx, dw]: [&mut [f32]; 2],
        [d, dq, xp, dy1]: &mut [Vec<f32>; 4],
    ) {
        self.x_backward_phased(dy, taps, dx, d, dq);
        self.f.weight_backward(x, dy, dw, xp, dy1);
    }
}

#[cfg(feature = "flex")]
mod flex_impl {
    use super::{DepthwiseBackend, Flat, Phases, PlaneConv, PlaneGeom};
    use crate::lanes::flex::{f32s, slice, tensor};
    use crate::lanes::{planes, planes_to};
    use burn::backend::flex::{Flex, FlexTensor};

    /// The kernel's name in a dtype panic.
    const KERNEL: &str = "depthwise conv";

    /// `run` with the layout for `g`'s stride: [`Flat`] for stride 1, else [`Phases`].
    fn with_layout<R>(g: PlaneGeom, run: impl FnOnce(&dyn Layout) -> R) -> R {
        if g.stride == [1, 1] { run(&Flat::new(g)) } else { run(&Phases::new(g)) }
    }

    /// [`PlaneConv`] behind a reference, so one generic body serves both layouts.
    trait Layout {
        fn forward(&self, xs: &[f32], ws: &[f32], n: usize, c: usize) -> Vec<f32>;
        fn x_backward(&self, gs: &[f32], ws: &[f32], n: usize, c: usize) -> Vec<f32>;
        fn backward(&self, xs: &[f32], gs: &[f32], ws: &[f32], n: usize, c: usize)
        -> [Vec<f32>; 2];
    }

    impl<P: PlaneConv> Layout for P {
        fn forward(&self, xs: &[f32], ws: &[f32], n: usize, c: usize) -> Vec<f32> {
            let f = self.flat();
            let ([h, wd], [oh, ow]) = (f.g.input, f.output());
            let (taps, all) = (f.offsets.len(), self.forward_taps(ws));
            planes(
                n * c,
                oh * ow,
                self.forward_scratch(),
                #[inline(always)]
                |p, y, scratch| {
                    let ch = p % c;
                    let x = &xs[p * h * wd..][..h * wd];
                    PlaneConv::forward(self, x, &all[ch * taps..][..taps], y, scratch);
                },
            )
        }

        fn x_backward(&self, gs: &[f32], ws: &[f32], n: usize, c: usize) -> Vec<f32> {
            let f = self.flat();
            let ([h, wd], [oh, ow]) = (f.g.input, f.output());
            let (taps, all) = (f.offsets.len(), self.backward_taps(ws));
            planes(
                n * c,
                h * wd,
                self.x_scratch(),
                #[inline(always)]
                |p, dx, scratch| {
                    let ch = p % c;
                    let dy = &gs[p * oh * ow..][..oh * ow];
                    PlaneConv::x_backward(self, dy, &all[ch * taps..][..taps], dx, scratch);
                },
            )
        }

        fn backward(
            &self,
            xs: &[f32],
            gs: &[f32],
            ws: &[f32],
            n: usize,
            c: usize,
        ) -> [Vec<f32>; 2] {
            let f = self.flat();
            let ([h, wd], [oh, ow]) = (f.g.input, f.output());
            let (taps, all) = (f.offsets.len(), self.backward_taps(ws));
            planes_to(
                n * c,
                [h * wd, taps],
                self.backward_scratch(),
                #[inline(always)]
                |p, dst, scratch| {
                    let (xs, gs) = (&xs[p * h * wd..][..h * wd], &gs[p * oh * ow..][..oh * ow]);
                    let ch = p % c;
                    PlaneConv::backward(self, [xs, gs], &all[ch * taps..][..taps], dst, scratch);
                },
            )
        }
    }

    impl DepthwiseBackend for Flex {
        fn depthwise_conv2d(x: FlexTensor, weight: FlexTensor, g: PlaneGeom) -> FlexTensor {
            let ((xd, x), (_, w)) = (f32s(&x, KERNEL), f32s(&weight, KERNEL));
            let (xs, ws) = (slice(&x), slice(&w));
            let [oh, ow] = Flat::new(g).output();
            let out = with_layout(g, |l| l.forward(xs, ws, xd[0], xd[1]));
            tensor(out, vec![xd[0], xd[1], oh, ow])
        }

        fn depthwise_conv2d_x_backward(
            grad: FlexTensor,
            weight: FlexTensor,
            g: PlaneGeom,
        ) -> FlexTensor {
            let ((gd, gy), (_, w)) = (f32s(&grad, KERNEL), f32s(&weight, KERNEL));
            let (gs, ws) = (slice(&gy), slice(&w));
            let out = with_layout(g, |l| l.x_backward(gs, ws, gd[0], gd[1]));
            tensor(out, vec![gd[0], gd[1], g.input[0], g.input[1]])
        }

        fn depthwise_conv2d_weight_backward(
            x: FlexTensor,
            grad: FlexTensor,
            g: PlaneGeom,
        ) -> FlexTensor {
            let ((xd, x), (_, gy)) = (f32s(&x, KERNEL), f32s(&grad, KERNEL));
            let (xs, gs) = (slice(&x), slice(&gy));
            let f = Flat::new(g);
            let (n, c, [h, wd], [oh, ow]) = (xd[0], xd[1], g.input, f.output());
            let taps = f.offsets.len();
            // One partial per plane, then a sum over the batch in a fixed order.
            let parts = planes(
                n * c,
                taps,
                [f.padded(), f.len],
                #[inline(always)]
                |p, dw, [xp, dy1]| {
                    let (xs, gs) = (&xs[p * h * wd..][..h * wd], &gs[p * oh * ow..][..oh * ow]);
                    f.weight_backward(xs, gs, dw, xp, dy1);
                },
            );
            weight_sum(&parts, c, g)
        }

        fn depthwise_conv2d_backward(
            x: FlexTensor,
            grad: FlexTensor,
            weight: FlexTensor,
            g: PlaneGeom,
        ) -> (FlexTensor, FlexTensor) {
            let ((xd, x), (_, gy), (_, w)) =
                (f32s(&x, KERNEL), f32s(&grad, KERNEL), f32s(&weight, KERNEL));
            let (xs, gs, ws) = (slice(&x), slice(&gy), slice(&w));
            let [dx, parts] = with_layout(g, |l| l.backward(xs, gs, ws, xd[0], xd[1]));
            (tensor(dx, xd.clone()), weight_sum(&parts, xd[1], g))
        }
    }

    /// The weight gradient `[C, 1, kh, kw]` from one partial per plane, summed over the batch
    /// image by image.
    fn weight_sum(parts: &[f32], c: usize, g: PlaneGeom) -> FlexTensor {
        let taps = g.kernel[0] * g.kernel[1];
        let mut out = vec![0.0f32; c * taps];
        for part in parts.chunks_exact(c * taps) {
            for (o, &v) in out.iter_mut().zip(part) {
                *o += v;
            }
        }
        tensor(out, vec![c, 1, g.kernel[0], g.kernel[1]])
    }
}

#[cfg(test)]
mod tests {
    use super::{Flat, Phases, PlaneConv, PlaneGeom};
    use crate::lanes::tests::{bits, values};

    fn scratch<const K: usize>(sizes: [usize; K]) -> [Vec<f32>; K] {
        sizes.map(|n| vec![f32::NAN; n])
    }

    /// One plane through `conv`: output, input gradient, and both gradients at once.
    fn plane(conv: &impl PlaneConv, x: &[f32], dy: &[f32], w: &[f32]) -> [Vec<f32>; 4] {
        let f = conv.flat();
        let ([h, wd], [oh, ow], taps) = (f.g.input, f.output(), f.offsets.len());
        let mut y = vec![0.0; oh * ow];
        conv.forward(x, &conv.forward_taps(w), &mut y, &mut scratch(conv.forward_scratch()));
        let back = conv.backward_taps(w);
        let mut dx = vec![0.0; h * wd];
        conv.x_backward(dy, &back, &mut dx, &mut scratch(conv.x_scratch()));
        let (mut dx2, mut dw) = (vec![0.0; h * wd], vec![0.0; taps]);
        conv.backward([x, dy], &back, [&mut dx2, &mut dw], &mut scratch(conv.backward_scratch()));
        [y, dx, dx2, dw]
    }

    #[test]
    fn the_phase_layout_is_the_stride_1_layout_strided_bitwise() {
        let mut seed = 0;
        for stride in [[2, 2], [3, 3], [2, 1], [1, 3]] {
            for (kernel, dilation) in
                [([3, 3], 1), ([5, 5], 1), ([3, 3], 2), ([5, 5], 2), ([1, 1], 1), ([2, 4], 3)]
            {
                for (input, padding) in
                    [([8, 8], [1, 1]), ([7, 9], [2, 0]), ([16, 16], [4, 4]), ([3, 2], [0, 3])]
                {
                    let g = PlaneGeom { input, kernel, stride, padding, dilation: [dilation; 2] };
                    let flat = Flat::new(g);
                    if flat.len == 0 {
                        continue;
                    }
                    seed += 1;
                    let [oh, ow] = flat.output();
                    let x = values(input[0] * input[1], seed);
                    let dy = values(oh * ow, seed + 1000);
                    let w = values(kernel[0] * kernel[1], seed + 2000);
                    let want = plane(&flat, &x, &dy, &w);
                    let got = plane(&Phases::new(g), &x, &dy, &w);
                    for (what, (a, b)) in
                        ["y", "dx", "dx (both)", "dw (both)"].iter().zip(got.iter().zip(&want))
                    {
                        assert_eq!(bits(a), bits(b), "{g:?}: {what}");
                    }
                }
            }
        }
    }
}
