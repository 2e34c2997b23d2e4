//! The launches of the BatchNorm kernels: the backend impls for `CubeBackend`.

use super::*;

/// The panics' name for these kernels.
const OP: &str = "channel op";

/// A `[C]` or `[2, C]` operand, contiguous (these are small; a copy, when one is needed, is
/// cheap).
fn small(t: CubeTensor) -> CubeTensor {
    f32_contiguous(t, OP)
}

/// `[N, C, H, W]` `x` as the kernels' u32 index arguments `(N, C, H·W, W)`, after checking that
/// it is f32 and that every index and buffer offset fits in 32 bits.
fn strided(x: &CubeTensor) -> (u32, u32, u32, u32) {
    let dims = f32_strided(x.clone(), OP).meta.shape().clone();
    assert_eq!(dims.len(), 4, "{OP}: expected [N, C, H, W], got {dims:?}");
    let [n, c, h, w] = [dims[0], dims[1], dims[2], dims[3]].map(|d| d as u32);
    (n, c, (h * w).max(1), w.max(1))
}

/// One cube per channel of `plane` values in each of `n` images, and its threads (also the
/// kernels' comptime `units`).
fn per_channel(n: u32, c: u32, plane: u32) -> (CubeCount, CubeDim, usize) {
    let units = reduce_units(n as usize * plane as usize);
    (CubeCount::new_1d(c), CubeDim::new_1d(units), units as usize)
}

fn scale_shift(x: CubeTensor, w: CubeTensor, b: Option<CubeTensor>) -> CubeTensor {
    let (_, c, plane, width) = strided(&x);
    let w = small(w);
    let shift = b.is_some();
    let b = b.map(small).unwrap_or_else(|| w.clone());
    let out = empty_like(&x);
    let (count, dim) = elementwise(&x.client, x.meta.num_elements());
    scale_shift_kernel::launch(
        &x.client,
        count,
        dim,
        x.clone().into_tensor_arg(),
        w.into_buffer_arg(),
        b.into_buffer_arg(),
        out.clone().into_buffer_arg(),
        plane,
        width,
        c,
        shift,
    );
    out
}

/// The launch of `moments_fold_kernel`: `[m, w, b, running mean, running var]` and, with
/// `normalize`, `y = x·w + b`. `constants`: `(factors, ε, momentum, unbias, ties_away)`.
fn fold(
    x: CubeTensor,
    [mean, var, f0, f1]: [CubeTensor; 4],
    (factors, epsilon, momentum, unbias, ties_away): (u32, f32, f32, f32, bool),
    normalize: bool,
) -> ([CubeTensor; 5], Option<CubeTensor>) {
    let (n, c, plane, width) = strided(&x);
    let (mean, var, f0, f1) = (small(mean), small(var), small(f0), small(f1));
    // Each factor's value `i` stands for its run of `C/L` channels.
    let run = |f: &CubeTensor| c / (f.meta.num_elements() as u32).max(1);
    let (run0, run1) = (run(&f0), run(&f1));
    let m = empty_shaped(&x, vec![2, c as usize]);
    let [w, b, running_mean, running_var] = [(); 4].map(|()| empty_shaped(&x, vec![c as usize]));
    // Not written without `normalize`; a buffer of its own.
    let y = if normalize { empty_like(&x) } else { empty_shaped(&x, vec![1]) };
    let (cubes, dim, units) = per_channel(n, c, plane);
    moments_fold_kernel::launch(
        &x.client,
        cubes,
        dim,
        x.clone().into_tensor_arg(),
        mean.into_buffer_arg(),
        var.into_buffer_arg(),
        f0.into_buffer_arg(),
        f1.into_buffer_arg(),
        m.clone().into_buffer_arg(),
        w.clone().into_buffer_arg(),
        b.clone().into_buffer_arg(),
        running_mean.clone().into_buffer_arg(),
        running_var.clone().into_buffer_arg(),
        y.clone().into_buffer_arg(),
        n,
        plane,
        width,
        epsilon,
        momentum,
        unbias,
        run0.max(1),
        run1.max(1),
        TINY_STEP,
        units,
        factors,
        ties_away,
        normalize,
    );
    ([m, w, b, running_mean, running_var], normalize.then_some(y))
}

