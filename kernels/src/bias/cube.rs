//! The int32 bias kernels for the CubeCL backends.

use burn_cubecl::CubeBackend;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::{BiasBackend, TINY_STEP};
use crate::support::cube::{elementwise, empty_like, f32_contiguous, lt, round_ties};

/// `out = b_q − b` per element (see the module docs).
#[cube(launch)]
fn residual_kernel(
    b: &[f32],
    unit: &[f32],
    out: &mut [f32],
    tiny: f32,
    #[comptime] ties_away: bool,
) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        let bi = b[i];
        out[i] = int32_of(bi, unit[i], tiny, ties_away) - bi;
    }
}

/// `b_q = clamp(round(b/s), −2³¹, 2³¹ − 1)·s` with `s = |unit|`, or `b` where
/// `s < tiny` (see the module docs).
#[cube]
pub(crate) fn int32_of(bi: f32, unit: f32, tiny: f32, #[comptime] ties_away: bool) -> f32 {
    let step = f32::abs(unit);
    let small = step < tiny;
    let safe = select(small, 1.0, step);
    let r = round_ties(bi / safe, ties_away);
    let q = select(lt(r, INT_MIN), INT_MIN, select(lt(INT_MAX, r), INT_MAX, r));
    select(small, bi, q * safe)
}

/// `out = b + (b_q − b)` per element, the unit `|f₀·f₁·f₂|` (the factors past `factors`
/// unused, each read at its index modulo its length: a `[1]` factor is broadcast).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn rounded_kernel(
    b: &[f32],
    f0: &[f32],
    f1: &[f32],
    f2: &[f32],
    out: &mut [f32],
    n0: u32,
    n1: u32,
    n2: u32,
    tiny: f32,
    #[comptime] factors: u32,
    #[comptime] ties_away: bool,
) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        let i32 = i as u32;
        let bi = b[i];
        let mut unit = f0[(i32 % n0) as usize];
        if factors > 1 {
            unit *= f1[(i32 % n1) as usize];
        }
        if factors > 2 {
            unit *= f2[(i32 % n2) as usize];
        }
        out[i] = bi + (int32_of(bi, unit, tiny, ties_away) - bi);
    }
}

/// −2³¹ and 2³¹ − 1 as f32 (the latter rounds to 2³¹, as in the expressions' clamp).
const INT_MIN: f32 = -2_147_483_648.0;
const INT_MAX: f32 = 2_147_483_648.0;

/// The panics' name for this kernel.
const OP: &str = "bias rounding";

impl BiasBackend for CubeBackend {
    fn int32_residual(b: CubeTensor, unit: CubeTensor, ties_away: bool) -> CubeTensor {
        let (b, unit) = (f32_contiguous(b, OP), f32_contiguous(unit, OP));
        let out = empty_like(&b);
        let (cubes, dim) = elementwise(&b.client, b.meta.num_elements());
        residual_kernel::launch(
            &b.client,
            cubes,
            dim,
            b.clone().into_buffer_arg(),
            unit.into_buffer_arg(),
            out.clone().into_buffer_arg(),
            TINY_STEP,
            ties_away,
        );
        out
    }

    fn int32_rounded(
        b: CubeTensor,
        f0: CubeTensor,
        f1: CubeTensor,
        f2: CubeTensor,
        count: u32,
        ties_away: bool,
    ) -> CubeTensor {
        let b = f32_contiguous(b, OP);
        let factors = [f0, f1, f2].map(|f| f32_contiguous(f, OP));
        let len = |k: usize| factors[k].meta.num_elements() as u32;
        let arg = |k: usize| factors[k].clone().into_buffer_arg();
        let out = empty_like(&b);
        let (cubes, dim) = elementwise(&b.client, b.meta.num_elements());
        rounded_kernel::launch(
            &b.client,
            cubes,
            dim,
            b.clone().into_buffer_arg(),
            arg(0),
            arg(1),
            arg(2),
            out.clone().into_buffer_arg(),
            len(0),
            len(1),
            len(2),
            TINY_STEP,
            count,
            ties_away,
        );
        out
    }
}
