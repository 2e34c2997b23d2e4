//! Stacking observer states: several quantizers' states side by side as one (the batched
//! cell's rows) and one row written back.

use burn::tensor::Tensor;

use super::{
    AbsMaxState, Buffer, FixedRange, MinMaxState, MovingAverageAbsMaxState, ObserverState,
    RangeAbsMaxState, state,
};

impl ObserverState {
    /// The states of several quantizers of one spec side by side, channel after channel
    /// (each state's `[C]` tensors concatenated; a window's along its channel axis): the state
    /// of one quantizer that quantizes their tensors as rows of one ([`crate::quant::FakeQuantizer`]'s
    /// rows, the batched cell's waves). Copies, not shared with `states`.
    ///
    /// # Panics
    /// If `states` is empty or mixes kinds of observer.
    pub fn stacked(states: &[&ObserverState]) -> ObserverState {
        let cat = |f: &dyn Fn(&ObserverState) -> Tensor<1>| {
            state(Tensor::cat(states.iter().map(|s| f(s)).collect(), 0))
        };
        let mixed = || -> ! { panic!("stacked observers of different kinds") };
        match states.first().expect("one state at least") {
            ObserverState::AbsMax(_) => ObserverState::AbsMax(AbsMaxState {
                threshold: cat(&|s| match s {
                    ObserverState::AbsMax(s) => s.threshold.value(),
                    _ => mixed(),
                }),
            }),
            ObserverState::RangeAbsMax(_) => {
                let parts = |s: &ObserverState| match s {
                    ObserverState::RangeAbsMax(s) => (s.window.value(), s.threshold.value()),
                    _ => mixed(),
                };
                let windows = states.iter().map(|s| parts(s).0).collect();
                ObserverState::RangeAbsMax(RangeAbsMaxState {
                    window: Buffer::new(Tensor::cat(windows, 1)),
                    threshold: cat(&|s| parts(s).1),
                })
            }
            ObserverState::MovingAverageAbsMax(first) => {
                let part = |s: &ObserverState, i: usize| match s {
                    ObserverState::MovingAverageAbsMax(s) => {
                        [&s.state, &s.accum, &s.threshold][i].value()
                    }
                    _ => mixed(),
                };
                ObserverState::MovingAverageAbsMax(MovingAverageAbsMaxState {
                    rate: first.rate,
                    state: cat(&|s| part(s, 0)),
                    accum: cat(&|s| part(s, 1)),
                    threshold: cat(&|s| part(s, 2)),
                })
            }
            ObserverState::MinMax(first) => {
                let part = |s: &ObserverState, max: bool| match s {
                    ObserverState::MinMax(s) => if max { &s.max } else { &s.min }.value(),
                    _ => mixed(),
                };
                ObserverState::MinMax(MinMaxState {
                    averaging_constant: first.averaging_constant,
                    min: cat(&|s| part(s, false)),
                    max: cat(&|s| part(s, true)),
                })
            }
            ObserverState::Fixed(r) => ObserverState::Fixed(FixedRange::new(r.min, r.max)),
        }
    }

    /// Channels `from..from + len` of this state into `to` (a state of the same kind over
    /// `len` channels): the inverse of [`stacked`](Self::stacked) for one of its parts.
    ///
    /// # Panics
    /// If `to` is another kind of observer.
    pub fn row_into(&self, to: &ObserverState, from: usize, len: usize) {
        let copy = |a: &Buffer<1>, b: &Buffer<1>| b.set(a.value().narrow(0, from, len));
        match (self, to) {
            (ObserverState::AbsMax(a), ObserverState::AbsMax(b)) => {
                copy(&a.threshold, &b.threshold)
            }
            (ObserverState::RangeAbsMax(a), ObserverState::RangeAbsMax(b)) => {
                b.window.set(a.window.value().narrow(1, from, len));
                copy(&a.threshold, &b.threshold);
            }
            (ObserverState::MovingAverageAbsMax(a), ObserverState::MovingAverageAbsMax(b)) => {
                copy(&a.state, &b.state);
                copy(&a.accum, &b.accum);
                copy(&a.threshold, &b.threshold);
            }
            (ObserverState::MinMax(a), ObserverState::MinMax(b)) => {
                copy(&a.min, &b.min);
                copy(&a.max, &b.max);
            }
            (ObserverState::Fixed(_), ObserverState::Fixed(_)) => {}
            _ => panic!("an observer's row written into another kind of observer"),
        }
    }
}
