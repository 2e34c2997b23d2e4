//! ONNX export in QDQ form: every integer value of the frozen model becomes a
//! `QuantizeLinear → DequantizeLinear` pair on its grid, around float `Conv`, `Add`, `Concat`,
//! `MaxPool`/`AveragePool`, `GlobalAveragePool` and `Gemm`; weights are int8 initializers with
//! per-channel (axis 0) `DequantizeLinear`, biases int32 at scale `s_in·s_w`. Opset 13.
//! Narrower widths stay in int8 containers: weights of fewer bits are int8 initializers whose
//! values lie in the narrower range, and an activation grid narrower than 8 bits is clipped
//! to its range before its `QuantizeLinear` (see `Builder::qdq`).
//!
//! ONNX `QuantizeLinear` rounds half to even, so a model frozen with ties-away-from-zero
//! rounding is refused rather than exported with a different rounding. The integer add rounds
//! each operand onto the output grid on its own (as the fake-quant model does), so each operand
//! of a QDQ `Add` gets its own `QuantizeLinear → DequantizeLinear` onto the output grid first;
//! they differ only where one operand alone leaves the output range.
//!
//! The protobuf is written by hand (field numbers of `onnx.proto`), so this crate needs no
//! protobuf dependency.

use crate::fixed::{FixedMultiplier, Rounding};
use crate::model::{ActGrid, ConvNode, FrozenModel, ModelError, Node, PoolKind};

/// The opset the export targets.
pub const OPSET: i64 = 13;
const IR_VERSION: i64 = 8;

mod proto;

use proto::{Attr, FLOAT, INT8, INT32, INT64, Msg, UINT8, attribute, field, tensor, value_info};

struct Builder {
    nodes: Vec<Msg>,
    inits: Vec<Msg>,
    count: usize,
}

impl Builder {
    fn node(&mut self, op: &str, inputs: &[&str], output: &str, attrs: &[(&str, Attr)]) {
        use field::node as f;
        let mut m = Msg::default();
        for i in inputs {
            m.str(f::INPUT, i);
        }
        m.str(f::OUTPUT, output);
        self.count += 1;
        m.str(f::NAME, &format!("{op}_{}", self.count)).str(f::OP_TYPE, op);
        for (name, a) in attrs {
            m.msg(f::ATTRIBUTE, &attribute(name, a));
        }
        self.nodes.push(m);
    }

    fn init(&mut self, name: &str, dtype: i64, dims: &[i64], raw: &[u8]) {
        self.inits.push(tensor(name, dtype, dims, raw));
    }

    /// Scale and zero-point initializers of a grid, named after `v`.
    fn grid(&mut self, v: &str, g: &ActGrid) -> (String, String) {
        let (s, z) = (format!("{v}_scale"), format!("{v}_zp"));
        self.init(&s, FLOAT, &[], &g.scale.to_le_bytes());
        if g.unsigned() {
            self.init(&z, UINT8, &[], &[g.zero_point as u8]);
        } else {
            self.init(&z, INT8, &[], &[g.zero_point as i8 as u8]);
        }
        (s, z)
    }

    /// `float → QuantizeLinear → DequantizeLinear` onto `g`, producing `out`. A grid narrower
    /// than its 8-bit container (e.g. 4-bit activations, `[−8, 7]` in an int8) is clipped to
    /// its range first, `[(qmin − z)·s, (qmax − z)·s]`, as the integer model saturates there
    /// and QuantizeLinear would saturate only at the container's ends.
    fn qdq(&mut self, x: &str, out: &str, g: &ActGrid) {
        let (s, z) = self.grid(out, g);
        let q = format!("{out}_q");
        let (lo, hi) = if g.unsigned() { (0, 255) } else { (-128, 127) };
        let mut x = x.to_string();
        if g.qmin > lo || g.qmax < hi {
            let bound = |v: i32| ((v - g.zero_point) as f32) * g.scale;
            let (cmin, cmax, clipped) =
                (format!("{out}_clip_min"), format!("{out}_clip_max"), format!("{out}_clip"));
            self.init(&cmin, FLOAT, &[], &bound(g.qmin).to_le_bytes());
            self.init(&cmax, FLOAT, &[], &bound(g.qmax).to_le_bytes());
            self.node("Clip", &[&x, &cmin, &cmax], &clipped, &[]);
            x = clipped;
        }
        self.node("QuantizeLinear", &[&x, &s, &z], &q, &[]);
        self.node("DequantizeLinear", &[&q, &s, &z], out, &[]);
    }

