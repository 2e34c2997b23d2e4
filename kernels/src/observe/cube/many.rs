//! Several tensors' observers and fake quantizations in one launch: one cube per row of every
//! tensor, as [`observe_kernel`](super::observe_kernel) runs one tensor's rows of at most
//! [`CHUNK`] elements, each tensor with its own state and outputs.

use super::launch::Plan;
use super::*;
use crate::cat::taken;
use crate::observe::ManyBackend;
use crate::support::cube::{Packing, packed};

/// Each unit's extrema over its stride of row `r`'s elements, in the tensor of `xs` that
/// holds the row (`(+∞, −∞)` with a stored state, which reads none).
#[cube]
#[allow(clippy::too_many_arguments)]
fn own_row_extrema(
    xs: &Sequence<OwnedTensor<f32>>,
    rows: &Sequence<u32>,
    row_lens: &Sequence<u32>,
    r: u32,
    axis: u32,
    #[comptime] layouts: u32,
    #[comptime] rule: u32,
) -> (f32, f32) {
    let mut lo = f32::reinterpret(POSITIVE_INFINITY);
    let mut hi = f32::reinterpret(NEGATIVE_INFINITY);
    if rule != STORED {
        let count = comptime!(xs.len());
        #[unroll]
        for t in 0..count {
            let layout = comptime!((layouts >> (2 * t)) & 3);
            let x = &xs[t];
            if r >= rows[t] && r < rows[t + 1] {
                let (row, row_len) = (r - rows[t], row_lens[t]);
                let mut j = UNIT_POS_X;
                while j < row_len {
                    let v = x[row_at(x, row, j, row_len, axis, layout, false)];
                    lo = least(lo, v);
                    hi = most(hi, v);
                    j += CUBE_DIM_X;
                }
            }
        }
    }
    (lo, hi)
}

