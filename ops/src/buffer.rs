//! [`Buffer`]: a tensor a module updates in its forward pass (PyTorch's registered buffer),
//! such as BatchNorm's running statistics and the observers' state.
//!
//! Burn's `RunningState` serves data-parallel training: each thread registers its update and
//! the value is their mean, computed on the next read (an add per thread and a division, one
//! launch even for a single thread). A search here runs one forward pass at a time, so a buffer
//! holds its last value and nothing else. It is saved and loaded exactly as `RunningState` is
//! (a float parameter with its id, never a gradient target), so checkpoints do not change.
//!
//! Unlike `RunningState`, a clone owns its value: a forward pass through a copy moves the
//! copy's statistics only. Where a pass on a copy must hand its statistics back (the
//! architecture step's pass on a copy whose weights are untracked), [`adopt_buffers`] says so.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use burn::module::{
    Content, Devices, Module, ModuleDisplay, ModuleDisplayDefault, ModuleMapper, ModuleVisitor,
    Param, ParamId,
};
use burn::tensor::{Device, Tensor};

/// State a module updates through a shared reference in its forward pass (a forward takes
/// `&self`): behind a lock, as a module is `Sync`, and owned: a clone starts from the value the
/// original holds now and keeps its own from then on. Boxed: a tensor is large, and a module
/// holds many.
#[derive(Debug, Default)]
pub struct Owned<T>(Box<Mutex<T>>);

impl<T> Owned<T> {
    /// `value`, owned.
    pub fn new(value: T) -> Self {
        Owned(Box::new(Mutex::new(value)))
    }

    /// The value, locked (a panic while it was held cannot have left it half-written: every
    /// writer replaces it whole).
    pub fn lock(&self) -> MutexGuard<'_, T> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: Clone> Clone for Owned<T> {
    fn clone(&self) -> Self {
        Owned::new(self.lock().clone())
    }
}

/// A module's non-trainable state tensor, updated in place by the forward pass; a clone owns
/// its value ([`Owned`]).
#[derive(Clone, Debug)]
pub struct Buffer<const D: usize> {
    id: ParamId,
    value: Owned<Tensor<D>>,
}

impl<const D: usize> Buffer<D> {
    /// A buffer holding `value`.
    pub fn new(value: Tensor<D>) -> Self {
        Self::with_id(ParamId::new(), value)
    }

    /// A buffer holding `value` under the record id `id`.
    pub fn with_id(id: ParamId, value: Tensor<D>) -> Self {
        Self { id, value: Owned::new(value) }
    }

    /// The current value.
    pub fn value(&self) -> Tensor<D> {
        self.value.lock().clone()
    }

    /// Replaces the value.
    pub fn set(&self, value: Tensor<D>) {
        *self.value.lock() = value;
    }

    fn replace(self, f: impl FnOnce(Tensor<D>) -> Tensor<D>) -> Self {
        {
            let mut value = self.value.lock();
            *value = f(value.clone());
        }
        self
    }
}

impl<const D: usize> core::fmt::Display for Buffer<D> {
    fn fmt(&self, f: &mut core::fmt::Formatter) -> core::fmt::Result {
        write!(f, "Buffer(id={})", self.id)
    }
}

impl<const D: usize> ModuleDisplayDefault for Buffer<D> {
    fn content(&self, content: Content) -> Option<Content> {
        content.add_formatted(&"Buffer".to_string()).optional()
    }
}

impl<const D: usize> ModuleDisplay for Buffer<D> {}

impl<const D: usize> Module for Buffer<D> {
    fn visit<V: ModuleVisitor>(&self, visitor: &mut V) {
        visitor.visit_float(&Param::initialized(self.id, self.value()))
    }

    fn map<M: ModuleMapper>(self, mapper: &mut M) -> Self {
        let id = self.id;
        self.replace(|value| {
            let (_, value, _) = mapper.map_float(Param::initialized(id, value)).consume();
            // A buffer is never an optimizer target, whatever a mapper does to its value.
            value.set_require_grad(false)
        })
    }

    fn to_device(self, device: &Device) -> Self {
        self.replace(|value| value.to_device(device))
    }

    fn fork(self, device: &Device) -> Self {
        self.to_device(device)
    }

    fn collect_devices(&self, mut devices: Devices) -> Devices {
        let device = self.value.lock().device();
        if !devices.contains(&device) {
            devices.push(device)
        }
        devices
    }

    fn materialize(self) -> Self {
        self
    }

    fn valid(&self) -> Self {
        Self::with_id(self.id, self.value().without_autodiff())
    }

    fn train(self) -> Self {
        Self::with_id(self.id, Tensor::from_inner(self.value()))
    }
}

/// `into` with the buffers of `from`, a copy of `into` that ran forward passes: each buffer's
/// value as `from` holds it, every parameter as `into` holds it. A buffer is told from a
/// parameter by its gradient flag in `into` (a buffer never requires a gradient); a parameter
/// that does not either is taken from `from` too, where a forward pass left it as it was.
pub fn adopt_buffers<M: Module>(into: M, from: &M) -> M {
    let mut values = Values(HashMap::new());
    from.visit(&mut values);
    into.map(&mut Adopt(values.0))
}

/// Every float tensor of a module by id, flattened.
struct Values(HashMap<ParamId, Tensor<1>>);

