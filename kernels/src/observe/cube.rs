//! The observer kernels: the extrema of each row (a channel, or the whole tensor) read
//! through the tensor's strides, a tree of NaN-propagating minima and maxima in shared memory,
//! and the update and grid written by the first unit of the cube that finishes the row.

use burn_cubecl::CubeBackend;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::{CHUNK, GridRule, MIN_SCALE, ObserveBackend, Rule};
use crate::lanes::cube::{empty_shaped, f32_contiguous, f32_strided, lt, round_ties};

/// Threads of a cube (a power of two: the tree halves it).
const UNITS: u32 = 256;

/// The bits of ±∞ (WGSL has no infinity literal).
const POSITIVE_INFINITY: u32 = 0x7f80_0000;
const NEGATIVE_INFINITY: u32 = 0xff80_0000;

/// The comptime codes of [`Rule`].
const ABS_MAX: u32 = 0;
const MOVING_ABS_MAX: u32 = 1;
const MIN_MAX: u32 = 2;
const MOVING_MIN_MAX: u32 = 3;

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

/// The buffer offset of element `j` of row `row` of `x`: the row is index `row` along `axis`
/// (the whole tensor when `axis` is the rank), its elements the other indices in row-major
/// order; `linear`: `x` is contiguous and its rows are runs of `row_len`. In 32 bits
/// (`f32_strided` checks the tensor).
#[cube]
fn row_at(
    x: &Tensor<f32>,
    row: u32,
    j: u32,
    row_len: u32,
    axis: u32,
    #[comptime] linear: bool,
) -> usize {
    let mut at = row * row_len + j;
    if !linear {
        let rank = x.rank() as u32;
        at = 0u32;
        if axis < rank {
            at = row * x.stride(axis as usize) as u32;
        }
        let mut rest = j;
        let mut d = rank;
        while d > 0 {
            d -= 1;
            if d != axis {
                let size = x.shape(d as usize) as u32;
                at += (rest % size) * x.stride(d as usize) as u32;
                rest /= size;
            }
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
    #[comptime] linear: bool,
    #[comptime] units: usize,
) -> (f32, f32) {
    let mut los = Shared::<[f32]>::new_slice(units);
    let mut his = Shared::<[f32]>::new_slice(units);
    let mut lo = f32::reinterpret(POSITIVE_INFINITY);
    let mut hi = f32::reinterpret(NEGATIVE_INFINITY);
    let mut j = start + UNIT_POS_X;
    while j < end {
        let v = x[row_at(x, row, j, row_len, axis, linear)];
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
    #[comptime] linear: bool,
    #[comptime] chunk: u32,
    #[comptime] units: usize,
) {
    let (p, r) = (CUBE_POS_X, CUBE_POS_Y);
    let start = p * chunk;
    let end = u32::min(start + chunk, row_len);
    let (lo, hi) = span_extrema(x, r, start, end, row_len, axis, linear, units);
    if UNIT_POS_X == 0 {
        let at = ((r * CUBE_COUNT_X + p) * 2) as usize;
        parts[at] = lo;
        parts[at + 1] = hi;
    }
}

/// Second stage: cube `r` finds the extrema of row `r` (of `x`, or of its `parts` when
/// `from_parts`), updates the state and writes the grid.
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
    row_len: u32,
    axis: u32,
    n_parts: u32,
    rate: f32,
    bins_or_qmin: f32,
    qmax: f32,
    span: f32,
    sym_zero_point: f32,
    min_scale: f32,
    #[comptime] from_parts: bool,
    #[comptime] linear: bool,
    #[comptime] rule: u32,
    #[comptime] threshold_grid: bool,
    #[comptime] symmetric: bool,
    #[comptime] units: usize,
) {
    let r = CUBE_POS_X;
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
        let (l, h) = span_extrema(x, r, 0, row_len, row_len, axis, linear, units);
        m = l;
        big_m = h;
    }
    if UNIT_POS_X == 0 {
        let c = r as usize;
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
            sa = a[c] * rate + 1.0;
            sb = b[c] * rate + current;
            t = sb / sa;
        } else if rule == MIN_MAX {
            let (lo, hi) = (a[c], b[c]);
            sa = select(lt(m, lo), m, lo);
            sb = select(lt(hi, big_m), big_m, hi);
        } else {
            let (lo, hi) = (a[c], b[c]);
            let first = f32::is_inf(lo);
            sa = select(first, m, lo + (m - lo) * rate);
            sb = select(first, big_m, hi + (big_m - hi) * rate);
        }
        let mut step = 0.0f32;
        let mut zp = 0.0f32;
        let mut mult = 0.0f32;
        if threshold_grid {
            let tc = select(lt(t, min_scale), min_scale, t);
            mult = f32::recip(tc) * bins_or_qmin;
            step = tc / bins_or_qmin;
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
        out_a[c] = sa;
        out_b[c] = sb;
        out_t[c] = t;
        out_mult[c] = mult;
        out_step[c] = step;
        out_zp[c] = zp;
    }
}

/// The panics' name for these kernels.
const OP: &str = "observer";

impl ObserveBackend for CubeBackend {
    #[allow(clippy::type_complexity)] // The trait's six outputs.
    fn observe(
        x: CubeTensor,
        a: CubeTensor,
        b: CubeTensor,
        axis: usize,
        rule: Rule,
        grid: GridRule,
    ) -> (CubeTensor, CubeTensor, CubeTensor, CubeTensor, CubeTensor, CubeTensor) {
        let x = f32_strided(x, OP);
        let dims = x.meta.shape().to_vec();
        let rows = dims.get(axis).copied().unwrap_or(1);
        let row_len = x.meta.num_elements() / rows.max(1);
        assert!(rows <= u16::MAX as usize, "{OP}: {rows} channels");
        let (a, b) = (f32_contiguous(a, OP), f32_contiguous(b, OP));
        for s in [&a, &b] {
            assert_eq!(s.meta.num_elements(), rows, "{OP}: state of {rows} channels");
        }
        let linear = x.is_contiguous() && (axis == 0 || rows == 1);
        let (rule_code, rate) = match rule {
            Rule::AbsMax => (ABS_MAX, 0.0),
            Rule::MovingAverageAbsMax { rate } => (MOVING_ABS_MAX, rate),
            Rule::MinMax => (MIN_MAX, 0.0),
            Rule::MovingAverageMinMax { averaging_constant } => {
                (MOVING_MIN_MAX, averaging_constant)
            }
        };
        let (threshold_grid, symmetric, k) = match grid {
            GridRule::Threshold { bin_cnt } => (true, true, (bin_cnt as f32, 0.0, 0.0, 0.0)),
            GridRule::MinMax { qmin, qmax, symmetric, zero_point } => {
                let (lo, hi) = (qmin as f32, qmax as f32);
                let span = if symmetric { (hi - lo) / 2.0 } else { hi - lo };
                (false, symmetric, (lo, hi, span, zero_point))
            }
        };
        let client = x.client.clone();
        let chunks = row_len.div_ceil(CHUNK);
        let from_parts = chunks > 1;
        let axis_u32 = axis.min(dims.len()) as u32;
        let parts = if from_parts {
            let parts = empty_shaped(&x, vec![rows * chunks * 2]);
            chunk_extrema_kernel::launch(
                &client,
                CubeCount::new_2d(chunks as u32, rows as u32),
                CubeDim::new_1d(UNITS),
                x.clone().into_tensor_arg(),
                parts.clone().into_buffer_arg(),
                row_len as u32,
                axis_u32,
                linear,
                CHUNK as u32,
                UNITS as usize,
            );
            parts
        } else {
            // Not read: the kernel reduces `x` itself.
            a.clone()
        };
        let out: Vec<CubeTensor> = (0..6).map(|_| empty_shaped(&x, vec![rows])).collect();
        observe_kernel::launch(
            &client,
            CubeCount::new_1d(rows as u32),
            CubeDim::new_1d(UNITS),
            x.clone().into_tensor_arg(),
            parts.into_buffer_arg(),
            a.into_buffer_arg(),
            b.into_buffer_arg(),
            out[0].clone().into_buffer_arg(),
            out[1].clone().into_buffer_arg(),
            out[2].clone().into_buffer_arg(),
            out[3].clone().into_buffer_arg(),
            out[4].clone().into_buffer_arg(),
            out[5].clone().into_buffer_arg(),
            row_len as u32,
            axis_u32,
            chunks as u32,
            rate,
            k.0,
            k.1,
            k.2,
            k.3,
            MIN_SCALE,
            from_parts,
            linear,
            rule_code,
            threshold_grid,
            symmetric,
            UNITS as usize,
        );
        let [sa, sb, t, mult, step, zp]: [CubeTensor; 6] = out.try_into().expect("six outputs");
        (sa, sb, t, mult, step, zp)
    }
}
