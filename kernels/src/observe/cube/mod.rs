//! The observer kernels: the extrema of each row (a channel, or the whole tensor) read
//! through the tensor's strides, a tree of NaN-propagating minima and maxima in shared memory,
//! and the update and grid written by the first unit of the row's first cube; with the fake
//! quantization on that grid written by the same cubes.

use burn_cubecl::CubeBackend;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::{CHUNK, GridRule, MIN_SCALE, MaskBackend, ObserveBackend, Rule};
use crate::fake_quant::cube::{
    clipped, empty_mask, fake_quant_masked, fake_quantized, pack_clipped,
};
use crate::fake_quant::{FakeQuantBackend, FusedLayout};
use crate::support::cube::{
    empty_like, empty_shaped, f32_contiguous, f32_strided, lt, reduce_units, round_ties,
};

/// The bits of ±∞ (WGSL has no infinity literal).
const POSITIVE_INFINITY: u32 = 0x7f80_0000;
const NEGATIVE_INFINITY: u32 = 0xff80_0000;

/// The comptime codes of [`Rule`].
const ABS_MAX: u32 = 0;
const MOVING_ABS_MAX: u32 = 1;
const MIN_MAX: u32 = 2;
const MOVING_MIN_MAX: u32 = 3;
const STORED: u32 = 4;

/// `min(a, b)`, NaN if either is.
#[cube]
fn least(a: f32, b: f32) -> f32 {
    select(!f32::is_nan(a) && (f32::is_nan(b) || b < a), b, a)
}

/// `max(a, b)`, NaN if either is.
#[cube]
fn most(a: f32, b: f32) -> f32 {
    select(!f32::is_nan(a) && (f32::is_nan(b) || b > a), b, a)
}

/// How a kernel finds a row's elements ([`row_at`]): `x` contiguous with its rows runs of
/// `row_len` (the leading axis, or one row), contiguous with its rows along an inner axis, or
/// through its strides.
pub(super) const LINEAR: u32 = 0;
pub(super) const BLOCKED: u32 = 1;
pub(super) const STRIDED: u32 = 2;

/// The buffer offset of element `j` of row `row` of `x`: the row is index `row` along `axis`
/// (the whole tensor when `axis` is the rank), its elements the other indices in row-major
/// order, found as `layout` says ([`LINEAR`], [`BLOCKED`], [`STRIDED`]). With `packed`, the
/// offset of that element in a contiguous tensor of `x`'s shape instead (where an output is
/// written; the same offset unless `x` is strided). In 32 bits (`f32_strided` checks the
/// tensor).
#[cube]
fn row_at(
    x: &Tensor<f32>,
    row: u32,
    j: u32,
    row_len: u32,
    axis: u32,
    #[comptime] layout: u32,
    #[comptime] packed: bool,
) -> usize {
    let mut at = row * row_len + j;
    if layout == BLOCKED {
        // Element `j` is `(outer, inner)` with `inner` in a run of `stride(axis)` values: the
        // run of its row sits `row` runs into the outer index's `rows` runs.
        let run = x.stride(axis as usize) as u32;
        let outer = j / run;
        at = j + (outer * (x.shape(axis as usize) as u32 - 1) + row) * run;
    } else if layout == STRIDED {
        at = 0u32;
        let mut rest = j;
        let mut packed_stride = 1u32;
        let mut d = x.rank() as u32;
        while d > 0 {
            d -= 1;
            let size = x.shape(d as usize) as u32;
            let mut stride = x.stride(d as usize) as u32;
            if packed {
                stride = packed_stride;
            }
            if d == axis {
                at += row * stride;
            } else {
                at += (rest % size) * stride;
                rest /= size;
            }
            packed_stride *= size;
        }
    }
    at as usize
}

/// The minimum and maximum of every unit's `(lo, hi)` over the cube, to every unit (a tree in
/// `los`, `his`, `CUBE_DIM_X` long); both are free again on return.
#[cube]
fn cube_extrema(los: &mut Shared<[f32]>, his: &mut Shared<[f32]>, lo: f32, hi: f32) -> (f32, f32) {
    let unit = UNIT_POS_X as usize;
    los[unit] = lo;
    his[unit] = hi;
    sync_cube();
    let mut active = CUBE_DIM_X as usize / 2;
    while active > 0 {
        if unit < active {
            let (l, h) = (los[unit + active], his[unit + active]);
            los[unit] = least(los[unit], l);
            his[unit] = most(his[unit], h);
        }
        sync_cube();
        active /= 2;
    }
    let out = (los[0], his[0]);
    sync_cube();
    out
}

