//! Reading and making the f32 tensors of the flex kernels.

use burn::backend::flex::FlexTensor;
use burn::tensor::{DType, Shape, TensorData};

/// The dims and a contiguous copy (or view) of an f32 tensor.
///
/// # Panics
/// If it is not f32: the public wrappers only call the kernels for f32 (`what` names the
/// kernel).
pub(crate) fn f32s(t: &FlexTensor, what: &str) -> (Vec<usize>, FlexTensor) {
    assert_eq!(t.dtype(), DType::F32, "{what}: expected f32, got {:?}", t.dtype());
    (t.layout().shape().to_vec(), t.to_contiguous())
}

/// The values of a contiguous f32 tensor.
pub(crate) fn slice(t: &FlexTensor) -> &[f32] {
    t.as_slice::<f32>().expect("a contiguous f32 tensor has a slice")
}

/// A tensor of `values` with `dims`.
pub(crate) fn tensor(values: Vec<f32>, dims: Vec<usize>) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(values, Shape::from(dims)))
}
