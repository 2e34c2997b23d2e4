//! The discrete (evaluation) network of a genotype, as pt.darts' `AugmentCNN`: a stem, cells
//! whose edges are the genotype's ops (quantized, affine BatchNorm), an auxiliary head after
//! the second reduction, global average pooling and a classifier; drop-path on training steps.
//!
//! Quantization: an input quantizer (the first step of integer inference) quantizes the
//! normalized image; every op ends on an activation grid, node sums and the cell concat are
//! requantized as the integer model computes them. An op of a genotype with per-op widths
//! (`normal_bits` / `reduce_bits`, from a bit-width search) quantizes its weights and its own
//! activations at those widths; ops without convolutions and everything outside the cells keep
//! the config's. The auxiliary head is float: it only shapes the training loss and is not
//! part of the deployed model.

use burn::module::Module;
use burn::tensor::activation::relu;
use burn::tensor::module::avg_pool2d;
use burn::tensor::ops::AvgPoolOptions;
use burn::tensor::{Device, Tensor, TensorData};
use qdarts_genotypes::Genotype;
use qdarts_ops::arith::{QAdd, QConcat};
use qdarts_ops::candidates::{
    CandidateOp, ConvShape, Ctx, OpBits, Pass, QBatchNorm, QConv, QStdConv, QTensor, QuantSites,
    quantize_opt,
};
use qdarts_ops::qconfig::{QuantConfig, Site};
use qdarts_ops::quant::{FakeQuantizer, QuantPass, SpecError};

use qdarts_data::Rng;
use qdarts_ops::network::{Preprocess, QLinear, is_reduction};

/// The shape of an evaluation network.
#[derive(Debug, Clone, PartialEq)]
pub struct EvalShape {
    /// Input channels.
    pub c_in: usize,
    /// Input height (= width).
    pub size: usize,
    /// Classes.
    pub classes: usize,
    /// Channels of the first cell.
    pub channels: usize,
    /// Cells.
    pub layers: usize,
    /// Stem channels = `stem_multiplier · channels`.
    pub stem_multiplier: usize,
    /// With the auxiliary head.
    pub auxiliary: bool,
}

/// One cell of the evaluation network.
#[derive(Module, Debug)]
pub struct EvalCell {
    /// Preprocessing of the cell's first input.
    pub preproc0: Preprocess,
    /// Preprocessing of the second input.
    pub preproc1: QStdConv,
    /// One op per genotype edge, node by node.
    pub ops: Vec<CandidateOp>,
    /// The input state of each op.
    pub inputs: Vec<usize>,
    /// Ops per node.
    pub per_node: Vec<usize>,
    /// One requantizing add per node.
    pub adds: Vec<QAdd>,
    /// The states concatenated into the output.
    pub concat_idx: Vec<usize>,
    /// The output concat.
    pub concat: QConcat,
    /// Whether it halves the resolution.
    pub reduction: bool,
}

/// Shapes of a cell.
#[derive(Debug, Clone, Copy)]
struct CellDims {
    c_pp: usize,
    c_p: usize,
    c: usize,
    reduction: bool,
    reduction_prev: bool,
}

/// pt.darts' `drop_path_`: zeroes whole samples with probability `p` and scales the rest by
/// `1/(1 − p)`; the mask comes from `rng` so that a resumed run draws the same masks.
fn drop_path(x: Tensor<4>, p: f64, rng: &mut Rng) -> Tensor<4> {
    let n = x.dims()[0];
    let keep = 1.0 - p;
    let mask: Vec<f32> = (0..n)
        .map(|_| {
            let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
            if u < keep { (1.0 / keep) as f32 } else { 0.0 }
        })
        .collect();
    let m = Tensor::<4>::from_data(TensorData::new(mask, [n, 1, 1, 1]), &x.device());
    x.mul(m)
}

impl EvalCell {
    fn new(
        d: CellDims,
        genotype: &Genotype,
        cfg: &QuantConfig,
        path: &str,
        device: &Device,
    ) -> Result<Self, SpecError> {
        let ctx =
            |name: &str, op: &'static str| Ctx::new(cfg, op, format!("{path}.{name}"), device);
        let (preproc0, preproc1) =
            Preprocess::pair(d.reduction_prev, [d.c_pp, d.c_p, d.c], true, cfg, path, device)?;
        let (nodes, concat_idx, bits) = if d.reduction {
            (&genotype.reduce, &genotype.reduce_concat, &genotype.reduce_bits)
        } else {
            (&genotype.normal, &genotype.normal_concat, &genotype.normal_bits)
        };
        let mut ops = Vec::new();
        let mut inputs = Vec::new();
        let mut per_node = Vec::new();
        let mut adds = Vec::new();
        for (i, edges) in nodes.iter().enumerate() {
            for (j, e) in edges.iter().enumerate() {
                let stride = if d.reduction && e.input < 2 { 2 } else { 1 };
                let k = ops.len();
                // The genotype's widths of this op (a bit-width search's), else the config's.
                let op_bits = match bits.as_ref().and_then(|b| b.get(i)?.get(j)) {
                    Some(b) => OpBits::Fixed { weight: b.weight.into(), act: b.act.into() },
                    None => OpBits::Config,
                };
                ops.push(CandidateOp::with_bits(
                    e.op,
                    d.c,
                    stride,
                    true,
                    cfg,
                    &format!("{path}.ops.{k}.{}", e.op),
                    device,
                    op_bits,
                )?);
                inputs.push(e.input);
            }
            per_node.push(edges.len());
            adds.push(QAdd::new(&ctx(&format!("nodes.{}", i + 2), "add"))?);
        }
        Ok(EvalCell {
            preproc0,
            preproc1,
            ops,
            inputs,
            per_node,
            adds,
            concat_idx: concat_idx.clone(),
            concat: QConcat::new(&ctx("concat", "concat"))?,
            reduction: d.reduction,
        })
    }