/// The extrema of `x`'s elements `start..end` of row `row`, over the cube.
#[cube]
#[allow(clippy::too_many_arguments)]
fn span_extrema(
    x: &Tensor<f32>,
    row: u32,
    start: u32,
    end: u32,
    row_len: u32,
    axis: u32,
    #[comptime] layout: u32,
    #[comptime] units: usize,
) -> (f32, f32) {
    let mut los = Shared::<[f32]>::new_slice(units);
    let mut his = Shared::<[f32]>::new_slice(units);
    let mut lo = f32::reinterpret(POSITIVE_INFINITY);
    let mut hi = f32::reinterpret(NEGATIVE_INFINITY);
    let mut j = start + UNIT_POS_X;
    while j < end {
        let v = x[row_at(x, row, j, row_len, axis, layout, false)];
        lo = least(lo, v);
        hi = most(hi, v);
        j += CUBE_DIM_X;
    }
    cube_extrema(&mut los, &mut his, lo, hi)
}

/// First stage of long rows: cube `(p, r)` writes the extrema of chunk `p` of row `r` to
/// `parts[2·(r·P + p) ..]`.
#[cube(launch)]
fn chunk_extrema_kernel(
    x: &Tensor<f32>,
    parts: &mut [f32],
    row_len: u32,
    axis: u32,
    #[comptime] layout: u32,
    #[comptime] chunk: u32,
    #[comptime] units: usize,
) {
    let (p, r) = (CUBE_POS_X, CUBE_POS_Y);
    let start = p * chunk;
    let end = u32::min(start + chunk, row_len);
    let (lo, hi) = span_extrema(x, r, start, end, row_len, axis, layout, units);
    if UNIT_POS_X == 0 {
        let at = ((r * CUBE_COUNT_X + p) * 2) as usize;
        parts[at] = lo;
        parts[at + 1] = hi;
    }
}

/// The extrema of row `r` over the cube, to every unit: of `x` itself, or of the row's
/// `n_parts` chunk extrema in `parts` when `from_parts`.
#[cube]
#[allow(clippy::too_many_arguments, unused_assignments)]
fn row_extrema(
    x: &Tensor<f32>,
    parts: &[f32],
    r: u32,
    row_len: u32,
    axis: u32,
    n_parts: u32,
    #[comptime] from_parts: bool,
    #[comptime] layout: u32,
    #[comptime] units: usize,
) -> (f32, f32) {
    let mut m = 0.0f32;
    let mut big_m = 0.0f32;
    if from_parts {
        let mut los = Shared::<[f32]>::new_slice(units);
        let mut his = Shared::<[f32]>::new_slice(units);
        let mut lo = f32::reinterpret(POSITIVE_INFINITY);
        let mut hi = f32::reinterpret(NEGATIVE_INFINITY);
        let mut p = UNIT_POS_X;
        while p < n_parts {
            let at = ((r * n_parts + p) * 2) as usize;
            lo = least(lo, parts[at]);
            hi = most(hi, parts[at + 1]);
            p += CUBE_DIM_X;
        }
        let (l, h) = cube_extrema(&mut los, &mut his, lo, hi);
        m = l;
        big_m = h;
    } else {
        let (l, h) = span_extrema(x, r, 0, row_len, row_len, axis, layout, units);
        m = l;
        big_m = h;
    }
    (m, big_m)
}

/// A channel's state `(a, b)` updated by the extrema `(m, M)` of its row, and the grid it
/// derives: `(a', b', T, mult, step, zero_point)` (see [`Rule`] and [`GridRule`]).
#[cube]
#[allow(clippy::too_many_arguments, unused_assignments)]
fn update_and_grid(
    m: f32,
    big_m: f32,
    a: f32,
    b: f32,
    rate: f32,
    bins_or_qmin: f32,
    qmax: f32,
    span: f32,
    sym_zero_point: f32,
    min_scale: f32,
    #[comptime] rule: u32,
    #[comptime] threshold_grid: bool,
    #[comptime] symmetric: bool,
) -> (f32, f32, f32, f32, f32, f32) {
    // The state `(a, b)` and threshold `t` after the update.
    let mut sa = 0.0f32;
    let mut sb = 0.0f32;
    let mut t = 0.0f32;
    if rule == ABS_MAX {
        t = most(f32::abs(m), f32::abs(big_m));
        sa = t;
        sb = t;
    } else if rule == MOVING_ABS_MAX {
        let current = most(f32::abs(m), f32::abs(big_m));
        sa = a * rate + 1.0;
        sb = b * rate + current;
        t = sb / sa;
    } else if rule == MIN_MAX {
        sa = select(lt(m, a), m, a);
        sb = select(lt(b, big_m), big_m, b);
    } else if rule == STORED {
        sa = a;
        sb = b;
        t = a;
    } else {
        let first = f32::is_inf(a);
        sa = select(first, m, a + (m - a) * rate);
        sb = select(first, big_m, b + (big_m - b) * rate);
    }
    let mut step = 0.0f32;
    let mut zp = 0.0f32;
    let mut mult = 0.0f32;
    if threshold_grid {
        let tc = select(lt(t, min_scale), min_scale, t);
        mult = f32::recip(tc) * bins_or_qmin;
        step = tc / bins_or_qmin;
        // 0, from the host: a zero the compiler sees would let it fold `r + 0` into `r` in the
        // fake quantization that follows, turning the +0 of `−0 + 0` into −0.
        zp = sym_zero_point;
    } else {
        let min_neg = select(lt(0.0, sa), 0.0, sa);
        let max_pos = select(lt(sb, 0.0), 0.0, sb);
        let mut scale = 0.0f32;
        if symmetric {
            let neg = -min_neg;
            let max_abs = select(lt(neg, max_pos), max_pos, neg);
            scale = max_abs / span;
            scale = select(lt(scale, min_scale), min_scale, scale);
            zp = sym_zero_point;
        } else {
            scale = (max_pos - min_neg) / span;
            scale = select(lt(scale, min_scale), min_scale, scale);
            let z = -round_ties(min_neg / scale, false) + bins_or_qmin;
            zp = select(lt(qmax, z), qmax, z);
            zp = select(lt(zp, bins_or_qmin), bins_or_qmin, zp);
        }
        step = select(lt(scale, min_scale), min_scale, scale);
        mult = f32::recip(step);
    }
    (sa, sb, t, mult, step, zp)
}

