//! The launches of the observer kernels: the launch plan and the backend impls for `CubeBackend`.

use super::*;

/// The panics' name for these kernels.
const OP: &str = "observer";

/// The most chunks per row for which the observer's second stage also quantizes: each of its
/// cubes reads all of the row's chunk extrema, two values per chunk, which at this count is a
/// quarter of what the cube's own chunk costs (4 096 reads and writes) and grows with the row.
/// Longer rows (over 4 Mi values, beyond a DARTS-shape batch of 64) quantize in a launch of
/// their own.
const MAX_SHARED_CHUNKS: usize = 1024;

/// What both forms of an observer launch need: the checked tensors, the first stage's chunk
/// extrema (launched here for rows longer than [`CHUNK`]) and the second stage's arguments.
pub(super) struct Plan {
    pub(super) x: CubeTensor,
    pub(super) a: CubeTensor,
    pub(super) b: CubeTensor,
    /// The chunk extrema, or (not read) `a` when the rows are one chunk.
    pub(super) parts: CubeTensor,
    pub(super) rows: usize,
    pub(super) row_len: usize,
    pub(super) chunks: usize,
    pub(super) axis: u32,
    /// [`LINEAR`], [`BLOCKED`] or [`STRIDED`].
    pub(super) layout: u32,
    pub(super) rule: u32,
    pub(super) rate: f32,
    pub(super) threshold_grid: bool,
    pub(super) symmetric: bool,
    /// `bins_or_qmin`, `qmax`, `span`, `sym_zero_point` (see `observe_kernel`).
    pub(super) k: (f32, f32, f32, f32),
}

impl Plan {
    pub(super) fn new(
        x: CubeTensor,
        a: CubeTensor,
        b: CubeTensor,
        axis: usize,
        rule: Rule,
        grid: GridRule,
    ) -> Self {
        let x = f32_strided(x, OP);
        let dims = x.meta.shape().to_vec();
        let rows = dims.get(axis).copied().unwrap_or(1);
        let row_len = x.meta.num_elements() / rows.max(1);
        assert!(rows <= u16::MAX as usize, "{OP}: {rows} channels");
        let (a, b) = (f32_contiguous(a, OP), f32_contiguous(b, OP));
        for s in [&a, &b] {
            assert_eq!(s.meta.num_elements(), rows, "{OP}: state of {rows} channels");
        }
        let layout = match (x.is_contiguous(), axis == 0 || rows == 1) {
            (true, true) => LINEAR,
            (true, false) => BLOCKED,
            (false, _) => STRIDED,
        };
        let (rule, rate) = match rule {
            Rule::AbsMax => (ABS_MAX, 0.0),
            Rule::MovingAverageAbsMax { rate } => (MOVING_ABS_MAX, rate),
            Rule::MinMax => (MIN_MAX, 0.0),
            Rule::MovingAverageMinMax { averaging_constant } => {
                (MOVING_MIN_MAX, averaging_constant)
            }
            Rule::Stored => (STORED, 0.0),
        };
        let (threshold_grid, symmetric, k) = match grid {
            GridRule::Threshold { bin_cnt } => (true, true, (bin_cnt as f32, 0.0, 0.0, 0.0)),
            GridRule::MinMax { qmin, qmax, symmetric, zero_point } => {
                let (lo, hi) = (qmin as f32, qmax as f32);
                let span = if symmetric { (hi - lo) / 2.0 } else { hi - lo };
                (false, symmetric, (lo, hi, span, zero_point))
            }
        };
        let chunks = row_len.div_ceil(CHUNK);
        let axis = axis.min(dims.len()) as u32;
        // A stored state needs no extrema.
        let parts = if chunks > 1 && rule != STORED {
            let parts = empty_shaped(&x, vec![rows * chunks * 2]);
            let units = reduce_units(CHUNK);
            chunk_extrema_kernel::launch(
                &x.client,
                CubeCount::new_2d(chunks as u32, rows as u32),
                CubeDim::new_1d(units),
                x.clone().into_tensor_arg(),
                parts.clone().into_buffer_arg(),
                row_len as u32,
                axis,
                layout,
                CHUNK as u32,
                units as usize,
            );
            parts
        } else {
            a.clone()
        };
        Plan {
            x,
            a,
            b,
            parts,
            rows,
            row_len,
            chunks,
            axis,
            layout,
            rule,
            rate,
            threshold_grid,
            symmetric,
            k,
        }
    }

    /// The six `[rows]` outputs: state, threshold, grid.
    fn outputs(&self) -> [CubeTensor; 6] {
        std::array::from_fn(|_| empty_shaped(&self.x, vec![self.rows]))
    }
}

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
        let p = Plan::new(x, a, b, axis, rule, grid);
        let out = p.outputs();
        launch(&p, &out, None, None);
        let [sa, sb, t, mult, step, zp] = out;
        (sa, sb, t, mult, step, zp)
    }

    #[allow(clippy::type_complexity)] // The trait's seven outputs.
    fn observe_fake_quant(
        x: CubeTensor,
        a: CubeTensor,
        b: CubeTensor,
        axis: usize,
        rule: Rule,
        grid: GridRule,
        layout: FusedLayout,
    ) -> (CubeTensor, CubeTensor, CubeTensor, CubeTensor, CubeTensor, CubeTensor, CubeTensor) {
        quantized(Plan::new(x, a, b, axis, rule, grid), layout, false).0
    }
}

