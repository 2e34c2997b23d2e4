//! One stage of a bank (depthwise – 1×1 – BN over every kind and edge of a wave): merged on
//! the CubeCL runtimes, kind by kind on flex.

use std::ops::Range;

use burn::module::{Module, Param};
use burn::tensor::ops::ConvOptions;
use burn::tensor::{Tensor, TensorData, s};
use qdarts_kernels::depthwise_conv::conv2d;
use qdarts_kernels::direct_conv::{GroupInputs, Inset, conv2d_reading_inset, direct_available};
use qdarts_kernels::split::split;
use qdarts_ops::candidates::{Bias, Ctx, Pass, QBatchNorm, QDilConv, QTensor};
use qdarts_ops::qconfig::QuantConfig;
use qdarts_ops::quant::{BitMix, FakeQuantizer, Grid, SpecError};

use super::super::BatchError;
use super::super::bits::{CellBits, RowMix};
use super::super::reduce::grouped_pointwise;
use super::weights::StageWeights;
use super::{BankKind, DwGroup, Input, StageMixes, StageQuant, quantize_or_mix, stack_sites};
use qdarts_kernels::cat::cat;

/// One stage of every kind of a bank: depthwise, 1×1, BN over the stacked edges of a wave.
#[derive(Module, Debug)]
pub struct BankStage {
    /// Depthwise filters per dilation group, `[G·E·C, 1, k, k]` (see [`DwGroup`]).
    pub dw: Vec<Param<Tensor<4>>>,
    /// 1×1 weights `[K·E·C, C, 1, 1]`, kind after kind, edge after edge.
    pub pw: Param<Tensor<4>>,
    /// BatchNorm of the `K·E·C` channels.
    pub bn: QBatchNorm,
    /// The stage's quantizers (none in a float cell).
    pub quant: StageQuant,
    /// The stage's mixes under a bit-width search.
    pub mixes: StageMixes,
    /// The stage's kinds, in the bank's order.
    #[module(skip)]
    pub kinds: Vec<BankKind>,
    /// The dilation groups, covering `kinds` in order.
    #[module(skip)]
    pub groups: Vec<DwGroup>,
    /// Stride of the depthwise convolutions.
    pub stride: usize,
    /// Edges `E`.
    pub edges: usize,
    /// Channels `C` of one edge.
    pub channels: usize,
}

/// The offset of a `k` filter centred in a `big` one.
fn centre(big: usize, k: usize) -> usize {
    (big - k) / 2
}

impl BankStage {
    /// The stage of `ops[kind][edge]`, whose kinds are `kinds` (same stride throughout, and
    /// within a dilation the same padding once centred); its edges are the cell's `edges`, of
    /// `k` candidates each (a bit-width search's rows are ops `edge·k + primitive`).
    pub fn new(
        ops: &[Vec<&QDilConv>],
        kinds: Vec<BankKind>,
        (edges_of, k): (&[usize], usize),
        path: &str,
    ) -> Result<Self, BatchError> {
        let first = ops[0][0];
        let [c, _, _, _] = first.dw.weight.val().dims();
        let edges = ops[0].len();
        let stride = first.dw.options().stride[0];
        let groups = dilation_groups(&kinds, path)?;
        let dw = groups
            .iter()
            .map(|g| {
                let filters = ops[g.kinds.clone()].iter().flat_map(|per_edge| {
                    per_edge.iter().map(|op| padded(op.dw.weight.val(), g.kernel))
                });
                Param::from_tensor(Tensor::cat(filters.collect(), 0).detach())
            })
            .collect();
        let all = || ops.iter().flatten();
        let bns: Vec<&QBatchNorm> = all().map(|op| &op.bn).collect();
        // A filter padded to the group's kernel counts its own taps.
        let counted = |mut q: FakeQuantizer, g: &DwGroup| {
            for (i, kind) in kinds[g.kinds.clone()].iter().enumerate() {
                for e in 0..edges {
                    q = q.with_row_numel(i * edges + e, c * kind.kernel * kind.kernel);
                }
            }
            q
        };
        // Each (kind, edge) row's op in the cell.
        let row_ops = |range: Range<usize>| -> Vec<usize> {
            let kinds = &kinds[range];
            kinds.iter().flat_map(|kind| edges_of.iter().map(|e| e * k + kind.primitive)).collect()
        };
        let (mut dw_q, mut dw_mix) = (Vec::new(), Vec::new());
        for g in &groups {
            let group = || ops[g.kinds.clone()].iter().flatten();
            let at = format!("{path}.dw.weight");
            let sites = group().map(|op| op.dw.wq.as_ref()).collect();
            dw_q.extend(stack_sites(sites, &at)?.map(|q| counted(q, g)));
            let mixes = group().map(|op| op.dw.wmix.as_ref()).collect();
            if let Some(mut m) = RowMix::stack(mixes, row_ops(g.kinds.clone()), &at)? {
                m.mix.quantizers = m.mix.quantizers.into_iter().map(|q| counted(q, g)).collect();
                dw_mix.push(m);
            }
        }
        let mix = |f: fn(&QDilConv) -> Option<&BitMix>, name: &str| {
            let sites = all().map(|op| f(op)).collect();
            RowMix::stack(sites, row_ops(0..kinds.len()), &format!("{path}.{name}"))
        };
        let mixes = StageMixes {
            dw: dw_mix,
            dw_act: mix(|op| op.dw_act_mix.as_ref(), "dw.act")?,
            pw: mix(|op| op.pw.wmix.as_ref(), "pw.weight")?,
            act: mix(|op| op.act_mix.as_ref(), "act")?,
        };
        let site = |f: fn(&QDilConv) -> Option<&FakeQuantizer>, name: &str| {
            stack_sites(all().map(|op| f(op)).collect(), &format!("{path}.{name}"))
        };
        let quant = StageQuant {
            dw: dw_q,
            dw_act: site(|op| op.dw_act.as_ref(), "dw.act")?,
            pw: site(|op| op.pw.wq.as_ref(), "pw.weight")?,
            act: site(|op| op.act.as_ref(), "act")?,
        };
        Ok(BankStage {
            quant,
            mixes,
            dw,
            pw: Param::from_tensor(
                Tensor::cat(all().map(|op| op.pw.weight.val()).collect(), 0).detach(),
            ),
            bn: super::super::stack::stacked_bn(&bns, &format!("{path}.bn"))?,
            kinds,
            groups,
            stride,
            edges,
            channels: c,
        })
    }