/// Second stage: cube `(p, r)` finds the extrema of row `r` (of `x`, or of its `parts` when
/// `from_parts`: every cube of the row combines the same chunk extrema in the same order),
/// updates the state and derives the grid, written by the row's first cube; with `quantize`,
/// it then writes the fake-quantized elements `p·chunk ..` of the row to `out`, contiguous
/// (one cube per chunk of a row), else the launch has one cube per row and `out` is not
/// written.
#[cube(launch)]
#[allow(clippy::too_many_arguments, unused_assignments)]
fn observe_kernel(
    x: &Tensor<f32>,
    parts: &[f32],
    a: &[f32],
    b: &[f32],
    out_a: &mut [f32],
    out_b: &mut [f32],
    out_t: &mut [f32],
    out_mult: &mut [f32],
    out_step: &mut [f32],
    out_zp: &mut [f32],
    out: &mut [f32],
    mask: &mut [u32],
    row_len: u32,
    axis: u32,
    n_parts: u32,
    rate: f32,
    bins_or_qmin: f32,
    qmax: f32,
    span: f32,
    sym_zero_point: f32,
    min_scale: f32,
    fq_min: f32,
    fq_max: f32,
    #[comptime] chunk: u32,
    #[comptime] quantize: bool,
    #[comptime] masked: bool,
    #[comptime] from_parts: bool,
    #[comptime] layout: u32,
    #[comptime] rule: u32,
    #[comptime] threshold_grid: bool,
    #[comptime] symmetric: bool,
    #[comptime] ties_away: bool,
    #[comptime] units: usize,
) {
    let (p, r) = (CUBE_POS_X, CUBE_POS_Y);
    let mut m = 0.0f32;
    let mut big_m = 0.0f32;
    if rule != STORED {
        let (l, h) = row_extrema(x, parts, r, row_len, axis, n_parts, from_parts, layout, units);
        m = l;
        big_m = h;
    }
    let c = r as usize;
    // Every unit derives the grid (the same operations on the same values), so none waits.
    let (sa, sb, t, mult, step, zp) = update_and_grid(
        m,
        big_m,
        a[c],
        b[c],
        rate,
        bins_or_qmin,
        qmax,
        span,
        sym_zero_point,
        min_scale,
        rule,
        threshold_grid,
        symmetric,
    );
    if p == 0 && UNIT_POS_X == 0 {
        out_a[c] = sa;
        out_b[c] = sb;
        out_t[c] = t;
        out_mult[c] = mult;
        out_step[c] = step;
        out_zp[c] = zp;
    }
    if quantize {
        let start = p * chunk;
        let end = u32::min(start + chunk, row_len);
        if masked {
            // One row (per tensor), its elements in `out`'s order: the units of each pass are
            // consecutive elements, whose clip flags are packed into the mask after it.
            let mut bits = Shared::<[u32]>::new_slice(units);
            let mut base = start;
            while base < end {
                let j = base + UNIT_POS_X;
                let mut clip = false;
                if j < end {
                    let v = x[row_at(x, r, j, row_len, axis, layout, false)];
                    out[row_at(x, r, j, row_len, axis, layout, true)] =
                        fake_quantized(v, mult, step, zp, fq_min, fq_max, ties_away);
                    clip = clipped(v, mult, zp, fq_min, fq_max, ties_away);
                }
                pack_clipped(&mut bits, clip, base, end, mask);
                base += CUBE_DIM_X;
            }
        } else {
            let mut j = start + UNIT_POS_X;
            while j < end {
                let v = x[row_at(x, r, j, row_len, axis, layout, false)];
                out[row_at(x, r, j, row_len, axis, layout, true)] =
                    fake_quantized(v, mult, step, zp, fq_min, fq_max, ties_away);
                j += CUBE_DIM_X;
            }
        }
    }
}

mod launch;
mod many;