/// [`observe_kernel`](super::observe_kernel)'s one-chunk rows with the fake quantization,
/// over the tensors `xs`: cube `r` is row `r − rows[t]` of tensor `t` for `rows[t] ≤ r <
/// rows[t + 1]`, with state `as_[t]`, `bs[t]`; its state, threshold and grid are written to
/// the six flat outputs from `states[t]`, its fake-quantized elements to `out` from
/// `outs[t]` (contiguous).
#[cube(launch)]
#[allow(clippy::too_many_arguments, unused_assignments)]
pub(super) fn observe_many_kernel(
    xs: &Sequence<OwnedTensor<f32>>,
    as_: &Sequence<OwnedTensor<f32>>,
    bs: &Sequence<OwnedTensor<f32>>,
    rows: Sequence<u32>,
    row_lens: Sequence<u32>,
    states: Sequence<usize>,
    outs: Sequence<usize>,
    out_a: &mut [f32],
    out_b: &mut [f32],
    out_t: &mut [f32],
    out_mult: &mut [f32],
    out_step: &mut [f32],
    out_zp: &mut [f32],
    out: &mut [f32],
    axis: u32,
    rate: f32,
    bins_or_qmin: f32,
    qmax: f32,
    span: f32,
    sym_zero_point: f32,
    min_scale: f32,
    fq_min: f32,
    fq_max: f32,
    #[comptime] layouts: u32,
    #[comptime] rule: u32,
    #[comptime] threshold_grid: bool,
    #[comptime] symmetric: bool,
    #[comptime] ties_away: bool,
    #[comptime] units: usize,
) {
    let r = CUBE_POS_Y;
    let count = comptime!(xs.len());
    // The cube's row lies in one tensor: each unit's extrema over that row's elements, then
    // one tree over the cube (every unit reaches its barriers).
    let (lo, hi) = own_row_extrema(xs, &rows, &row_lens, r, axis, layouts, rule);
    let mut m = 0.0f32;
    let mut big_m = 0.0f32;
    if rule != STORED {
        let mut los = Shared::<[f32]>::new_slice(units);
        let mut his = Shared::<[f32]>::new_slice(units);
        let (l, h) = cube_extrema(&mut los, &mut his, lo, hi);
        m = l;
        big_m = h;
    }
    #[unroll]
    for t in 0..count {
        let layout = comptime!((layouts >> (2 * t)) & 3);
        let x = &xs[t];
        if r >= rows[t] && r < rows[t + 1] {
            let (row, row_len) = (r - rows[t], row_lens[t]);
            let c = row as usize;
            let (sa, sb, th, mult, step, zp) = update_and_grid(
                m,
                big_m,
                as_[t][c],
                bs[t][c],
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
            if UNIT_POS_X == 0 {
                let at = states[t] + c;
                out_a[at] = sa;
                out_b[at] = sb;
                out_t[at] = th;
                out_mult[at] = mult;
                out_step[at] = step;
                out_zp[at] = zp;
            }
            let base = outs[t];
            let mut j = UNIT_POS_X;
            while j < row_len {
                let v = x[row_at(x, row, j, row_len, axis, layout, false)];
                out[base + row_at(x, row, j, row_len, axis, layout, true)] =
                    fake_quantized(v, mult, step, zp, fq_min, fq_max, ties_away);
                j += CUBE_DIM_X;
            }
        }
    }
}

impl ManyBackend for CubeBackend {
    fn observe_fake_quant_many(
        x0: CubeTensor,
        x1: CubeTensor,
        x2: CubeTensor,
        x3: CubeTensor,
        x4: CubeTensor,
        x5: CubeTensor,
        x6: CubeTensor,
        x7: CubeTensor,
        a0: CubeTensor,
        a1: CubeTensor,
        a2: CubeTensor,
        a3: CubeTensor,
        a4: CubeTensor,
        a5: CubeTensor,
        a6: CubeTensor,
        a7: CubeTensor,
        b0: CubeTensor,
        b1: CubeTensor,
        b2: CubeTensor,
        b3: CubeTensor,
        b4: CubeTensor,
        b5: CubeTensor,
        b6: CubeTensor,
        b7: CubeTensor,
        count: usize,
        axis: usize,
        rule: Rule,
        grid: GridRule,
        (qmin, qmax, ties_away): (i32, i32, bool),
    ) -> Vec<CubeTensor> {
        let xs = taken([x0, x1, x2, x3, x4, x5, x6, x7], count);
        let a = taken([a0, a1, a2, a3, a4, a5, a6, a7], count);
        let b = taken([b0, b1, b2, b3, b4, b5, b6, b7], count);
        let plans: Vec<Plan> = xs
            .into_iter()
            .zip(a)
            .zip(b)
            .map(|((x, a), b)| Plan::new(x, a, b, axis, rule, grid))
            .collect();
        let first = &plans[0];
        assert!(plans.iter().all(|p| p.chunks == 1), "observer: a row longer than {CHUNK}");
        let (mut x_args, mut a_args, mut b_args) =
            (SequenceArg::new(), SequenceArg::new(), SequenceArg::new());
        let (mut rows, mut row_lens) = (SequenceArg::<u32>::new(), SequenceArg::<u32>::new());
        let mut total = 0;
        rows.push(0);
        for p in &plans {
            x_args.push(p.x.clone().into_tensor_arg());
            a_args.push(p.a.clone().into_tensor_arg());
            b_args.push(p.b.clone().into_tensor_arg());
            total += p.rows as u32;
            rows.push(total);
            row_lens.push(p.row_len as u32);
        }
        let layouts = plans.iter().enumerate().fold(0u32, |l, (t, p)| l | p.layout << (2 * t));
        let state_shapes: Vec<Vec<usize>> = plans.iter().map(|p| vec![p.rows]).collect();
        let states: [Packing; 6] = std::array::from_fn(|_| packed(&first.x, state_shapes.clone()));
        let fq = packed(&first.x, plans.iter().map(|p| p.x.meta.shape().to_vec()).collect());
        let (mut state_at, mut out_at) = (SequenceArg::<usize>::new(), SequenceArg::<usize>::new());
        for (&s, &o) in states[0].starts.iter().zip(&fq.starts) {
            state_at.push(s);
            out_at.push(o);
        }
        let units = reduce_units(plans.iter().map(|p| p.row_len).max().unwrap_or(0));
        observe_many_kernel::launch(
            &first.x.client,
            CubeCount::new_2d(1, total),
            CubeDim::new_1d(units),
            x_args,
            a_args,
            b_args,
            rows,
            row_lens,
            state_at,
            out_at,
            states[0].flat.clone().into_buffer_arg(),
            states[1].flat.clone().into_buffer_arg(),
            states[2].flat.clone().into_buffer_arg(),
            states[3].flat.clone().into_buffer_arg(),
            states[4].flat.clone().into_buffer_arg(),
            states[5].flat.clone().into_buffer_arg(),
            fq.flat.clone().into_buffer_arg(),
            first.axis,
            first.rate,
            first.k.0,
            first.k.1,
            first.k.2,
            first.k.3,
            MIN_SCALE,
            qmin as f32,
            qmax as f32,
            layouts,
            first.rule,
            first.threshold_grid,
            first.symmetric,
            ties_away,
            units as usize,
        );
        unpacked(states.into_iter().chain([fq]), count)
    }
}

/// The parts of `packs` (each holding one part per tensor), tensor after tensor: each tensor's
/// parts in the packs' order.
fn unpacked(packs: impl IntoIterator<Item = Packing>, count: usize) -> Vec<CubeTensor> {
    let mut parts: Vec<std::vec::IntoIter<CubeTensor>> =
        packs.into_iter().map(|p| p.parts().into_iter()).collect();
    (0..count)
        .flat_map(|_| {
            parts.iter_mut().map(|p| p.next().expect("a part per tensor")).collect::<Vec<_>>()
        })
        .collect()
}
