//! The weight optimizer's per-parameter arithmetic: the SGD update and the squared sum that the
//! global gradient norm adds up; and the second-order step's weights, DARTS' virtual step and
//! the finite difference's `w ± ε·v`.
//!
//! As tensor expressions, SGD with momentum and weight decay is seven launches per parameter
//! (`w·λ`, `+ g`, `·1`, `v·μ`, `+`, `·lr`, `w −`) and a gradient's `Σ g²` three (square, a sum
//! that zero-fills its output and adds the parts with atomics, so its last bits depend on
//! thread timing on a GPU). A DARTS supernet has hundreds of parameters, so on the CubeCL
//! backends each is one kernel here ([`step_available`]): the update one thread per element
//! writing the parameter and its momentum buffer, up to eight parameters a launch
//! ([`SgdUpdates`]: each result a view of the launch's output, its start on the memory
//! alignment so that no copy cuts it out; the second-order weights likewise, [`Moves`]); the squared sum one cube per gradient summing
//! in a fixed order and adding the sum onto the norm's running total, up to eight gradients a
//! launch ([`SquaredSum`]). Elsewhere (flex, LibTorch) they are the expressions, operation for
//! operation as
//! Burn's `Sgd` and PyTorch's `torch.optim.SGD` order them. On CUDA the kernel's `a·b + c` may
//! be contracted into one fused multiply-add: its last bit may differ from the expressions'.
//! `tests/optim.rs` holds the two together on every backend of the build.

use burn::tensor::{DType, Device, Tensor};

/// Whether [`sgd_update`] and [`squared_sum`] ([`squared_sum_onto`]) run this module's kernels
/// for tensors on `device` with this dtype (the CubeCL backends, f32).
pub fn step_available(device: &Device, dtype: DType) -> bool {
    crate::support::on_cube(device) && dtype == DType::F32
}

/// The constants of one SGD step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SgdStep {
    /// L2 weight decay `λ`.
    pub decay: f64,
    /// Momentum `μ`.
    pub momentum: f64,
    /// Learning rate.
    pub lr: f64,
    /// A factor the gradient is multiplied by first (`g·s`, as `clip_grad_norm_` scales it),
    /// where a gradient-norm clip acts.
    pub grad_scale: Option<f32>,
}

/// One SGD step of `w` with gradient `g` (not differentiated): `d = g·s + λ·w` (`g` without a
/// scale), `v = d` on the first step (`velocity` `None`) or `μ·v + d`, `w − lr·v`. Returns
/// the new weight and the new momentum buffer, flattened.
pub fn sgd_update<const D: usize>(
    w: Tensor<D>,
    g: Tensor<D>,
    velocity: Option<Tensor<1>>,
    step: SgdStep,
) -> (Tensor<D>, Tensor<1>) {
    let SgdStep { decay, momentum, lr, grad_scale } = step;
    #[cfg(feature = "cube")]
    if step_available(&w.device(), w.dtype()) {
        let dims = w.dims();
        let has_velocity = velocity.is_some();
        // Without a momentum buffer the kernel does not read its operand: the gradient fills it.
        let velocity = velocity.map_or_else(|| g.clone().into_dispatch(), Tensor::into_dispatch);
        let (out, v) = <burn::backend::Dispatch as StepBackend>::sgd_update(
            w.into_dispatch(),
            g.into_dispatch(),
            velocity,
            has_velocity,
            [decay as f32, momentum as f32, lr as f32, grad_scale.unwrap_or(1.0)],
            grad_scale.is_some(),
        );
        return (Tensor::<D>::from_dispatch(out).reshape(dims), Tensor::from_dispatch(v));
    }
    let dims = w.dims();
    let g = match grad_scale {
        Some(s) => g.mul_scalar(s),
        None => g,
    };
    // Burn's WeightDecay, Momentum and Sgd steps, in their order.
    let d = w.clone().mul_scalar(decay).add(g);
    let v = match velocity {
        Some(v) => d.mul_scalar(1.0).add(v.reshape(dims).mul_scalar(momentum)),
        None => d,
    };
    let out = w.sub(v.clone().mul_scalar(lr));
    (out, v.reshape([-1]))
}

/// `Σ g²` over every element of `g`: `[1]`.
pub fn squared_sum<const D: usize>(g: Tensor<D>) -> Tensor<1> {
    squared_sum_onto(None, g)
}

/// `acc + Σ g²` (`Σ g²` without `acc`), `[1]`: the same f32 add of the same sum as the
/// expressions; one launch on the CubeCL backends (see [`SquaredSum`] for many tensors).
pub fn squared_sum_onto<const D: usize>(acc: Option<Tensor<1>>, g: Tensor<D>) -> Tensor<1> {
    let mut sum = SquaredSum::onto(acc);
    sum.add(g);
    sum.total().expect("one tensor added")
}