    /// # Shapes
    /// - s0, s1: `[N, C_pp, H, W]`, `[N, C_p, H', W']`; output `[N, |concat|·C, H'/r, W'/r]`.
    pub fn forward(
        &self,
        (s0, s1): (QTensor, QTensor),
        drop: &mut Option<(f64, &mut Rng)>,
        qp: QuantPass,
    ) -> QTensor {
        let s0 = self.preproc0.forward_in(s0, qp);
        let mut states = vec![s0, self.preproc1.forward_in(s1, qp)];
        let mut k = 0;
        for (add, &n) in self.adds.iter().zip(&self.per_node) {
            let mut terms = Vec::with_capacity(n);
            for _ in 0..n {
                let op = &self.ops[k];
                let mut y = op.forward_in(states[self.inputs[k]].clone(), Pass::quantizing(qp));
                if let Some((p, rng)) = drop.as_mut()
                    && *p > 0.0
                    && !matches!(op, CandidateOp::Identity(_))
                {
                    y = QTensor { value: drop_path(y.value, *p, rng), grid: None };
                }
                terms.push(y);
                k += 1;
            }
            states.push(add.forward_in(terms, qp));
        }
        let out = self.concat_idx.iter().map(|&i| states[i].clone()).collect();
        self.concat.forward_in(out, qp)
    }
}

impl QuantSites for EvalCell {
    fn quantizers(&self) -> Vec<&FakeQuantizer> {
        let mut q = self.preproc0.quantizers();
        q.extend(self.preproc1.quantizers());
        for o in &self.ops {
            q.extend(o.quantizers());
        }
        for a in &self.adds {
            q.extend(a.quantizers());
        }
        q.extend(self.concat.quantizers());
        q
    }
}

/// pt.darts' auxiliary head (float): ReLU, 5×5 average pool to 2×2, 1×1 conv to 128, BN, ReLU,
/// 2×2 conv to 768, BN, ReLU, linear.
#[derive(Module, Debug)]
pub struct AuxHead {
    conv1: QConv,
    bn1: QBatchNorm,
    conv2: QConv,
    bn2: QBatchNorm,
    linear: QLinear,
    pool_stride: usize,
}

impl AuxHead {
    fn new(size: usize, c: usize, classes: usize, device: &Device) -> Result<Self, SpecError> {
        let cfg = QuantConfig::float();
        let ctx = |p: &str| Ctx::new(&cfg, "auxiliary", format!("aux.{p}"), device);
        Ok(AuxHead {
            conv1: QConv::new(ConvShape::square(c, 128, 1, 1, 0), &ctx("conv1"))?,
            bn1: QBatchNorm::new(128, true, &ctx("bn1"))?,
            conv2: QConv::new(ConvShape::square(128, 768, 2, 1, 0), &ctx("conv2"))?,
            bn2: QBatchNorm::new(768, true, &ctx("bn2"))?,
            linear: QLinear::new(768, classes, &ctx("linear"))?,
            // 8×8 (CIFAR) → stride 3, 7×7 (28-pixel images) → stride 2: both give 2×2.
            pool_stride: size.saturating_sub(5).max(1),
        })
    }

    fn forward(&self, x: Tensor<4>) -> Tensor<2> {
        let mut opts = AvgPoolOptions::new([5, 5]).with_stride([self.pool_stride; 2]);
        opts.count_include_pad = false;
        let x = avg_pool2d(relu(x), opts);
        let x = relu(self.bn1.forward(self.conv1.forward(x)));
        let x = relu(self.bn2.forward(self.conv2.forward(x)));
        let [n, c, h, w] = x.dims();
        self.linear.forward(x.reshape([n, c * h * w]))
    }
}

/// The evaluation network of a genotype.
#[derive(Module, Debug)]
pub struct EvalNetwork {
    /// Quantizer of the normalized input image.
    pub input_act: Option<FakeQuantizer>,
    /// Stem conv 3×3.
    pub stem: QConv,
    /// Stem BN (affine).
    pub stem_bn: QBatchNorm,
    /// Stem output quantizer.
    pub stem_act: Option<FakeQuantizer>,
    /// Cells.
    pub cells: Vec<EvalCell>,
    /// Auxiliary head (training only), after cell `aux_pos`.
    pub aux: Option<AuxHead>,
    /// The cell after which the auxiliary head reads.
    pub aux_pos: usize,
    /// Quantizer of the pooled features.
    pub gap_act: Option<FakeQuantizer>,
    /// Classifier.
    pub classifier: QLinear,
}