    /// Channels of one kind, `E·C`.
    pub(super) fn width(&self) -> usize {
        self.edges * self.channels
    }

    /// Kind `i`'s filters out of `all`, a tensor shaped as its group's `dw` (its value or its
    /// gradient): `[E·C, 1, k, k]`, the padding left out.
    pub fn kind_filters(&self, all: &Tensor<4>, i: usize) -> Tensor<4> {
        let group = &self.groups[self.group_of(i)];
        let (k, width) = (self.kinds[i].kernel, self.width());
        let off = centre(group.kernel, k);
        let row = (i - group.kinds.start) * width;
        all.clone().narrow(0, row, width).narrow(2, off, k).narrow(3, off, k)
    }

    /// Kind `i`'s filters for edge `j` out of `all` (as [`kind_filters`](Self::kind_filters)):
    /// `[C, 1, k, k]`.
    pub fn filters(&self, all: &Tensor<4>, i: usize, j: usize) -> Tensor<4> {
        self.kind_filters(all, i).narrow(0, j * self.channels, self.channels)
    }

    /// The dilation group of kind `i`.
    pub fn group_of(&self, i: usize) -> usize {
        self.groups.iter().position(|g| g.kinds.contains(&i)).expect("groups cover every kind")
    }

    /// Kind `i`'s rows of a `[K·E·C, …]` tensor (1×1 weights, BN statistics) for edge `j`.
    pub fn rows<const D: usize>(&self, all: Tensor<D>, i: usize, j: usize) -> Tensor<D> {
        all.narrow(0, (i * self.edges + j) * self.channels, self.channels)
    }

    fn options(&self, padding: usize, dilation: usize, groups: usize) -> ConvOptions<2> {
        ConvOptions::new([self.stride; 2], [padding; 2], [dilation; 2], groups)
    }

    /// Every kind at once, `[N, K·E·C, H', W']` out, from `x`: every kind's input side by
    /// side, or ([`Input::Sources`]) the wave's sources that every kind reads.
    pub(super) fn forward_merged(&self, x: Input, weights: StageWeights) -> QTensor {
        let width = self.width();
        // The groups are runs of consecutive kinds: each one's inputs, cut in one split.
        let mut by_group = match &x {
            Input::Kinds { x, .. } => {
                let sizes: Vec<usize> = self.groups.iter().map(|g| g.kinds.len() * width).collect();
                split(x.clone(), 1, &sizes)
            }
            Input::Sources { .. } => Vec::new(),
        }
        .into_iter();
        let outs: Vec<Tensor<4>> = self
            .groups
            .iter()
            .zip(weights.filters)
            .map(|(g, filters)| {
                let kinds = g.kinds.len();
                let options = self.options(g.padding, g.dilation, kinds * width);
                let (x, inputs, relu) = match &x {
                    // Every kind and edge reads its source in place.
                    Input::Sources { x, per, relu } => {
                        let sources = x.dims()[1] / self.channels;
                        let inner = self.channels;
                        (x.clone(), GroupInputs { sources, per: *per, inner }, *relu)
                    }
                    Input::Kinds { relu, .. } => {
                        let x = by_group.next().expect("one input per group");
                        (x, GroupInputs::own(options.groups), *relu)
                    }
                };
                conv2d_reading_inset(x, filters, options, inputs, relu, self.inset(g))
            })
            .collect();
        let y = match outs.len() {
            1 => outs.into_iter().next().expect("one"),
            _ => cat(outs, 1),
        };
        self.finish(y, weights.pw, weights.pass)
    }