/// A running `Σ g²` over many tensors (the global gradient norm's), added in order: on the
/// CubeCL backends one launch per [`ARITY`](crate::cat::ARITY) tensors, each tensor's sum by
/// one cube in a fixed order and added onto the running total as one launch per tensor would
/// add it (bit for bit); elsewhere `acc + Σ g²` as tensor expressions, tensor by tensor.
#[derive(Debug, Default)]
pub struct SquaredSum {
    /// The total of the tensors summed so far.
    acc: Option<Tensor<1>>,
    /// Tensors added but not yet summed (the CubeCL backends), at most `ARITY`.
    #[cfg(feature = "cube")]
    pending: Vec<burn::backend::tensor::FloatTensor<burn::backend::Dispatch>>,
}

impl SquaredSum {
    /// An empty sum.
    pub fn new() -> Self {
        Self::default()
    }

    /// A sum that starts at `acc`.
    pub fn onto(acc: Option<Tensor<1>>) -> Self {
        SquaredSum {
            acc: acc.map(Tensor::detach),
            #[cfg(feature = "cube")]
            pending: Vec::new(),
        }
    }

    /// Adds `Σ g²`.
    pub fn add<const D: usize>(&mut self, g: Tensor<D>) {
        #[cfg(feature = "cube")]
        if step_available(&g.device(), g.dtype())
            && self.acc.as_ref().is_none_or(|a| step_available(&a.device(), a.dtype()))
        {
            self.pending.push(g.into_dispatch());
            if self.pending.len() == crate::cat::ARITY {
                self.flush();
            }
            return;
        }
        #[cfg(feature = "cube")]
        self.flush();
        let sq = g.square().sum();
        self.acc = Some(match self.acc.take() {
            Some(acc) => acc.add(sq),
            None => sq,
        });
    }

    /// The total, `None` when nothing was added.
    pub fn total(self) -> Option<Tensor<1>> {
        self.flushed().acc
    }

    /// With nothing pending.
    #[cfg(feature = "cube")]
    fn flushed(mut self) -> Self {
        self.flush();
        self
    }

    /// With nothing pending (nothing is, without the CubeCL backends).
    #[cfg(not(feature = "cube"))]
    fn flushed(self) -> Self {
        self
    }

    /// Sums the pending tensors onto the total in one launch.
    #[cfg(feature = "cube")]
    fn flush(&mut self) {
        let count = self.pending.len();
        if count == 0 {
            return;
        }
        let first = self.pending[0].clone();
        let [a, b, c, d, e, f, g, h] = crate::cat::slots(std::mem::take(&mut self.pending));
        let has_acc = self.acc.is_some();
        // Without a sum, the first tensor stands in for it (not read).
        let acc = self.acc.take().map_or(first, Tensor::into_dispatch);
        let sum = <burn::backend::Dispatch as StepBackend>::squared_sum(
            a, b, c, d, e, f, g, h, count, acc, has_acc,
        );
        self.acc = Some(Tensor::from_dispatch(sum));
    }
}

/// `w·keep + g·step`, without autodiff: the weights `w ± ε·v` of the second-order step's
/// finite difference, one launch on the CubeCL backends instead of three (many parameters
/// at once: [`Moves`]).
pub fn axpy<const D: usize>(w: Tensor<D>, g: Tensor<D>, keep: f32, step: f32) -> Tensor<D> {
    one_move(Move::Axpy { keep, step }, w, g, None)
}

/// DARTS' virtual step `w − ((μ·v + g) + λ·w)·ξ`, or `w − (g + λ·w)·ξ` without a momentum
/// buffer `v`, without autodiff (pt.darts' order of operations): one launch on the CubeCL
/// backends instead of five or six (many parameters at once: [`Moves`]).
pub fn virtual_step<const D: usize>(
    w: Tensor<D>,
    g: Tensor<D>,
    velocity: Option<Tensor<D>>,
    momentum: f64,
    decay: f64,
    xi: f64,
) -> Tensor<D> {
    let velocity = velocity.map(|v| v.reshape([-1]));
    one_move(Move::Virtual { momentum, decay, xi }, w, g, velocity)
}

fn one_move<const D: usize>(
    rule: Move,
    w: Tensor<D>,
    g: Tensor<D>,
    velocity: Option<Tensor<1>>,
) -> Tensor<D> {
    let mut moves = Moves::new(rule);
    let i = moves.add(w, g, velocity);
    moves.finish();
    moves.take(i)
}

#[cfg(feature = "cube")]
use burn::backend::{Backend, backend_extension, tensor::FloatTensor};