    /// A per-channel int8 weight or int32 bias, dequantized along axis 0 into `out`.
    fn dq_param(
        &mut self,
        m: &FrozenModel,
        tensor_name: &str,
        out: &str,
    ) -> Result<Vec<i64>, ModelError> {
        let t = m
            .tensors
            .get(tensor_name)
            .ok_or_else(|| ModelError::Invalid(format!("tensor `{tensor_name}` is missing")))?;
        let dims: Vec<i64> = t.dims.iter().map(|&d| i64::from(d)).collect();
        let (dtype, zsize) = match t.dtype {
            crate::qdf::DType::I32 => (INT32, 4),
            _ => (INT8, 1),
        };
        let q = format!("{out}_int");
        self.init(&q, dtype, &dims, &t.data);
        let c = dims[0];
        let scale: Vec<u8> = t.scale.iter().flat_map(|s| s.to_le_bytes()).collect();
        self.init(&format!("{out}_scale"), FLOAT, &[c], &scale);
        self.init(&format!("{out}_zp"), dtype, &[c], &vec![0u8; c as usize * zsize]);
        self.node(
            "DequantizeLinear",
            &[&q, &format!("{out}_scale"), &format!("{out}_zp")],
            out,
            &[("axis", Attr::Int(0))],
        );
        Ok(dims)
    }

    fn int64s(&mut self, name: &str, v: &[i64]) {
        let raw: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.init(name, INT64, &[v.len() as i64], &raw);
    }
}

/// The model as an ONNX `ModelProto` (QDQ form), input `input` `[N, C, H, W]` (normalized
/// floats), output `logits` `[N, classes]` (float, `int logits · logit_scale`).
pub fn export(m: &FrozenModel) -> Result<Vec<u8>, ModelError> {
    m.validate()?;
    if m.graph.rounding != Rounding::TiesToEven {
        return Err(ModelError::Invalid(
            "the model rounds ties away from zero; ONNX QuantizeLinear rounds half to even, so it cannot express this model (freeze with round = ties_to_even)".into(),
        ));
    }
    let mut b = Builder { nodes: Vec::new(), inits: Vec::new(), count: 0 };
    for (i, node) in m.graph.nodes.iter().enumerate() {
        let out = value(i);
        match node {
            Node::Input { grid } => b.qdq("input", &out, grid),
            Node::Conv(c) => b.conv(m, c, &out)?,
            Node::Pool { input, kind, kernel, stride, padding } => {
                let g = m
                    .grid_of(*input)
                    .ok_or_else(|| ModelError::Invalid(format!("node {i}: no grid")))?;
                b.pool(*input, *kind, [*kernel, *stride, *padding], &g, &out);
            }
            Node::Add { inputs, out: g } => b.add(inputs, g, &out),
            Node::Concat { inputs, out: g } => {
                let names: Vec<String> = inputs.iter().map(|(x, _)| value(*x)).collect();
                let refs: Vec<&str> = names.iter().map(String::as_str).collect();
                let y = format!("{out}_f");
                b.node("Concat", &refs, &y, &[("axis", Attr::Int(1))]);
                b.qdq(&y, &out, g);
            }
            Node::Zero { input, stride, out: g } => b.zero(*input, *stride, g, &out),
            Node::GlobalAvgPool { input, out: g, .. } => {
                let y = format!("{out}_f");
                b.node("GlobalAveragePool", &[&value(*input)], &y, &[]);
                let q = format!("{out}_4d");
                b.qdq(&y, &q, g);
                b.node("Flatten", &[&q], &out, &[("axis", Attr::Int(1))]);
            }
            Node::Linear { name, input, .. } => {
                let w = format!("{out}_w");
                let bias = format!("{out}_b");
                b.dq_param(m, &format!("{name}.weight"), &w)?;
                b.dq_param(m, &format!("{name}.bias"), &bias)?;
                let x = value(*input);
                b.node("Gemm", &[&x, &w, &bias], "logits", &[("transB", Attr::Int(1))]);
            }
        }
    }
    model_proto(m, &b)
}