impl ModuleVisitor for Values {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        self.0.insert(param.id, param.val().reshape([-1]));
    }
}

/// Replaces each untracked float tensor by the one [`Values`] holds for its id.
struct Adopt(HashMap<ParamId, Tensor<1>>);

impl ModuleMapper for Adopt {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let tracked = param.val().is_require_grad();
        match self.0.remove(&param.id) {
            Some(value) if !tracked => {
                let dims = param.val().dims();
                param.map(|_| value.reshape(dims))
            }
            _ => param,
        }
    }
}

#[cfg(test)]
mod tests {
    // A panic is the failure report in tests.
    #![allow(clippy::unwrap_used)]

    use burn::module::RunningState;
    use burn::tensor::TensorData;

    use super::*;

    #[derive(Module, Debug)]
    struct Ours {
        stat: Buffer<1>,
    }

    #[derive(Module, Debug)]
    struct Burns {
        stat: RunningState<Tensor<1>>,
    }

    fn vals(t: Tensor<1>) -> Vec<f32> {
        t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
    }

    fn tensor(v: &[f32], device: &Device) -> Tensor<1> {
        Tensor::from_data(TensorData::new(v.to_vec(), [v.len()]), device)
    }

    fn file(name: &str) -> std::path::PathBuf {
        // A folder per file: the tests run at once, and a scratch folder is emptied when asked for.
        qdarts_record::scratch::scratch(&format!("buffer-{name}")).join(name)
    }

    #[test]
    fn records_load_both_ways_with_burns_running_state() {
        let d = Device::flex();
        let burns = Burns { stat: RunningState::new(tensor(&[1.0, 2.0], &d)) };
        burns.stat.update(tensor(&[3.0, -4.5], &d));
        let _ = burns.stat.value_sync();
        let path = file("burns.bpk");
        burns.save_file(&path).unwrap();
        let ours =
            Ours { stat: Buffer::new(tensor(&[0.0, 0.0], &d)) }.try_load_file(&path).unwrap();
        assert_eq!(vals(ours.stat.value()), [3.0, -4.5]);

        ours.stat.set(tensor(&[7.0, 0.25], &d));
        let path = file("ours.bpk");
        ours.save_file(&path).unwrap();
        let burns = Burns { stat: RunningState::new(tensor(&[0.0, 0.0], &d)) }
            .try_load_file(&path)
            .unwrap();
        assert_eq!(vals(burns.stat.value_sync()), [7.0, 0.25]);
    }

    #[test]
    fn a_record_holds_the_last_value_set() {
        let d = Device::flex();
        let ours = Ours { stat: Buffer::new(tensor(&[1.0], &d)) };
        ours.stat.set(tensor(&[2.0], &d));
        ours.stat.set(tensor(&[5.0], &d));
        let path = file("last.bpk");
        ours.clone().save_file(&path).unwrap();
        let loaded = Ours { stat: Buffer::new(tensor(&[0.0], &d)) }.try_load_file(&path).unwrap();
        assert_eq!(vals(loaded.stat.value()), [5.0]);
    }

    #[test]
    fn a_clone_owns_its_value_and_valid_copies_it_without_autodiff() {
        let ad = Device::flex().autodiff();
        let ours = Ours { stat: Buffer::new(tensor(&[1.0], &ad)) };
        let clone = ours.clone();
        clone.stat.set(tensor(&[2.0], &ad));
        assert_eq!(vals(ours.stat.value()), [1.0], "a clone wrote into the original");
        assert_eq!(vals(clone.stat.value()), [2.0]);
        ours.stat.set(tensor(&[2.0], &ad));

        let valid = ours.valid();
        assert!(!valid.stat.value().is_autodiff());
        valid.stat.set(tensor(&[3.0], &Device::flex()));
        assert_eq!(vals(ours.stat.value()), [2.0], "eval mode wrote into the training module");
        let train = valid.train();
        assert!(train.stat.value().is_autodiff());
        assert_eq!(vals(train.stat.value()), [3.0]);
    }

    #[test]
    fn a_buffer_is_no_parameter_to_train() {
        let ad = Device::flex().autodiff();
        let ours = Ours { stat: Buffer::new(tensor(&[1.0], &ad)) }.set_require_grad(true);
        assert!(!ours.stat.value().is_require_grad());
        let moved = ours.to_device(&ad);
        assert_eq!(moved.devices(), vec![ad]);
    }

    #[derive(Module, Debug)]
    struct Layer {
        weight: Param<Tensor<1>>,
        stat: Buffer<1>,
    }

    #[test]
    fn a_copy_hands_back_its_buffers_and_keeps_the_parameters_where_they_were() {
        let ad = Device::flex().autodiff();
        let layer = Layer {
            weight: Param::from_tensor(tensor(&[1.0, 2.0], &ad)),
            stat: Buffer::new(tensor(&[0.5], &ad)),
        };
        let copy = layer.clone().no_grad();
        copy.stat.set(tensor(&[7.0], &ad));
        let adopted = adopt_buffers(layer, &copy);
        assert_eq!(vals(adopted.stat.value()), [7.0]);
        assert!(adopted.weight.val().is_require_grad(), "a trained parameter lost its gradient");
        assert_eq!(vals(adopted.weight.val()), [1.0, 2.0]);
    }
}
