//! LSQ initialisation from data: a quantizer copied, validated or saved before it saw any data
//! stays uninitialised (step 0, not a made-up constant), its first tensor sets the step to
//! 2·mean|x|/sqrt(Qp) per channel (Esser et al. 2020, §2.1), that value is written into the
//! parameter before the optimizer step and gets the step's gradient, and a record saved before
//! the first step initialises again after loading.

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use burn::module::Module;
use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor, TensorData};
use qdarts_ops::quant::lsq::{apply_init, forget_init};
use qdarts_ops::quant::{FakeQuantizer, Granularity, ObserverKind, QuantSpec, TensorRole};

fn vals<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
}

/// A `[2, 4]` weight whose rows have mean |x| of 0.5 and 2.0.
fn weight(device: &Device) -> Tensor<2> {
    let v = vec![0.5f32, -0.5, 0.25, -0.75, 2.0, -1.0, 3.0, -2.0];
    Tensor::from_data(TensorData::new(v, [2, 4]), device)
}

fn lsq_weights(device: &Device) -> FakeQuantizer {
    let spec =
        QuantSpec::with(8, true, true, Granularity::PerChannel { axis: 0 }, ObserverKind::Lsq)
            .unwrap();
    FakeQuantizer::new(spec, "w", TensorRole::Weight, 2, device).unwrap()
}

fn steps(q: &FakeQuantizer) -> Vec<f32> {
    vals(q.lsq.as_ref().unwrap().scale.val())
}

#[test]
fn a_quantizer_that_saw_no_data_keeps_step_zero_through_valid_and_a_record() {
    let ad = Device::flex().autodiff();
    let q = lsq_weights(&ad);
    // What the search's first checkpoint does before step 1.
    drop(q.valid());
    let dir = qdarts_record::scratch::scratch("lsq");
    let file = dir.join("q.bpk");
    q.clone().save_file(&file).unwrap();
    assert_eq!(steps(&q), [0.0, 0.0]);
    // Its first tensor initialises it, also after a load of that record.
    let loaded = lsq_weights(&ad).try_load_file(&file).unwrap();
    forget_init(&loaded);
    let (_, grid) = loaded.forward_with_grid(weight(&ad));
    let s = vals(grid.step);
    // 2·mean|x|/sqrt(127): rows with mean |x| 0.5 and 2.0.
    let want = [2.0 * 0.5 / 127f32.sqrt(), 2.0 * 2.0 / 127f32.sqrt()];
    for (a, b) in s.iter().zip(want) {
        assert!((a - b).abs() <= 1e-6 * b, "{s:?} vs {want:?}");
    }
}

#[test]
fn the_first_step_writes_the_data_step_into_the_parameter_and_trains_it() {
    let ad = Device::flex().autodiff();
    let q = lsq_weights(&ad);
    let x = weight(&ad).require_grad();
    let (out, grid) = q.forward_with_grid(x.clone());
    let first = vals(grid.step);
    // The step's gradient reaches the parameter although its stored value is still 0.
    let mut grads = out.sum().backward();
    let g = GradientsParams::from_module(&mut grads, &q);
    let id = q.lsq.as_ref().unwrap().scale.id;
    assert!(g.get::<1>(id).is_some(), "the step parameter has no gradient");
    assert_eq!(steps(&q), [0.0, 0.0]);
    // Before the optimizer step: the data step goes into the parameter, under the same id.
    let q = apply_init(q);
    assert_eq!(steps(&q), first);
    assert_eq!(q.lsq.as_ref().unwrap().scale.id, id);
    assert!(q.lsq.as_ref().unwrap().scale.val().is_require_grad());
    // From now on the parameter is the step: a changed parameter changes the grid.
    let (_, grid) = q.forward_with_grid(weight(&ad).mul_scalar(10.0));
    assert_eq!(vals(grid.step), first, "re-initialised from a later tensor");
}

#[test]
fn an_initialised_record_is_used_as_it_is() {
    let ad = Device::flex().autodiff();
    let q = lsq_weights(&ad);
    let _ = q.forward_with_grid(weight(&ad));
    let q = apply_init(q);
    let trained = steps(&q);
    let dir = qdarts_record::scratch::scratch("lsq2");
    let file = dir.join("q.bpk");
    q.save_file(&file).unwrap();
    let loaded = lsq_weights(&ad).try_load_file(&file).unwrap();
    forget_init(&loaded);
    let (_, grid) = loaded.forward_with_grid(weight(&ad).mul_scalar(5.0));
    assert_eq!(vals(grid.step), trained);
}

#[test]
fn forwards_before_the_first_optimizer_step_each_have_their_own_graph() {
    // A benchmark or the architect's α pass runs several forward+backward passes before the
    // weight optimizer writes the initial step.
    let ad = Device::flex().autodiff();
    let spec = QuantSpec::with(8, true, true, Granularity::PerTensor, ObserverKind::Lsq).unwrap();
    let q = FakeQuantizer::new(spec, "a", TensorRole::Act, 1, &ad).unwrap();
    for _ in 0..3 {
        let x = weight(&ad).require_grad();
        let grads = q.forward(x.clone()).sum().backward();
        assert!(x.grad(&grads).is_some());
    }
}