/// The name of value `i` in the exported graph.
fn value(i: usize) -> String {
    format!("v{i}")
}

impl Builder {
    /// A convolution: the crop of its input (`offset`), its ReLU, the float `Conv` of the
    /// dequantized weights and bias, and the QDQ onto its output grid.
    fn conv(&mut self, m: &FrozenModel, c: &ConvNode, out: &str) -> Result<(), ModelError> {
        let mut x = value(c.input);
        if c.offset > 0 {
            let (st, en, ax) =
                (format!("{out}_starts"), format!("{out}_ends"), format!("{out}_axes"));
            let o = c.offset as i64;
            self.int64s(&st, &[o, o]);
            self.int64s(&en, &[i64::MAX, i64::MAX]);
            self.int64s(&ax, &[2, 3]);
            let sliced = format!("{out}_crop");
            self.node("Slice", &[&x, &st, &en, &ax], &sliced, &[]);
            x = sliced;
        }
        if c.relu {
            let r = format!("{out}_relu");
            self.node("Relu", &[&x], &r, &[]);
            x = r;
        }
        let w = format!("{out}_w");
        let bias = format!("{out}_b");
        self.dq_param(m, &format!("{}.weight", c.name), &w)?;
        self.dq_param(m, &format!("{}.bias", c.name), &bias)?;
        let y = format!("{out}_f");
        let [ph, pw] = c.padding;
        self.node(
            "Conv",
            &[&x, &w, &bias],
            &y,
            &[
                ("kernel_shape", Attr::Ints(c.kernel.iter().map(|&k| k as i64).collect())),
                ("strides", Attr::Ints(c.stride.iter().map(|&k| k as i64).collect())),
                ("pads", Attr::Ints(vec![ph as i64, pw as i64, ph as i64, pw as i64])),
                ("dilations", Attr::Ints(vec![c.dilation as i64; 2])),
                ("group", Attr::Int(c.groups as i64)),
            ],
        );
        self.qdq(&y, out, &c.out);
        Ok(())
    }

    /// Max or average pooling (padding excluded from the average) on the input's grid.
    fn pool(&mut self, input: usize, kind: PoolKind, window: [usize; 3], g: &ActGrid, out: &str) {
        let [k, s, p] = window.map(|v| v as i64);
        let mut attrs = vec![
            ("kernel_shape", Attr::Ints(vec![k, k])),
            ("strides", Attr::Ints(vec![s, s])),
            ("pads", Attr::Ints(vec![p; 4])),
        ];
        let op = match kind {
            PoolKind::Max => "MaxPool",
            PoolKind::Avg => {
                attrs.push(("count_include_pad", Attr::Int(0)));
                "AveragePool"
            }
        };
        let y = format!("{out}_f");
        self.node(op, &[&value(input)], &y, &attrs);
        self.qdq(&y, out, g);
    }

