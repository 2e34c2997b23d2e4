//! A module's tensors by name, as a safetensors file: what the PyTorch reference reads and
//! writes (`scripts/torch_reference.py`). Names are the module paths (`cells.0.edges.1.ops.2.
//! Sep.op1.dw.weight.weight`), every float parameter and running state included; values are
//! f32 (labels i64).

use std::collections::BTreeMap;
use std::path::Path;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::{Device, Int, Tensor, TensorData};
use safetensors::{Dtype, SafeTensors};

use crate::RunError;

/// A tensor on the host: its shape and values.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    /// Shape.
    pub dims: Vec<usize>,
    /// Values, row-major.
    pub values: Vec<f32>,
}

impl HostTensor {
    /// The host copy of a tensor.
    pub fn of<const D: usize>(t: Tensor<D>, what: &str) -> Result<Self, RunError> {
        let dims = t.dims().to_vec();
        Ok(HostTensor { dims, values: crate::read_f32(t, what)? })
    }

    /// As a tensor of rank `D` on `device`.
    pub fn to_tensor<const D: usize>(&self, device: &Device) -> Tensor<D> {
        Tensor::from_data(TensorData::new(self.values.clone(), self.dims.clone()), device)
    }
}

/// Named tensors, in name order.
pub type TensorMap = BTreeMap<String, HostTensor>;

fn file_err(path: &Path, e: impl std::fmt::Display) -> RunError {
    RunError::Checkpoint { path: path.into(), message: e.to_string() }
}

/// Writes named f32 tensors (and named i64 tensors) as one safetensors file.
pub fn write(
    path: &Path,
    floats: &TensorMap,
    ints: &BTreeMap<String, (Vec<usize>, Vec<i64>)>,
) -> Result<(), RunError> {
    let mut bytes: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, t) in floats {
        let b = t.values.iter().flat_map(|v| v.to_le_bytes()).collect();
        bytes.push((name.clone(), Dtype::F32, t.dims.clone(), b));
    }
    for (name, (dims, v)) in ints {
        let b = v.iter().flat_map(|v| v.to_le_bytes()).collect();
        bytes.push((name.clone(), Dtype::I64, dims.clone(), b));
    }
    let views = bytes
        .iter()
        .map(|(n, d, s, b)| {
            safetensors::tensor::TensorView::new(*d, s.clone(), b).map(|v| (n.clone(), v))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_err(path, e))?;
    let out = safetensors::serialize(views, None).map_err(|e| file_err(path, e))?;
    Ok(qdarts_record::write_atomic(path, &out)?)
}

/// Reads a safetensors file: its f32 tensors and its i64 tensors.
#[allow(clippy::type_complexity)]
pub fn read(
    path: &Path,
) -> Result<(TensorMap, BTreeMap<String, (Vec<usize>, Vec<i64>)>), RunError> {
    let bytes = std::fs::read(path).map_err(|e| file_err(path, e))?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| file_err(path, e))?;
    let (mut floats, mut ints) = (TensorMap::new(), BTreeMap::new());
    for (name, view) in st.tensors() {
        let dims = view.shape().to_vec();
        match view.dtype() {
            Dtype::F32 => {
                let values = view
                    .data()
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                floats.insert(name, HostTensor { dims, values });
            }
            Dtype::I64 => {
                let values = view
                    .data()
                    .chunks_exact(8)
                    .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                    .collect();
                ints.insert(name, (dims, values));
            }
            other => return Err(file_err(path, format!("tensor {name}: dtype {other:?}"))),
        }
    }
    Ok((floats, ints))
}

/// Labels as an i64 host tensor.
pub fn labels_of(t: Tensor<1, Int>) -> Result<(Vec<usize>, Vec<i64>), RunError> {
    let dims = t.dims().to_vec();
    let v = t
        .try_to_vec_as::<i64>()
        .map_err(|e| RunError::ReadBack { what: "labels".into(), message: format!("{e:?}") })?;
    Ok((dims, v))
}

struct Collect {
    path: Vec<String>,
    out: Vec<(String, Result<HostTensor, RunError>)>,
}

impl ModuleVisitor for Collect {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let name = self.path.join(".");
        let t = HostTensor::of(param.val(), &name);
        self.out.push((name, t));
    }
}

/// Every float parameter and running state of `module`, by path.
pub fn collect<M: Module>(module: &M) -> Result<TensorMap, RunError> {
    let mut c = Collect { path: Vec::new(), out: Vec::new() };
    module.visit(&mut c);
    c.out.into_iter().map(|(n, t)| t.map(|t| (n, t))).collect()
}

struct Assign<'a> {
    path: Vec<String>,
    values: &'a TensorMap,
    missing: Vec<String>,
}

impl ModuleMapper for Assign<'_> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let name = self.path.join(".");
        let Some(v) = self.values.get(&name) else {
            self.missing.push(name);
            return param;
        };
        if v.dims != param.val().dims().to_vec() {
            self.missing.push(format!("{name} (shape {:?})", v.dims));
            return param;
        }
        param.map(|p| {
            let tracked = p.is_require_grad();
            let t = v.to_tensor::<D>(&p.device());
            if tracked { t.require_grad() } else { t }
        })
    }
}

/// `module` with every float parameter and running state set from `values` by path; an error
/// lists the paths that are missing or of another shape.
pub fn assign<M: Module>(module: M, values: &TensorMap, what: &Path) -> Result<M, RunError> {
    let mut a = Assign { path: Vec::new(), values, missing: Vec::new() };
    let module = module.map(&mut a);
    if a.missing.is_empty() {
        Ok(module)
    } else {
        Err(file_err(what, format!("no value for {}", a.missing.join(", "))))
    }
}
