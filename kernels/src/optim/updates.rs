//! Many parameters' SGD updates: on the CubeCL backends one launch per
//! [`ARITY`](crate::cat::ARITY) parameters instead of one each.

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
    /// Parameters added and not yet updated (the CubeCL backends): index, weight, gradient,
    /// momentum buffer; at most `ARITY`.
    #[cfg(feature = "cube")]
    pending: Vec<(usize, Primitive, Primitive, Option<Primitive>)>,
}

impl SgdUpdates {
    /// No parameters yet.
    pub fn new(step: SgdStep) -> Self {
        SgdUpdates {
            step,
            done: Vec::new(),
            #[cfg(feature = "cube")]
            pending: Vec::new(),
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
        if super::step_available(&w.device(), w.dtype())
            && super::step_available(&g.device(), g.dtype())
        {
            let velocity = velocity.map(Tensor::into_dispatch);
            self.pending.push((i, w.into_dispatch(), g.into_dispatch(), velocity));
            if self.pending.len() == crate::cat::ARITY {
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
        use crate::cat::slots;

        let count = self.pending.len();
        if count == 0 {
            return;
        }
        let pending = std::mem::take(&mut self.pending);
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
        let [w0, w1, w2, w3, w4, w5, w6, w7] = slots(ws);
        let [g0, g1, g2, g3, g4, g5, g6, g7] = slots(gs);
        let [v0, v1, v2, v3, v4, v5, v6, v7] = slots(vs);
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
