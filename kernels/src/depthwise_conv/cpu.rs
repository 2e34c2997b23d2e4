//! The per-plane loops of the flex kernels: the stride-1 layout (`Flat`) and the stride-phase
//! layout (`Phases`).

use super::*;

impl Flat {
    /// The largest tap offset: the zero margin the input gradient's scratch needs on each side.
    pub(super) fn reach(&self) -> usize {
        self.offsets.last().copied().unwrap_or(0)
    }

    /// `(offset, weight)` of every tap of every channel, channel after channel, from the
    /// weights `[C·kh·kw]`: the forward's [`correlate`] taps.
    pub(super) fn forward_taps(&self, w: &[f32]) -> Vec<(usize, f32)> {
        let offsets = self.offsets.iter().cycle();
        offsets.zip(w).map(|(&off, &wv)| (off, wv)).collect()
    }

    /// The input gradient's taps: `∂x_p[j] = Σ_t w_t · ∂y1[j − off_t]` read as a correlation
    /// over the interior `j ≥ j0` of the padded plane and the flat output gradient behind a
    /// zero margin of [`Flat::reach`] entries.
    pub(super) fn backward_taps(&self, w: &[f32]) -> Vec<(usize, f32)> {
        let base = self.interior().start + self.reach();
        let offsets = self.offsets.iter().cycle();
        offsets.zip(w).map(|(&off, &wv)| (base - off, wv)).collect()
    }

    /// The span of the padded plane that holds the input, first row to last.
    pub(super) fn interior(&self) -> std::ops::Range<usize> {
        let ([h, w], [ph, pw]) = (self.g.input, self.g.padding);
        let start = ph * self.wp + pw;
        start..if h == 0 { start } else { (ph + h - 1) * self.wp + pw + w }
    }

    /// One output plane `y` `[H', W']` from the input plane and the channel's `taps`
    /// ([`Flat::forward_taps`]).
    #[inline(always)]
    pub(super) fn forward(
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
    pub(super) fn x_backward(
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
    pub(super) fn spread_behind_margin(&self, dy: &[f32], dy1: &mut [f32]) {
        let m = self.reach();
        dy1[..m].fill(0.0);
        dy1[m + self.len..].fill(0.0);
        self.spread(dy, &mut dy1[m..m + self.len]);
    }

    /// [`Flat::x_backward`] from the gradient already laid out by
    /// [`Flat::spread_behind_margin`] (`len > 0`).
    #[inline(always)]
    pub(super) fn x_backward_spread(
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
    pub(super) fn weight_backward(
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
    pub(super) fn backward(
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
pub(super) trait PlaneConv: Sync {
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
    pub(super) fn forward_len(&self) -> usize {
        let [oh, ow] = self.f.output();
        if oh == 0 || ow == 0 { 0 } else { (oh - 1) * self.wq + ow }
    }

    /// The input gradient's scratch: the laid-out output gradient and one phase's result.
    pub(super) fn x_sizes(&self) -> [usize; 2] {
        [self.front + self.hq * self.row, self.hq * self.row]
    }

    /// The input gradient of one plane ([`PlaneConv::x_backward`]).
    #[inline(always)]
    pub(super) fn x_backward_phased(
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