impl EvalNetwork {
    /// Builds the network; the device should be seeded by the caller for reproducible weights.
    pub fn new(
        s: &EvalShape,
        genotype: &Genotype,
        cfg: &QuantConfig,
        device: &Device,
    ) -> Result<Self, SpecError> {
        let ctx = |path: &str, op: &'static str| Ctx::new(cfg, op, path, device);
        let c_stem = s.stem_multiplier * s.channels;
        let input_act = ctx("input", "input").quantizer(Site::Act, "act", 1)?;
        let stem =
            QConv::new(ConvShape::square(s.c_in, c_stem, 3, 1, 1), &ctx("stem.conv", "stem"))?;
        let stem_bn = QBatchNorm::new(c_stem, true, &ctx("stem.bn", "stem"))?;
        let stem_act = ctx("stem", "stem").quantizer(Site::Act, "act", 1)?;
        let (mut c_pp, mut c_p, mut c) = (c_stem, c_stem, s.channels);
        let mut reduction_prev = false;
        let mut cells = Vec::with_capacity(s.layers);
        let aux_pos = 2 * s.layers / 3;
        let mut aux = None;
        let mut size = s.size;
        for i in 0..s.layers {
            let reduction = is_reduction(i, s.layers);
            if reduction {
                c *= 2;
                size /= 2;
            }
            let d = CellDims { c_pp, c_p, c, reduction, reduction_prev };
            cells.push(EvalCell::new(d, genotype, cfg, &format!("cells.{i}"), device)?);
            reduction_prev = reduction;
            let multiplier =
                if reduction { genotype.reduce_concat.len() } else { genotype.normal_concat.len() };
            (c_pp, c_p) = (c_p, c * multiplier);
            if i == aux_pos && s.auxiliary {
                aux = Some(AuxHead::new(size, c_p, s.classes, device)?);
            }
        }
        Ok(EvalNetwork {
            input_act,
            stem,
            stem_bn,
            stem_act,
            cells,
            aux,
            aux_pos,
            gap_act: ctx("gap", "classifier").quantizer(Site::Act, "act", 1)?,
            classifier: QLinear::new(c_p, s.classes, &ctx("classifier", "classifier"))?,
        })
    }

    /// Logits, and the auxiliary head's logits when it exists and `drop` is given (training).
    /// `drop`: drop-path probability and the generator of its masks (training only); `qp`: what
    /// the quantizers do besides quantizing (record their errors).
    ///
    /// # Shapes
    /// - x: `[N, C_in, H, W]` (normalized); output `[N, classes]`.
    pub fn forward_train(
        &self,
        x: Tensor<4>,
        mut drop: Option<(f64, &mut Rng)>,
        qp: QuantPass,
    ) -> (Tensor<2>, Option<Tensor<2>>) {
        let training = drop.is_some();
        let x = quantize_opt(&self.input_act, x, qp);
        let (y, unit) = self.stem.forward_unit(x.value, x.grid.as_ref(), Pass::quantizing(qp));
        let s = quantize_opt(&self.stem_act, self.stem_bn.forward_biased(y, unit, qp), qp);
        let (mut s0, mut s1) = (s.clone(), s);
        let mut aux_logits = None;
        for (i, cell) in self.cells.iter().enumerate() {
            let out = cell.forward((s0, s1.clone()), &mut drop, qp);
            (s0, s1) = (s1, out);
            if i == self.aux_pos
                && training
                && let Some(aux) = &self.aux
            {
                aux_logits = Some(aux.forward(s1.value.clone()));
            }
        }
        let [n, c, _, _] = s1.dims();
        let pooled = s1.value.mean_dim(3).mean_dim(2).reshape([n, c]);
        let (pooled, grid) = match &self.gap_act {
            Some(q) => {
                let (v, g) = q.forward_in(pooled, qp);
                (v, Some(g))
            }
            None => (pooled, None),
        };
        (self.classifier.forward_q(pooled, grid.as_ref(), qp), aux_logits)
    }

    /// Inference logits (no drop-path, no auxiliary head).
    pub fn forward(&self, x: Tensor<4>) -> Tensor<2> {
        self.forward_train(x, None, QuantPass::OFF).0
    }
}

impl QuantSites for EvalNetwork {
    fn quantizers(&self) -> Vec<&FakeQuantizer> {
        let mut q: Vec<&FakeQuantizer> = self.input_act.iter().collect();
        q.extend(self.stem.quantizers());
        q.extend(self.stem_bn.quantizers());
        q.extend(self.stem_act.iter());
        for c in &self.cells {
            q.extend(c.quantizers());
        }
        q.extend(self.gap_act.iter());
        q.extend(self.classifier.wq.iter());
        q
    }
}