impl ChannelBackend for CubeBackend {
    fn channel_moments(x: CubeTensor) -> CubeTensor {
        let (n, c, plane, width) = strided(&x);
        let out = empty_shaped(&x, vec![2, c as usize]);
        let (cubes, dim, units) = per_channel(n, c, plane);
        moments_kernel::launch(
            &x.client,
            cubes,
            dim,
            x.clone().into_tensor_arg(),
            out.clone().into_buffer_arg(),
            n,
            plane,
            width,
            units,
        );
        out
    }

    fn channel_moments_backward(
        x: CubeTensor,
        moments: CubeTensor,
        grad: CubeTensor,
    ) -> CubeTensor {
        let (_, c, plane, width) = strided(&x);
        let (m, g) = (small(moments), small(grad));
        let count = (x.meta.num_elements() / c.max(1) as usize) as f32;
        let out = empty_like(&x);
        let (cubes, dim) = elementwise(&x.client, x.meta.num_elements());
        moments_backward_kernel::launch(
            &x.client,
            cubes,
            dim,
            x.clone().into_tensor_arg(),
            m.into_buffer_arg(),
            g.into_buffer_arg(),
            out.clone().into_buffer_arg(),
            plane,
            width,
            c,
            count,
        );
        out
    }

    fn channel_affine(x: CubeTensor, w: CubeTensor, b: CubeTensor) -> CubeTensor {
        scale_shift(x, w, Some(b))
    }

    fn channel_affine_x_backward(grad: CubeTensor, w: CubeTensor) -> CubeTensor {
        scale_shift(grad, w, None)
    }

    fn channel_affine_wb_backward(x: CubeTensor, grad: CubeTensor) -> CubeTensor {
        let (n, c, plane, width) = strided(&x);
        assert_eq!(grad.meta.shape(), x.meta.shape(), "channel op: ∂y and x differ in shape");
        strided(&grad);
        let out = empty_shaped(&x, vec![2, c as usize]);
        let (cubes, dim, units) = per_channel(n, c, plane);
        affine_wb_kernel::launch(
            &x.client,
            cubes,
            dim,
            x.clone().into_tensor_arg(),
            grad.into_tensor_arg(),
            out.clone().into_buffer_arg(),
            n,
            plane,
            width,
            units,
        );
        out
    }
}

impl FoldBackend for CubeBackend {
    #[allow(clippy::too_many_arguments)]
    fn channel_fold(
        x: CubeTensor,
        mean: CubeTensor,
        var: CubeTensor,
        f0: CubeTensor,
        f1: CubeTensor,
        factors: u32,
        epsilon: f32,
        momentum: f32,
        unbias: f32,
        ties_away: bool,
    ) -> (CubeTensor, CubeTensor, CubeTensor, CubeTensor, CubeTensor) {
        let constants = (factors, epsilon, momentum, unbias, ties_away);
        let ([m, w, b, mean, var], _) = fold(x, [mean, var, f0, f1], constants, false);
        (m, w, b, mean, var)
    }

    #[allow(clippy::too_many_arguments)]
    fn channel_fold_normalize(
        x: CubeTensor,
        mean: CubeTensor,
        var: CubeTensor,
        f0: CubeTensor,
        f1: CubeTensor,
        factors: u32,
        epsilon: f32,
        momentum: f32,
        unbias: f32,
        ties_away: bool,
    ) -> (CubeTensor, CubeTensor, CubeTensor, CubeTensor, CubeTensor, CubeTensor) {
        let constants = (factors, epsilon, momentum, unbias, ties_away);
        let ([m, w, b, mean, var], y) = fold(x, [mean, var, f0, f1], constants, true);
        (m, w, b, mean, var, y.expect("normalized"))
    }

    fn channel_rstd(m: CubeTensor, epsilon: f32) -> CubeTensor {
        let m = small(m);
        let c = m.meta.num_elements() / 2;
        let out = empty_shaped(&m, vec![c]);
        let (cubes, dim) = elementwise(&m.client, c);
        rstd_kernel::launch(
            &m.client,
            cubes,
            dim,
            m.clone().into_buffer_arg(),
            out.clone().into_buffer_arg(),
            epsilon,
            c as u32,
        );
        out
    }