impl MaskBackend for CubeBackend {
    #[allow(clippy::type_complexity)] // The seven outputs and the mask.
    fn observe_fake_quant_masked(
        x: CubeTensor,
        a: CubeTensor,
        b: CubeTensor,
        axis: usize,
        rule: Rule,
        grid: GridRule,
        layout: FusedLayout,
    ) -> (
        (CubeTensor, CubeTensor, CubeTensor, CubeTensor, CubeTensor, CubeTensor, CubeTensor),
        CubeTensor,
    ) {
        let (out, mask) = quantized(Plan::new(x, a, b, axis, rule, grid), layout, true);
        (out, mask.expect("a mask was asked for"))
    }

    fn fake_quant_masked_backward(mask: CubeTensor, grad: CubeTensor) -> CubeTensor {
        crate::fake_quant::cube::masked_backward(mask, grad)
    }
}

/// The observer's six outputs and the fake quantization on its grid, and with `masked` (per
/// tensor only) the clip mask of that fake quantization.
#[allow(clippy::type_complexity)] // The seven outputs and the mask.
fn quantized(
    p: Plan,
    layout: FusedLayout,
    masked: bool,
) -> (
    (CubeTensor, CubeTensor, CubeTensor, CubeTensor, CubeTensor, CubeTensor, CubeTensor),
    Option<CubeTensor>,
) {
    assert!(!masked || p.rows == 1, "{OP}: a clip mask is per tensor");
    let out = p.outputs();
    if p.chunks > MAX_SHARED_CHUNKS && p.rule != STORED {
        // Every cube of a row would read all its chunk extrema: apart, the same values.
        let x = p.x.clone();
        launch(&p, &out, None, None);
        let [sa, sb, t, mult, step, zp] = out;
        let (m, s, z) = (mult.clone(), step.clone(), zp.clone());
        let (fq, mask) = if masked {
            let (fq, mask) = fake_quant_masked(x, m, s, z, layout);
            (fq, Some(mask))
        } else {
            (<CubeBackend as FakeQuantBackend>::fake_quant_fused(x, m, s, z, layout), None)
        };
        return ((sa, sb, t, mult, step, zp, fq), mask);
    }
    let fq = empty_like(&p.x);
    let mask = masked.then(|| empty_mask(&p.x, p.row_len));
    launch(&p, &out, Some((&fq, layout)), mask.as_ref());
    let [sa, sb, t, mult, step, zp] = out;
    ((sa, sb, t, mult, step, zp, fq), mask)
}

/// Launches [`observe_kernel`] for `p` into the six outputs, with `quantize` the fake
/// quantization into its tensor, and with `mask` (per tensor, with `quantize`) its clip mask.
fn launch(
    p: &Plan,
    out: &[CubeTensor; 6],
    quantize: Option<(&CubeTensor, FusedLayout)>,
    mask: Option<&CubeTensor>,
) {
    let (fq, layout) = match quantize {
        Some((fq, layout)) => (fq.clone(), Some(layout)),
        // Not written; a buffer of its own (WebGPU binds no buffer twice in one dispatch).
        None => (empty_shaped(&p.x, vec![1]), None),
    };
    let (fq_min, fq_max, ties_away) =
        layout.map_or((0.0, 0.0, false), |l| (l.qmin as f32, l.qmax as f32, l.ties_away));
    let chunks = if layout.is_some() { p.chunks } else { 1 };
    assert!(mask.is_none() || (layout.is_some() && p.rows == 1), "{OP}: a clip mask is per tensor");
    let masked = mask.is_some();
    // Not written without a mask; a buffer of its own.
    let mask = mask.cloned().unwrap_or_else(|| empty_mask(&p.x, 1));
    // A cube's values: its chunk's (or the row's) to quantize, then its reduction's.
    let units = reduce_units(p.row_len.min(CHUNK));
    observe_kernel::launch(
        &p.x.client,
        CubeCount::new_2d(chunks as u32, p.rows as u32),
        CubeDim::new_1d(units),
        p.x.clone().into_tensor_arg(),
        p.parts.clone().into_buffer_arg(),
        p.a.clone().into_buffer_arg(),
        p.b.clone().into_buffer_arg(),
        out[0].clone().into_buffer_arg(),
        out[1].clone().into_buffer_arg(),
        out[2].clone().into_buffer_arg(),
        out[3].clone().into_buffer_arg(),
        out[4].clone().into_buffer_arg(),
        out[5].clone().into_buffer_arg(),
        fq.into_buffer_arg(),
        mask.into_buffer_arg(),
        p.row_len as u32,
        p.axis,
        p.chunks as u32,
        p.rate,
        p.k.0,
        p.k.1,
        p.k.2,
        p.k.3,
        MIN_SCALE,
        fq_min,
        fq_max,
        CHUNK as u32,
        layout.is_some(),
        masked,
        p.chunks > 1 && p.rule != STORED,
        p.layout,
        p.rule,
        p.threshold_grid,
        p.symmetric,
        ties_away,
        units as usize,
    );
}