    /// The stage after its depthwise convolutions `y` (every kind side by side): their
    /// quantizer (or mix), the 1×1 convolutions in `K·E` groups, the BatchNorm (its bias
    /// rounded to the accumulators' unit where quantized) and the output quantizer (or mix).
    fn finish(
        &self,
        y: Tensor<4>,
        (pw, w_grid): (Tensor<4>, Option<Grid>),
        pass: Pass<CellBits>,
    ) -> QTensor {
        let (q, m) = (&self.quant, &self.mixes);
        let (y, in_grid) = quantize_or_mix((&q.dw_act, &m.dw_act), y, pass);
        let y = grouped_pointwise(y, pw, self.kinds.len() * self.edges);
        let bias = self.bias(w_grid.as_ref(), in_grid.as_ref());
        let y = self.bn.forward_biased(y, bias, pass.quant);
        let (value, grid) = quantize_or_mix((&q.act, &m.act), y, pass);
        QTensor { value, grid }
    }

    /// The unit of the 1×1 convolutions' integer accumulators (`s_w` per output channel
    /// times its edge's input step), which the BatchNorm's bias is rounded to; none unless
    /// both are quantized and neither held (as [`QConv::forward_unit`](qdarts_ops::candidates::QConv::forward_unit)).
    fn bias(&self, w: Option<&Grid>, input: Option<&Grid>) -> Option<Bias> {
        let (w, input, q) = (w?, input?, self.quant.pw.as_ref()?);
        if w.is_held() || input.is_held() {
            return None;
        }
        // One input step per row (kind and edge), for its `C` channels.
        Some(Bias {
            factors: vec![w.step.clone().detach(), input.step.clone().detach()],
            round: q.spec().round(),
        })
    }

    /// 1 on the taps of each kind's own filter, 0 on its padding; none where no kind of the
    /// group is padded.
    pub(super) fn mask(&self, g: &DwGroup) -> Option<Tensor<4>> {
        let kinds = &self.kinds[g.kinds.clone()];
        if kinds.iter().all(|k| k.kernel == g.kernel) {
            return None;
        }
        let big = g.kernel;
        let mut values = Vec::with_capacity(kinds.len() * self.width() * big * big);
        for kind in kinds {
            let off = centre(big, kind.kernel);
            let inside = |t: usize| t >= off && t < off + kind.kernel;
            let plane: Vec<f32> = (0..big * big)
                .map(|t| if inside(t / big) && inside(t % big) { 1.0 } else { 0.0 })
                .collect();
            for _ in 0..self.width() {
                values.extend_from_slice(&plane);
            }
        }
        let rows = kinds.len() * self.width();
        let device = self.pw.val().device();
        Some(Tensor::from_data(TensorData::new(values, [rows, 1, big, big]), &device))
    }

    /// The group's leading kinds whose filters are padded, all by one margin (sep 3×3 before
    /// sep 5×5): the convolution skips their padding's taps.
    fn inset(&self, g: &DwGroup) -> Inset {
        let kinds = &self.kinds[g.kinds.clone()];
        let small = kinds[0].kernel;
        if small == g.kernel {
            return Inset::NONE;
        }
        let leading = kinds.iter().take_while(|k| k.kernel == small).count();
        Inset { channels: leading * self.width(), by: centre(g.kernel, small) }
    }

    /// Whether the convolution of `g`'s `filters` skips every padded kind's padding (the
    /// kernels run there, and the padded kinds are the inset ones): their gradient is 0
    /// there already, and the mask would only multiply it by 0 again.
    pub(super) fn skips_padding(&self, g: &DwGroup, filters: &Tensor<4>) -> bool {
        let padded = self.kinds[g.kinds.clone()].iter().filter(|k| k.kernel < g.kernel).count();
        direct_available(&filters.device(), filters.dtype())
            && self.inset(g).channels == padded * self.width()
    }

