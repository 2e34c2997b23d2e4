//! One search step as a fixture for the PyTorch reference (`scripts/torch_reference.py`): the
//! inputs (a small supernet's weights, BatchNorm and observer state, α, the weight optimizer's
//! momentum buffers, a training and a validation batch, the hyperparameters), and what qdarts
//! computes from them: the second-order α gradient and its two parts, then one first-order
//! search step (α gradient, α after Adam, training loss, every network tensor after SGD).
//!
//! Files of a fixture folder: `spec.json`; `net.safetensors` (every float parameter and running
//! state of the network, by module path), `alphas.safetensors` (`normal`, `reduce`),
//! `velocity.safetensors` (momentum buffers by parameter path), `batches.safetensors`
//! (`train_x`, `train_y`, `val_x`, `val_y`); the reference's `expected.safetensors`, and
//! beside a float64 expectation optionally [`FLOAT32_REFERENCE`], the reference's own float32
//! outputs of the kink-prone terms (see [`check_fixture`]).

use std::collections::BTreeMap;
use std::path::Path;

use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::tensor::{Device, Tensor};
use qdarts_data::{DatasetKind, batch, embedded};
use qdarts_engine::tensors::{self, HostTensor, TensorMap};
use qdarts_engine::{RunError, Sgd, seeded};
use qdarts_genotypes::Primitive;
use qdarts_ops::qconfig::{Preset, QuantConfig};
use serde::{Deserialize, Serialize};

use crate::architect::{AlphaGrads, Batch, second_order_parts};
use crate::config::{Order, SearchConfig};
use crate::step::{build_optimizers, weight_backward, weight_step};
use crate::supernet::{Alphas, NetShape, SearchNetwork};

/// The shape and hyperparameters of a fixture.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepSpec {
    /// Quantization preset (`float` or `tensorrt`).
    pub preset: Preset,
    /// Channels of the first cell.
    pub channels: usize,
    /// Cells.
    pub layers: usize,
    /// Intermediate nodes per cell.
    pub nodes: usize,
    /// Stem channels = `stem_multiplier · channels`.
    pub stem_multiplier: usize,
    /// Images per batch.
    pub batch: usize,
    /// Seed of the initial weights and α.
    pub seed: u64,
    /// Weight learning rate (ξ of the virtual step).
    pub lr: f64,
    /// SGD momentum μ.
    pub w_momentum: f64,
    /// Weight decay λ.
    pub w_weight_decay: f64,
    /// Global gradient-norm clip.
    pub w_grad_clip: f64,
    /// Adam learning rate of α.
    pub alpha_lr: f64,
    /// Adam betas of α.
    pub alpha_betas: [f64; 2],
    /// Adam weight decay of α.
    pub alpha_weight_decay: f64,
}

impl StepSpec {
    /// A small supernet: C = 4, 3 cells of 2 nodes, batch 8, Fashion-MNIST 28×28.
    pub fn small(preset: Preset) -> Self {
        let s = SearchConfig::with_defaults(1, 8);
        StepSpec {
            preset,
            channels: 4,
            layers: 3,
            nodes: 2,
            stem_multiplier: 3,
            batch: 8,
            seed: 11,
            lr: s.w_lr,
            w_momentum: s.w_momentum,
            w_weight_decay: s.w_weight_decay,
            w_grad_clip: s.w_grad_clip,
            alpha_lr: 0.01,
            alpha_betas: s.alpha_betas,
            alpha_weight_decay: s.alpha_weight_decay,
        }
    }

    fn search(&self) -> SearchConfig {
        SearchConfig {
            order: Order::First,
            w_lr: self.lr,
            w_momentum: self.w_momentum,
            w_weight_decay: self.w_weight_decay,
            w_grad_clip: self.w_grad_clip,
            alpha_lr: self.alpha_lr,
            alpha_betas: self.alpha_betas,
            alpha_weight_decay: self.alpha_weight_decay,
            ..SearchConfig::with_defaults(1, self.batch)
        }
    }