/// The per-parameter optimizer kernels (see [`step_available`]); CubeCL only, on tensors
/// without autodiff.
#[cfg(feature = "cube")]
#[backend_extension(Cube)]
pub trait StepBackend: Backend {
    /// `(w − lr·v, v)` with `v = μ·velocity + (g·s + λ·w)`, or `v = g·s + λ·w` without
    /// `has_velocity` (`velocity` is then not read), `g` unscaled without `has_scale`;
    /// `[λ, μ, lr, s]`; the velocity and the returned one flattened.
    fn sgd_update(
        w: FloatTensor<Self>,
        g: FloatTensor<Self>,
        velocity: FloatTensor<Self>,
        has_velocity: bool,
        constants: [f32; 4],
        has_scale: bool,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// [`sgd_update`](Self::sgd_update) of the first `count` (1 to
    /// [`ARITY`](crate::cat::ARITY)) parameters `w_t` with gradients `g_t` and momentum
    /// buffers `v_t` (read where bit `t` of `with_velocity` is set) in one launch: the new
    /// weights (each of its parameter's shape), then the new momentum buffers (flattened).
    /// The slots past `count` are not read.
    #[allow(clippy::too_many_arguments, reason = "a backend extension's tensors are arguments")]
    fn sgd_updates(
        w0: FloatTensor<Self>,
        w1: FloatTensor<Self>,
        w2: FloatTensor<Self>,
        w3: FloatTensor<Self>,
        w4: FloatTensor<Self>,
        w5: FloatTensor<Self>,
        w6: FloatTensor<Self>,
        w7: FloatTensor<Self>,
        g0: FloatTensor<Self>,
        g1: FloatTensor<Self>,
        g2: FloatTensor<Self>,
        g3: FloatTensor<Self>,
        g4: FloatTensor<Self>,
        g5: FloatTensor<Self>,
        g6: FloatTensor<Self>,
        g7: FloatTensor<Self>,
        v0: FloatTensor<Self>,
        v1: FloatTensor<Self>,
        v2: FloatTensor<Self>,
        v3: FloatTensor<Self>,
        v4: FloatTensor<Self>,
        v5: FloatTensor<Self>,
        v6: FloatTensor<Self>,
        v7: FloatTensor<Self>,
        count: usize,
        with_velocity: u32,
        constants: [f32; 4],
        has_scale: bool,
    ) -> Vec<FloatTensor<Self>>;

    /// The second-order weights of the first `count` (1 to [`ARITY`](crate::cat::ARITY))
    /// parameters `w_t` with directions `g_t` in one launch, each of its parameter's shape:
    /// `w·a + g·b` ([`axpy`]), or with `virtual_step` `w − ((v·a + g) + w·b)·c`
    /// ([`virtual_step`]; `w − (g + w·b)·c` where bit `t` of `with_velocity` is clear, `v_t`
    /// then not read). The slots past `count` are not read.
    #[allow(clippy::too_many_arguments, reason = "a backend extension's tensors are arguments")]
    fn moves(
        w0: FloatTensor<Self>,
        w1: FloatTensor<Self>,
        w2: FloatTensor<Self>,
        w3: FloatTensor<Self>,
        w4: FloatTensor<Self>,
        w5: FloatTensor<Self>,
        w6: FloatTensor<Self>,
        w7: FloatTensor<Self>,
        g0: FloatTensor<Self>,
        g1: FloatTensor<Self>,
        g2: FloatTensor<Self>,
        g3: FloatTensor<Self>,
        g4: FloatTensor<Self>,
        g5: FloatTensor<Self>,
        g6: FloatTensor<Self>,
        g7: FloatTensor<Self>,
        v0: FloatTensor<Self>,
        v1: FloatTensor<Self>,
        v2: FloatTensor<Self>,
        v3: FloatTensor<Self>,
        v4: FloatTensor<Self>,
        v5: FloatTensor<Self>,
        v6: FloatTensor<Self>,
        v7: FloatTensor<Self>,
        count: usize,
        with_velocity: u32,
        virtual_step: bool,
        constants: [f32; 3],
    ) -> Vec<FloatTensor<Self>>;

    /// `((acc[0] + Σ g₀²) + Σ g₁²) + …` over the first `count` (1 to
    /// [`ARITY`](crate::cat::ARITY)) gradients, or from `Σ g₀²` without `has_acc` (`acc` is
    /// then not read): `[1]`. The slots past `count` are not read.
    #[allow(clippy::too_many_arguments, reason = "a backend extension's tensors are arguments")]
    fn squared_sum(
        g0: FloatTensor<Self>,
        g1: FloatTensor<Self>,
        g2: FloatTensor<Self>,
        g3: FloatTensor<Self>,
        g4: FloatTensor<Self>,
        g5: FloatTensor<Self>,
        g6: FloatTensor<Self>,
        g7: FloatTensor<Self>,
        count: usize,
        acc: FloatTensor<Self>,
        has_acc: bool,
    ) -> FloatTensor<Self>;
}

#[cfg(feature = "cube")]
mod cube;
mod updates;

pub use updates::{Move, Moves, SgdUpdates};
