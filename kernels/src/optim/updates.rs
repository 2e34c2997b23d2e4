//! Many parameters' optimizer arithmetic: on the CubeCL backends one launch per
//! [`ARITY`](crate::cat::ARITY) parameters instead of one each. [`SgdUpdates`] for the weight
//! step, [`Moves`] for the second-order step's weights.

use burn::tensor::Tensor;

use super::{SgdStep, sgd_update};

/// A tensor of the backend dispatch, as the extensions take it.
type Primitive = burn::backend::tensor::FloatTensor<burn::backend::Dispatch>;

/// The SGD updates of many parameters with one [`SgdStep`]: [`add`](Self::add) each
/// parameter, [`finish`](Self::finish), then [`take`](Self::take) each update by the index
/// `add` returned. Every update is [`sgd_update`]'s bit for bit; on the CubeCL backends (f32)
/// the parameters are updated [`ARITY`](crate::cat::ARITY) a launch, each new weight and
/// momentum buffer its own tensor (a view of the launch's output buffer); elsewhere
/// parameter by parameter as they are added.
#[derive(Debug)]
pub struct SgdUpdates {
    step: SgdStep,
    /// Each added parameter's new weight and momentum buffer, once computed and until taken.
    done: Vec<Option<(Primitive, Primitive)>>,
    #[cfg(feature = "cube")]
    pending: Pending,
}

/// One of the second-order step's weights ([`axpy`](super::axpy),
/// [`virtual_step`](super::virtual_step)).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Move {
    /// `w·keep + g·step`.
    Axpy {
        /// The weight's factor.
        keep: f32,
        /// The direction's factor.
        step: f32,
    },
    /// `w − ((μ·v + g) + λ·w)·ξ`, or `w − (g + λ·w)·ξ` without a momentum buffer `v`.
    Virtual {
        /// μ.
        momentum: f64,
        /// λ.
        decay: f64,
        /// ξ.
        xi: f64,
    },
}

/// One [`Move`] of many parameters, as [`SgdUpdates`] collects them: [`add`](Self::add),
/// [`finish`](Self::finish), [`take`](Self::take). Each result is the one-parameter
/// function's bit for bit; on the CubeCL backends (f32) [`ARITY`](crate::cat::ARITY)
/// parameters a launch, each result a view of the launch's output buffer.
#[derive(Debug)]
pub struct Moves {
    rule: Move,
    done: Vec<Option<Primitive>>,
    #[cfg(feature = "cube")]
    pending: Pending,
}

impl SgdUpdates {
    /// No parameters yet.
    pub fn new(step: SgdStep) -> Self {
        SgdUpdates {
            step,
            done: Vec::new(),
            #[cfg(feature = "cube")]
            pending: Pending::default(),
        }
    }

    /// Adds the parameter `w` (not differentiated) with gradient `g` and momentum buffer
    /// `velocity` (`None` on its first step): its index for [`take`](Self::take).
    pub fn add<const D: usize>(
        &mut self,
        w: Tensor<D>,
        g: Tensor<D>,
        velocity: Option<Tensor<1>>,
    ) -> usize {
        let i = self.done.len();
        self.done.push(None);
        #[cfg(feature = "cube")]
        if self.pending.add(i, &w, &g, &velocity) {
            if self.pending.is_full() {
                self.flush();
            }
            return i;
        }
        let (out, v) = sgd_update(w, g, velocity, self.step);
        self.done[i] = Some((out.into_dispatch(), v.into_dispatch()));
        i
    }

    /// Updates the parameters still pending.
    pub fn finish(&mut self) {
        #[cfg(feature = "cube")]
        self.flush();
    }

    /// Parameter `i`'s new weight (its shape) and momentum buffer (flattened).
    ///
    /// # Panics
    /// If `i` was not added, is taken twice or before [`finish`](Self::finish).
    pub fn take<const D: usize>(&mut self, i: usize) -> (Tensor<D>, Tensor<1>) {
        let taken = self.done.get_mut(i).and_then(Option::take);
        let (out, v) = taken.unwrap_or_else(|| panic!("SgdUpdates: update {i} is not ready"));
        (Tensor::from_dispatch(out), Tensor::from_dispatch(v))
    }

    /// Updates the pending parameters in one launch.
    #[cfg(feature = "cube")]
    fn flush(&mut self) {
        use super::StepBackend;

        let Some(Launch { at, count, with_velocity, w, g, v }) = self.pending.launch() else {
            return;
        };
        let [w0, w1, w2, w3, w4, w5, w6, w7] = w;
        let [g0, g1, g2, g3, g4, g5, g6, g7] = g;
        let [v0, v1, v2, v3, v4, v5, v6, v7] = v;
        let SgdStep { decay, momentum, lr, grad_scale } = self.step;
        let constants = [decay as f32, momentum as f32, lr as f32, grad_scale.unwrap_or(1.0)];
        let mut outs = <burn::backend::Dispatch as StepBackend>::sgd_updates(
            w0,
            w1,
            w2,
            w3,
            w4,
            w5,
            w6,
            w7,
            g0,
            g1,
            g2,
            g3,
            g4,
            g5,
            g6,
            g7,
            v0,
            v1,
            v2,
            v3,
            v4,
            v5,
            v6,
            v7,
            count,
            with_velocity,
            constants,
            grad_scale.is_some(),
        );
        let velocities = outs.split_off(count);
        for ((i, out), v) in at.into_iter().zip(outs).zip(velocities) {
            self.done[i] = Some((out, v));
        }
    }
}

impl Moves {
    /// No parameters yet.
    pub fn new(rule: Move) -> Self {
        Moves {
            rule,
            done: Vec::new(),
            #[cfg(feature = "cube")]
            pending: Pending::default(),
        }
    }

