//! Several tensors' observers and fake quantizations in one launch: a layer's or a cell's
//! weight quantizers, each with its own state, grid and output, where each fake quantization
//! clips nothing ([`passes_every_gradient`]) and each row (a weight's output channel) is at
//! most one [`CHUNK`]. The values are [`observe_fake_quant`](super::observe_fake_quant)'s,
//! tensor by tensor, bit for bit; the straight-through gradient passes without a launch.

use burn::tensor::Tensor;

use super::{CHUNK, GridRule, Observed, Rule, observe_available, passes_every_gradient};
#[cfg(feature = "cube")]
pub use extension::ManyBackend;

/// Whether [`observe_fake_quant_many`] takes `x` observed per channel along `axis` (`None`:
/// per tensor) by `rule` and `grid` with the integer range `range`: the CubeCL backends, f32,
/// a fake quantization that clips nothing, rows of at most [`CHUNK`] elements.
pub fn many_available<const D: usize>(
    x: &Tensor<D>,
    axis: Option<usize>,
    rule: Rule,
    grid: GridRule,
    range: (i32, i32),
) -> bool {
    let rows = axis.map_or(1, |a| x.dims().get(a).copied().unwrap_or(0));
    observe_available(&x.device(), x.dtype())
        && rule.pairs_with(grid)
        && passes_every_gradient(rule, grid, range)
        && rows > 0
        && x.dims().iter().product::<usize>() / rows <= CHUNK
}

/// [`observe_fake_quant`](super::observe_fake_quant) of each `(x, state)` of `sites` with one
/// `axis`, `rule`, `grid`, integer range and rounding: one launch per
/// [`ARITY`](crate::cat::ARITY) tensors.
///
/// # Panics
/// Where [`many_available`] is false for a site, or where some of the tensors use autodiff
/// and others do not.
pub fn observe_fake_quant_many<const D: usize>(
    sites: Vec<(Tensor<D>, [Tensor<1>; 2])>,
    axis: Option<usize>,
    rule: Rule,
    grid: GridRule,
    (qmin, qmax): (i32, i32),
    ties_away: bool,
) -> Vec<(Observed, Tensor<D>)> {
    let Some(autodiff) = sites.first().map(|(x, _)| x.is_autodiff()) else { return Vec::new() };
    for (x, _) in &sites {
        assert!(many_available(x, axis, rule, grid, (qmin, qmax)), "observe: {:?}", x.dims());
        assert_eq!(x.is_autodiff(), autodiff, "observe: tensors on both sides of autodiff");
    }
    #[cfg(feature = "cube")]
    {
        let mut out = Vec::with_capacity(sites.len());
        let mut sites = sites.into_iter().peekable();
        while sites.peek().is_some() {
            let group: Vec<_> = sites.by_ref().take(crate::cat::ARITY).collect();
            let quant = (qmin, qmax, ties_away);
            out.extend(extension::launch(group, axis.unwrap_or(D), rule, grid, quant));
        }
        out
    }
    #[cfg(not(feature = "cube"))]
    unreachable!("many_available is false without the CubeCL backends: {axis:?} {ties_away}")
}

/// The extension, its autodiff step and the launch of one group.
#[cfg(feature = "cube")]
mod extension {
    use burn::backend::autodiff::Autodiff;
    use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
    use burn::backend::autodiff::ops::Backward;
    use burn::backend::{AutodiffBackend, Backend, backend_extension, tensor::FloatTensor};
    use burn::tensor::Tensor;

    use super::super::extension::StraightThrough;
    use super::{GridRule, Observed, Rule, passes_every_gradient};
    use crate::cat::slots;

    /// One launch of up to [`ARITY`](crate::cat::ARITY) sites.
    pub(super) fn launch<const D: usize>(
        group: Vec<(Tensor<D>, [Tensor<1>; 2])>,
        axis: usize,
        rule: Rule,
        grid: GridRule,
        quant: (i32, i32, bool),
    ) -> Vec<(Observed, Tensor<D>)> {
        let count = group.len();
        let (mut xs, mut a, mut b) = (Vec::new(), Vec::new(), Vec::new());
        for (x, [sa, sb]) in group {
            // The state is a constant of the step, on `x`'s side of autodiff.
            let (sa, sb) = (sa.detach(), sb.detach());
            let (sa, sb) = match (x.is_autodiff(), sa.is_autodiff()) {
                (true, false) => (sa.autodiff(), sb.autodiff()),
                (false, true) => (sa.inner(), sb.inner()),
                _ => (sa, sb),
            };
            xs.push(x.into_dispatch());
            a.push(sa.into_dispatch());
            b.push(sb.into_dispatch());
        }
        let [x0, x1, x2, x3, x4, x5, x6, x7] = slots(xs);
        let [a0, a1, a2, a3, a4, a5, a6, a7] = slots(a);
        let [b0, b1, b2, b3, b4, b5, b6, b7] = slots(b);
        let outs = <burn::backend::Dispatch as ManyBackend>::observe_fake_quant_many(
            x0, x1, x2, x3, x4, x5, x6, x7, a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3, b4, b5,
            b6, b7, count, axis, rule, grid, quant,
        );
        let mut outs = outs.into_iter();
        let mut next = || outs.next().expect("seven outputs per tensor");
        (0..count)
            .map(|_| {
                let one = Tensor::<1>::from_dispatch;
                let observed = Observed {
                    state: [one(next()), one(next()), one(next())],
                    mult: one(next()),
                    step: one(next()),
                    zero_point: one(next()),
                };
                (observed, Tensor::from_dispatch(next()))
            })
            .collect()
    }