    fn channel_rstd_backward(m: CubeTensor, grad: CubeTensor, epsilon: f32) -> CubeTensor {
        let (m, g) = (small(m), small(grad));
        let c = g.meta.num_elements();
        let out = empty_shaped(&m, vec![2, c]);
        let (cubes, dim) = elementwise(&m.client, c);
        rstd_backward_kernel::launch(
            &m.client,
            cubes,
            dim,
            m.clone().into_buffer_arg(),
            g.into_buffer_arg(),
            out.clone().into_buffer_arg(),
            epsilon,
            c as u32,
        );
        out
    }

    fn channel_shift(m: CubeTensor, w: CubeTensor) -> CubeTensor {
        let (m, w) = (small(m), small(w));
        let c = w.meta.num_elements();
        let out = empty_shaped(&m, vec![c]);
        let (cubes, dim) = elementwise(&m.client, c);
        shift_kernel::launch(
            &m.client,
            cubes,
            dim,
            m.clone().into_buffer_arg(),
            w.into_buffer_arg(),
            out.clone().into_buffer_arg(),
            c as u32,
        );
        out
    }

    fn channel_shift_backward(
        m: CubeTensor,
        w: CubeTensor,
        grad: CubeTensor,
    ) -> (CubeTensor, CubeTensor) {
        let (m, w, g) = (small(m), small(w), small(grad));
        let c = w.meta.num_elements();
        let (dm, dw) = (empty_shaped(&m, vec![2, c]), empty_shaped(&m, vec![c]));
        let (cubes, dim) = elementwise(&m.client, c);
        shift_backward_kernel::launch(
            &m.client,
            cubes,
            dim,
            m.clone().into_buffer_arg(),
            w.into_buffer_arg(),
            g.into_buffer_arg(),
            dm.clone().into_buffer_arg(),
            dw.clone().into_buffer_arg(),
            c as u32,
        );
        (dm, dw)
    }

    fn channel_normalize(
        x: CubeTensor,
        _m: CubeTensor,
        w: CubeTensor,
        b: CubeTensor,
    ) -> CubeTensor {
        scale_shift(x, w, Some(b))
    }

    fn channel_normalize_backward(
        x: CubeTensor,
        m: CubeTensor,
        w: CubeTensor,
        grad: CubeTensor,
    ) -> CubeTensor {
        let (n, c, plane, width) = strided(&x);
        assert_eq!(grad.meta.shape(), x.meta.shape(), "channel op: ∂y and x differ in shape");
        strided(&grad);
        let (m, w) = (small(m), small(w));
        let count = (x.meta.num_elements() / c.max(1) as usize) as f32;
        let out = empty_like(&x);
        let (cubes, dim, units) = per_channel(n, c, plane);
        // One cube per channel: the sums `[Σ ∂y·x, Σ ∂y]`, then the channel's `∂x`.
        normalize_backward_kernel::launch(
            &x.client,
            cubes,
            dim,
            x.clone().into_tensor_arg(),
            grad.into_tensor_arg(),
            m.into_buffer_arg(),
            w.into_buffer_arg(),
            out.clone().into_buffer_arg(),
            n,
            plane,
            width,
            count,
            units,
        );
        out
    }

    fn channel_running(
        mean: CubeTensor,
        var: CubeTensor,
        m: CubeTensor,
        momentum: f32,
        unbias: f32,
    ) -> CubeTensor {
        let (mean, var, m) = (small(mean), small(var), small(m));
        let c = mean.meta.num_elements();
        let out = empty_shaped(&m, vec![2, c]);
        let (cubes, dim) = elementwise(&m.client, c);
        running_kernel::launch(
            &m.client,
            cubes,
            dim,
            mean.into_buffer_arg(),
            var.into_buffer_arg(),
            m.clone().into_buffer_arg(),
            out.clone().into_buffer_arg(),
            momentum,
            unbias,
            c as u32,
        );
        out
    }
}