    /// Adds the parameter `w` with direction `g` and (for [`Move::Virtual`]) momentum
    /// buffer `velocity`, flattened (`None` before the first step): its index for
    /// [`take`](Self::take).
    pub fn add<const D: usize>(
        &mut self,
        w: Tensor<D>,
        g: Tensor<D>,
        velocity: Option<Tensor<1>>,
    ) -> usize {
        let (w, g) = (w.inner(), g.inner());
        let velocity = velocity.map(Tensor::inner);
        let i = self.done.len();
        self.done.push(None);
        #[cfg(feature = "cube")]
        if self.pending.add(i, &w, &g, &velocity) {
            if self.pending.is_full() {
                self.flush();
            }
            return i;
        }
        let out = match self.rule {
            Move::Axpy { keep, step } => w.mul_scalar(keep).add(g.mul_scalar(step)),
            Move::Virtual { momentum, decay, xi } => {
                let m_plus_g = match velocity {
                    Some(v) => v.reshape(g.dims()).mul_scalar(momentum).add(g),
                    None => g,
                };
                let d = m_plus_g.add(w.clone().mul_scalar(decay)).mul_scalar(xi);
                w.sub(d)
            }
        };
        self.done[i] = Some(out.into_dispatch());
        i
    }

    /// Computes the parameters still pending.
    pub fn finish(&mut self) {
        #[cfg(feature = "cube")]
        self.flush();
    }

    /// Parameter `i`'s result, of its shape (without autodiff).
    ///
    /// # Panics
    /// If `i` was not added, is taken twice or before [`finish`](Self::finish).
    pub fn take<const D: usize>(&mut self, i: usize) -> Tensor<D> {
        let taken = self.done.get_mut(i).and_then(Option::take);
        Tensor::from_dispatch(taken.unwrap_or_else(|| panic!("Moves: {i} is not ready")))
    }

    /// Computes the pending parameters in one launch.
    #[cfg(feature = "cube")]
    fn flush(&mut self) {
        use super::StepBackend;

        let Some(Launch { at, count, with_velocity, w, g, v }) = self.pending.launch() else {
            return;
        };
        let [w0, w1, w2, w3, w4, w5, w6, w7] = w;
        let [g0, g1, g2, g3, g4, g5, g6, g7] = g;
        let [v0, v1, v2, v3, v4, v5, v6, v7] = v;
        let (virtual_step, constants) = match self.rule {
            Move::Axpy { keep, step } => (false, [keep, step, 0.0]),
            Move::Virtual { momentum, decay, xi } => {
                (true, [momentum as f32, decay as f32, xi as f32])
            }
        };
        let outs = <burn::backend::Dispatch as StepBackend>::moves(
            w0,
            w1,
            w2,
            w3,
            w4,
            w5,
            w6,
            w7,
            g0,
            g1,
            g2,
            g3,
            g4,
            g5,
            g6,
            g7,
            v0,
            v1,
            v2,
            v3,
            v4,
            v5,
            v6,
            v7,
            count,
            with_velocity,
            virtual_step,
            constants,
        );
        for (i, out) in at.into_iter().zip(outs) {
            self.done[i] = Some(out);
        }
    }
}

/// Parameters added and not yet launched (the CubeCL backends): index, weight, gradient,
/// momentum buffer; at most [`ARITY`](crate::cat::ARITY).
#[cfg(feature = "cube")]
#[derive(Debug, Default)]
struct Pending(Vec<(usize, Primitive, Primitive, Option<Primitive>)>);

/// One launch's operands: the parameters' indices, how many, which read their momentum
/// buffer, and the weight, gradient and buffer slots (the gradient fills a slot not read).
#[cfg(feature = "cube")]
struct Launch {
    at: Vec<usize>,
    count: usize,
    with_velocity: u32,
    w: [Primitive; crate::cat::ARITY],
    g: [Primitive; crate::cat::ARITY],
    v: [Primitive; crate::cat::ARITY],
}

#[cfg(feature = "cube")]
impl Pending {
    /// Adds parameter `i` where the kernels take it (f32 on a CubeCL device): whether it did.
    fn add<const D: usize>(
        &mut self,
        i: usize,
        w: &Tensor<D>,
        g: &Tensor<D>,
        velocity: &Option<Tensor<1>>,
    ) -> bool {
        let on = |t: &Tensor<D>| super::step_available(&t.device(), t.dtype());
        if !(on(w) && on(g)) {
            return false;
        }
        let velocity = velocity.clone().map(Tensor::into_dispatch);
        self.0.push((i, w.clone().into_dispatch(), g.clone().into_dispatch(), velocity));
        true
    }

    fn is_full(&self) -> bool {
        self.0.len() == crate::cat::ARITY
    }

    /// The pending parameters as one launch's operands, and none pending after.
    fn launch(&mut self) -> Option<Launch> {
        use crate::cat::slots;

        let count = self.0.len();
        if count == 0 {
            return None;
        }
        let pending = std::mem::take(&mut self.0);
        let with_velocity = pending
            .iter()
            .enumerate()
            .fold(0u32, |bits, (t, p)| bits | u32::from(p.3.is_some()) << t);
        let (mut at, mut ws, mut gs, mut vs) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (i, w, g, v) in pending {
            // Without a momentum buffer the kernel does not read its slot: the gradient fills it.
            vs.push(v.unwrap_or_else(|| g.clone()));
            at.push(i);
            ws.push(w);
            gs.push(g);
        }
        Some(Launch { at, count, with_velocity, w: slots(ws), g: slots(gs), v: slots(vs) })
    }
}