    fn shape(&self) -> NetShape {
        NetShape {
            c_in: 1,
            classes: 10,
            channels: self.channels,
            layers: self.layers,
            nodes: self.nodes,
            stem_multiplier: self.stem_multiplier,
            primitives: Primitive::DARTS.to_vec(),
            partial_channels: 1,
            bits: None,
        }
    }
}

/// The state a search step starts from.
#[derive(Debug)]
pub struct StepState {
    /// The supernet.
    pub net: SearchNetwork,
    /// α.
    pub alphas: Alphas,
    /// The weight optimizer (its momentum buffers).
    pub w_optim: Sgd,
    /// The training batch.
    pub train: Batch,
    /// The validation batch.
    pub val: Batch,
}

fn build(spec: &StepSpec, device: &Device) -> Result<(SearchNetwork, Alphas), RunError> {
    let quant = QuantConfig::preset(spec.preset);
    seeded(device, spec.seed, || {
        let net = SearchNetwork::new(&spec.shape(), &quant, device)?;
        Ok((net, Alphas::new(spec.nodes, Primitive::DARTS.len(), device)))
    })
}

/// A fixture's inputs: the supernet after one weight step on the first batch of the embedded
/// data (so that momentum, BatchNorm statistics and observers have a history), and the next
/// two batches as the training and validation batch. `device` must be an autodiff device.
pub fn prepare(spec: &StepSpec, device: &Device) -> Result<StepState, RunError> {
    let (net, alphas) = build(spec, device)?;
    let set = embedded(true)?;
    let b = spec.batch;
    let take = |from: usize| {
        let idx: Vec<usize> = (from..from + b).collect();
        batch(&set, DatasetKind::FashionMnist, &idx, None, device)
    };
    let s = spec.search();
    let (mut w_optim, _) = build_optimizers(&s);
    let (net, _) = weight_step(net, &alphas, &mut w_optim, &take(0), spec.lr, &s);
    Ok(StepState { net, alphas, w_optim, train: take(b), val: take(2 * b) })
}

/// The path, id and shape of every parameter.
struct Ids(Vec<String>, Vec<(String, ParamId, Vec<usize>)>);

impl ModuleVisitor for Ids {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.0.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.0.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        self.1.push((self.0.join("."), param.id, param.val().dims().to_vec()));
    }
}

fn ids(net: &SearchNetwork) -> Vec<(String, ParamId, Vec<usize>)> {
    let mut v = Ids(Vec::new(), Vec::new());
    net.visit(&mut v);
    v.1
}

fn alpha_map(normal: Tensor<2>, reduce: Tensor<2>, prefix: &str) -> Result<TensorMap, RunError> {
    let mut m = TensorMap::new();
    m.insert(format!("{prefix}normal"), HostTensor::of(normal, "α")?);
    m.insert(format!("{prefix}reduce"), HostTensor::of(reduce, "α")?);
    Ok(m)
}

/// Writes a fixture's inputs into `dir`.
pub fn write_inputs(dir: &Path, spec: &StepSpec, st: &StepState) -> Result<(), RunError> {
    std::fs::create_dir_all(dir).map_err(|e| qdarts_engine::checkpoint_error(dir, e))?;
    let json =
        serde_json::to_vec_pretty(spec).map_err(|e| qdarts_engine::checkpoint_error(dir, e))?;
    qdarts_record::write_atomic(&dir.join("spec.json"), &json)?;
    let none = BTreeMap::new();
    tensors::write(&dir.join("net.safetensors"), &tensors::collect(&st.net)?, &none)?;
    let a = alpha_map(st.alphas.normal.val(), st.alphas.reduce.val(), "")?;
    tensors::write(&dir.join("alphas.safetensors"), &a, &none)?;
    let mut v = TensorMap::new();
    for (path, id, dims) in ids(&st.net) {
        if let Some(t) = st.w_optim.velocity::<1>(id, [dims.iter().product()]) {
            let flat = HostTensor::of(t, &path)?;
            v.insert(path, HostTensor { dims, values: flat.values });
        }
    }
    tensors::write(&dir.join("velocity.safetensors"), &v, &none)?;
    let mut x = TensorMap::new();
    x.insert("train_x".into(), HostTensor::of(st.train.0.clone(), "batch")?);
    x.insert("val_x".into(), HostTensor::of(st.val.0.clone(), "batch")?);
    let mut y = BTreeMap::new();
    y.insert("train_y".into(), tensors::labels_of(st.train.1.clone())?);
    y.insert("val_y".into(), tensors::labels_of(st.val.1.clone())?);
    tensors::write(&dir.join("batches.safetensors"), &x, &y)
}