    /// Whether the stage has a quantizer (its BatchNorm's multiplier's included) or a bit-width
    /// search's mix.
    pub(super) fn quantized(&self) -> bool {
        let (q, m) = (&self.quant, &self.mixes);
        let bn = self.bn.wq.is_some();
        let quantized = !q.dw.is_empty() || q.dw_act.is_some() || q.pw.is_some() || q.act.is_some();
        let mixed = !m.dw.is_empty() || m.dw_act.is_some() || m.pw.is_some() || m.act.is_some();
        quantized || bn || mixed
    }

    /// Kind by kind (flex): `xs` each kind's input (or one input all read), each kind's output;
    /// in a quantized cell the depthwise convolutions kind by kind and the rest of the stage
    /// on every kind side by side ([`finish`](Self::finish), one output), since a quantizer
    /// of the stage sees every kind's tensor at once.
    pub(super) fn forward_per_kind(&self, xs: &[Tensor<4>], weights: StageWeights) -> Vec<QTensor> {
        let (width, e) = (self.width(), self.edges);
        let StageWeights { filters, pw, pass } = weights;
        let dws: Vec<Tensor<4>> = self
            .kinds
            .iter()
            .enumerate()
            .map(|(i, kind)| {
                let x = xs.get(i).unwrap_or(&xs[0]).clone();
                let filters = self.kind_filters(&filters[self.group_of(i)], i);
                conv2d(x, filters, self.options(kind.padding, kind.dilation, width))
            })
            .collect();
        if self.quantized() {
            return vec![self.finish(cat(dws, 1), pw, pass)];
        }
        let mut outs = Vec::with_capacity(self.kinds.len());
        let (mut means, mut vars) = (Vec::new(), Vec::new());
        for (i, y) in dws.into_iter().enumerate() {
            let y = grouped_pointwise(y, pw.0.clone().narrow(0, i * width, width), e);
            let part = self.bn_part(i * width, width).expect("a float BatchNorm builds");
            outs.push(QTensor::float(part.forward(y)));
            means.push(part.running_mean.value());
            vars.push(part.running_var.value());
        }
        self.bn.running_mean.set(Tensor::cat(means, 0));
        self.bn.running_var.set(Tensor::cat(vars, 0));
        outs
    }

    /// A BatchNorm of `len` of the stage's channels from `from`: their running statistics, the
    /// stage's mode.
    fn bn_part(&self, from: usize, len: usize) -> Result<QBatchNorm, SpecError> {
        let mean = self.bn.running_mean.value();
        let device = mean.device();
        let cfg = QuantConfig::float();
        let mut part = QBatchNorm::new(len, false, &Ctx::new(&cfg, "bn", "bank", &device))?;
        part.running_mean.set(mean.narrow(0, from, len));
        part.running_var.set(self.bn.running_var.value().narrow(0, from, len));
        part.training = self.bn.training.clone();
        Ok(part)
    }
}

/// `kinds`' dilation groups: runs of consecutive kinds of one dilation, each padded to its
/// largest kernel.
///
/// # Errors
/// Where a group's kinds do not line up once centred (`path` names the stage).
fn dilation_groups(kinds: &[BankKind], path: &str) -> Result<Vec<DwGroup>, BatchError> {
    let mut groups: Vec<DwGroup> = Vec::new();
    for (i, kind) in kinds.iter().enumerate() {
        match groups.last_mut() {
            Some(g) if g.dilation == kind.dilation => {
                g.kinds.end = i + 1;
                g.kernel = g.kernel.max(kind.kernel);
            }
            _ => groups.push(DwGroup {
                kinds: i..i + 1,
                kernel: kind.kernel,
                dilation: kind.dilation,
                padding: 0,
            }),
        }
    }
    for g in &mut groups {
        let k = &kinds[g.kinds.start];
        g.padding = k.padding + k.dilation * centre(g.kernel, k.kernel);
        let same = kinds[g.kinds.clone()]
            .iter()
            .all(|k| k.padding + k.dilation * centre(g.kernel, k.kernel) == g.padding);
        if !same {
            return Err(BatchError::Padding(path.to_string(), g.dilation));
        }
    }
    Ok(groups)
}

/// `w` `[C, 1, k, k]` centred in a `[C, 1, big, big]` of zeros.
fn padded(w: Tensor<4>, big: usize) -> Tensor<4> {
    let [c, _, k, _] = w.dims();
    if k == big {
        return w;
    }
    let off = centre(big, k);
    Tensor::zeros([c, 1, big, big], &w.device())
        .slice_assign(s![.., .., off..off + k, off..off + k], w)
}