    /// The observers of several tensors in one launch (see the module docs); CubeCL only.
    #[backend_extension(Cube, Autodiff)]
    pub trait ManyBackend: Backend {
        /// For each of the first `count` (1 to [`ARITY`](crate::cat::ARITY)) tensors `x_t`
        /// with state `(a_t, b_t)`: the seven outputs of
        /// [`observe_fake_quant`](crate::observe::ObserveBackend::observe_fake_quant)
        /// `(a', b', T, mult, step, zero_point, out)`, tensor after tensor; `axis` equal to the
        /// rank: per tensor; `quant` is `(qmin, qmax, ties_away)`. The slots past `count` are
        /// not read.
        #[allow(clippy::too_many_arguments, reason = "a backend extension's tensors are arguments")]
        fn observe_fake_quant_many(
            x0: FloatTensor<Self>,
            x1: FloatTensor<Self>,
            x2: FloatTensor<Self>,
            x3: FloatTensor<Self>,
            x4: FloatTensor<Self>,
            x5: FloatTensor<Self>,
            x6: FloatTensor<Self>,
            x7: FloatTensor<Self>,
            a0: FloatTensor<Self>,
            a1: FloatTensor<Self>,
            a2: FloatTensor<Self>,
            a3: FloatTensor<Self>,
            a4: FloatTensor<Self>,
            a5: FloatTensor<Self>,
            a6: FloatTensor<Self>,
            a7: FloatTensor<Self>,
            b0: FloatTensor<Self>,
            b1: FloatTensor<Self>,
            b2: FloatTensor<Self>,
            b3: FloatTensor<Self>,
            b4: FloatTensor<Self>,
            b5: FloatTensor<Self>,
            b6: FloatTensor<Self>,
            b7: FloatTensor<Self>,
            count: usize,
            axis: usize,
            rule: Rule,
            grid: GridRule,
            quant: (i32, i32, bool),
        ) -> Vec<FloatTensor<Self>>;
    }

    impl<B: Backend + ManyBackend, C: CheckpointStrategy> ManyBackend for Autodiff<B, C> {
        fn observe_fake_quant_many(
            x0: FloatTensor<Self>,
            x1: FloatTensor<Self>,
            x2: FloatTensor<Self>,
            x3: FloatTensor<Self>,
            x4: FloatTensor<Self>,
            x5: FloatTensor<Self>,
            x6: FloatTensor<Self>,
            x7: FloatTensor<Self>,
            a0: FloatTensor<Self>,
            a1: FloatTensor<Self>,
            a2: FloatTensor<Self>,
            a3: FloatTensor<Self>,
            a4: FloatTensor<Self>,
            a5: FloatTensor<Self>,
            a6: FloatTensor<Self>,
            a7: FloatTensor<Self>,
            b0: FloatTensor<Self>,
            b1: FloatTensor<Self>,
            b2: FloatTensor<Self>,
            b3: FloatTensor<Self>,
            b4: FloatTensor<Self>,
            b5: FloatTensor<Self>,
            b6: FloatTensor<Self>,
            b7: FloatTensor<Self>,
            count: usize,
            axis: usize,
            rule: Rule,
            grid: GridRule,
            quant: (i32, i32, bool),
        ) -> Vec<FloatTensor<Self>> {
            assert!(passes_every_gradient(rule, grid, (quant.0, quant.1)), "observe: clips");
            let xs = [x0, x1, x2, x3, x4, x5, x6, x7];
            let nodes: Vec<_> = xs[..count].iter().map(|x| x.node()).collect();
            let [x0, x1, x2, x3, x4, x5, x6, x7] = xs.map(|x| x.into_primitive());
            let [a0, a1, a2, a3, a4, a5, a6, a7] =
                [a0, a1, a2, a3, a4, a5, a6, a7].map(|t| t.into_primitive());
            let [b0, b1, b2, b3, b4, b5, b6, b7] =
                [b0, b1, b2, b3, b4, b5, b6, b7].map(|t| t.into_primitive());
            let outs = B::observe_fake_quant_many(
                x0, x1, x2, x3, x4, x5, x6, x7, a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3, b4,
                b5, b6, b7, count, axis, rule, grid, quant,
            );
            // Each output's gradient is its tensor's, as it is (nothing clips).
            let mut nodes = nodes.into_iter();
            outs.into_iter()
                .enumerate()
                .map(|(i, t)| match i % 7 {
                    6 => {
                        let parent = nodes.next().expect("a node per tensor");
                        StraightThrough.prepare::<C>([parent]).compute_bound().stateless(t)
                    }
                    _ => Self::from_inner(t),
                })
                .collect()
        }
    }
}