/// Reads a fixture's inputs from `dir` onto `device` (an autodiff device).
pub fn read_inputs(dir: &Path, device: &Device) -> Result<(StepSpec, StepState), RunError> {
    let sp = dir.join("spec.json");
    let text = std::fs::read(&sp).map_err(|e| qdarts_engine::checkpoint_error(&sp, e))?;
    let spec: StepSpec =
        serde_json::from_slice(&text).map_err(|e| qdarts_engine::checkpoint_error(&sp, e))?;
    let (net, _) = build(&spec, device)?;
    let np = dir.join("net.safetensors");
    let net = tensors::assign(net, &tensors::read(&np)?.0, &np)?;
    let ap = dir.join("alphas.safetensors");
    let (a, _) = tensors::read(&ap)?;
    let pick = |k: &str| {
        a.get(k)
            .map(|t| t.to_tensor::<2>(device))
            .ok_or_else(|| qdarts_engine::checkpoint_error(&ap, format!("no tensor `{k}`")))
    };
    let alphas = Alphas {
        normal: Param::from_tensor(pick("normal")?),
        reduce: Param::from_tensor(pick("reduce")?),
        edge_normal: None,
        edge_reduce: None,
        nodes: spec.nodes,
        bits: None,
        projection: None,
    };
    let (mut w_optim, _) = build_optimizers(&spec.search());
    let (v, _) = tensors::read(&dir.join("velocity.safetensors"))?;
    for (path, id, _) in ids(&net) {
        if let Some(t) = v.get(&path) {
            let flat = HostTensor { dims: vec![t.values.len()], values: t.values.clone() };
            w_optim.set_velocity(id, flat.to_tensor::<1>(device));
        }
    }
    let bp = dir.join("batches.safetensors");
    let (x, y) = tensors::read(&bp)?;
    let get_x = |k: &str| {
        x.get(k)
            .map(|t| t.to_tensor::<4>(device))
            .ok_or_else(|| qdarts_engine::checkpoint_error(&bp, format!("no tensor `{k}`")))
    };
    let get_y = |k: &str| {
        y.get(k)
            .map(|(d, v)| {
                Tensor::<1, burn::tensor::Int>::from_data(
                    burn::tensor::TensorData::new(v.clone(), d.clone()),
                    device,
                )
            })
            .ok_or_else(|| qdarts_engine::checkpoint_error(&bp, format!("no tensor `{k}`")))
    };
    let st = StepState {
        net,
        alphas,
        w_optim,
        train: (get_x("train_x")?, get_y("train_y")?),
        val: (get_x("val_x")?, get_y("val_y")?),
    };
    Ok((spec, st))
}