    /// A sum: each operand first rounded onto the output grid (QDQ), as the integer add
    /// rescales each operand on its own; the float sum of grid values is then exact.
    fn add(&mut self, inputs: &[(usize, FixedMultiplier)], g: &ActGrid, out: &str) {
        let term = |b: &mut Builder, k: usize, x: usize| {
            let t = format!("{out}_term{k}");
            if inputs.len() > 1 {
                b.qdq(&value(x), &t, g);
                t
            } else {
                value(x)
            }
        };
        let mut acc = term(self, 0, inputs[0].0);
        for (k, (x, _)) in inputs.iter().enumerate().skip(1) {
            let t = term(self, k, *x);
            let s = format!("{out}_sum{k}");
            self.node("Add", &[&acc, &t], &s, &[]);
            acc = s;
        }
        self.qdq(&acc, out, g);
    }

    /// The `none` op: zeros of the (strided) input's shape on its grid.
    fn zero(&mut self, input: usize, stride: usize, g: &ActGrid, out: &str) {
        let mut x = value(input);
        if stride > 1 {
            let (st, en, ax, sp) = (
                format!("{out}_starts"),
                format!("{out}_ends"),
                format!("{out}_axes"),
                format!("{out}_steps"),
            );
            self.int64s(&st, &[0, 0]);
            self.int64s(&en, &[i64::MAX, i64::MAX]);
            self.int64s(&ax, &[2, 3]);
            self.int64s(&sp, &[stride as i64; 2]);
            let s = format!("{out}_strided");
            self.node("Slice", &[&x, &st, &en, &ax, &sp], &s, &[]);
            x = s;
        }
        let zero = format!("{out}_zero");
        self.init(&zero, FLOAT, &[], &0f32.to_le_bytes());
        let y = format!("{out}_f");
        self.node("Mul", &[&x, &zero], &y, &[]);
        self.qdq(&y, out, g);
    }
}

/// The `ModelProto` around the built nodes and initializers, with the genotype, the input
/// normalization and the logit scale as metadata.
fn model_proto(m: &FrozenModel, b: &Builder) -> Result<Vec<u8>, ModelError> {
    let [c, h, w] = m.graph.input_shape;
    let mut graph = Msg::default();
    for n in &b.nodes {
        graph.msg(field::graph::NODE, n);
    }
    graph.str(field::graph::NAME, "qdarts");
    for t in &b.inits {
        graph.msg(field::graph::INITIALIZER, t);
    }
    let input = value_info("input", &[None, Some(c as i64), Some(h as i64), Some(w as i64)]);
    graph.msg(field::graph::INPUT, &input);
    let logits = value_info("logits", &[None, Some(m.graph.classes as i64)]);
    graph.msg(field::graph::OUTPUT, &logits);
    let mut opset = Msg::default();
    opset.str(field::opset::DOMAIN, "").int(field::opset::VERSION, OPSET);
    let mut model = Msg::default();
    model
        .int(field::model::IR_VERSION, IR_VERSION)
        .str(field::model::PRODUCER_NAME, "qdarts")
        .str(field::model::PRODUCER_VERSION, env!("CARGO_PKG_VERSION"))
        .msg(field::model::GRAPH, &graph)
        .msg(field::model::OPSET_IMPORT, &opset);
    let json = |v: &[f32]| {
        serde_json::to_string(v).map_err(|e| ModelError::Invalid(format!("normalization: {e}")))
    };
    let logit_scale = match m.graph.nodes.last() {
        Some(Node::Linear { logit_scale, .. }) => logit_scale.to_string(),
        _ => return Err(ModelError::Invalid("the last node must be the classifier".into())),
    };
    for (k, val) in [
        ("genotype", m.genotype.to_darts_text()),
        ("mean", json(&m.graph.mean)?),
        ("std", json(&m.graph.std)?),
        ("logit_scale", logit_scale),
    ] {
        let mut prop = Msg::default();
        prop.str(field::entry::KEY, k).str(field::entry::VALUE, &val);
        model.msg(field::model::METADATA_PROPS, &prop);
    }
    Ok(model.0)
}