/// A fixture's inputs with the supernet's cells in waves ([`SearchNetwork::batch_cells`]): the
/// stacked weights, BatchNorm statistics and momentum buffers are the per-edge ones stacked, so
/// that [`compute`] checks the batched cell against the same reference. Float fixtures only.
pub fn batch_inputs(dir: &Path, spec: &StepSpec, st: StepState) -> Result<StepState, RunError> {
    let StepState { mut net, alphas, mut w_optim, train, val } = st;
    let device = train.0.device();
    let vp = dir.join("velocity.safetensors");
    let (v, _) = tensors::read(&vp)?;
    // A network of its own (a clone would share the running states) whose weights are the
    // momentum buffers (zero where a weight has none), batched as the network is: its stacked
    // weights are the stacked buffers.
    let mut values = tensors::collect(&net)?;
    for (path, _, dims) in ids(&net) {
        let n = dims.iter().product();
        let buf = v.get(&path).map_or_else(|| vec![0.0; n], |t| t.values.clone());
        values.insert(path, HostTensor { dims, values: buf });
    }
    let mut momentum = tensors::assign(build(spec, &device)?.0, &values, &vp)?;
    let refuse =
        |e: crate::supernet::BatchError| qdarts_engine::checkpoint_error(dir, e.to_string());
    net.batch_cells(&Primitive::DARTS).map_err(refuse)?;
    momentum.batch_cells(&Primitive::DARTS).map_err(refuse)?;
    let stacked = tensors::collect(&momentum)?;
    for (path, id, _) in ids(&net) {
        if let Some(t) = stacked.get(&path).filter(|_| path.starts_with("batched.")) {
            let flat = HostTensor { dims: vec![t.values.len()], values: t.values.clone() };
            w_optim.set_velocity(id, flat.to_tensor::<1>(&device));
        }
    }
    Ok(StepState { net, alphas, w_optim, train, val })
}

fn grads(g: &AlphaGrads, prefix: &str) -> Result<TensorMap, RunError> {
    alpha_map(g.normal.clone(), g.reduce.clone(), prefix)
}

/// What qdarts computes from a fixture's inputs: `second.dalpha.*` (∇α L_val(w', α)),
/// `second.hessian.*` (the Hessian-vector product), `second.total.*` (the second-order
/// gradient); then one first-order search step: `first.*` (∇α L_val(w, α)), `alphas_after.*`
/// (α after Adam), `loss` (the weight step's training loss) and `net_after.<path>` (every
/// network tensor after SGD, running states included).
pub fn compute(spec: &StepSpec, st: StepState) -> Result<TensorMap, RunError> {
    let StepState { mut net, alphas, mut w_optim, train, val } = st;
    let s = spec.search();
    let mut out = TensorMap::new();
    // The second-order gradient runs on copies: the network stays as it is for the step below.
    let (d, h) = second_order_parts(&net, &alphas, (&train, &val), spec.lr, &w_optim);
    let total = d.combine(1.0, &h, -(spec.lr as f32));
    out.extend(grads(&d, "second.dalpha.")?);
    out.extend(grads(&h, "second.hessian.")?);
    out.extend(grads(&total, "second.total.")?);
    // One first-order search step.
    let first = crate::architect::first_order(&mut net, &alphas, &val);
    out.extend(grads(&first, "first.")?);
    let (_, mut a_optim) = build_optimizers(&s);
    let g = first.into_params(&alphas);
    let alphas = a_optim.step(s.alpha_lr, alphas, g);
    out.extend(alpha_map(alphas.normal.val(), alphas.reduce.val(), "alphas_after.")?);
    let (back, _) = weight_backward(&net, &alphas, &train, None, &s, None, None);
    let net = qdarts_ops::quant::lsq::apply_init(net);
    let mut net = w_optim.step(spec.lr, net, back.grads);
    // Batched cells ([`batch_inputs`]): their weights are reported under the per-edge names.
    net.unbatch_cells();
    out.insert("loss".into(), HostTensor { dims: vec![1], values: vec![back.loss as f32] });
    for (name, t) in tensors::collect(&net)? {
        out.insert(format!("net_after.{name}"), t);
    }
    Ok(out)
}

mod check;
pub use check::{Check, FLOAT32_REFERENCE, SPREAD, Spread, Variant, check_fixture, compare};
