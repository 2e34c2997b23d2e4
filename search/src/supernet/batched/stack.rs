//! Building a [`BatchedCell`] from the per-edge cell it batches (stacking each edge's weights
//! and running statistics) and writing it back (each edge's slice).

use burn::module::Param;
use burn::tensor::Tensor;
use qdarts_genotypes::Primitive;
use qdarts_ops::candidates::{CandidateOp, Ctx, QBatchNorm, QDilConv, QFactorizedReduce, QPoolBN};
use qdarts_ops::network::Preprocess;
use qdarts_ops::qconfig::QuantConfig;
use qdarts_ops::quant::{BitMix, FakeQuantizer};

use super::super::cell::SearchCell;
use super::super::waves::{Wave, waves};
use super::bank::stack_sites;
use super::bits::RowMix;
use super::{BankKind, BankStage, BatchError, BatchedCell, ConvBank, Slot, StackedReduce, WaveOps};

/// A BN of the stacked channels holding each edge's running statistics, and where the
/// edges' multipliers are quantized, their quantizers as the rows of one.
pub(super) fn stacked_bn(bns: &[&QBatchNorm], path: &str) -> Result<QBatchNorm, BatchError> {
    let mean = Tensor::cat(bns.iter().map(|b| b.running_mean.value()).collect(), 0);
    let var = Tensor::cat(bns.iter().map(|b| b.running_var.value()).collect(), 0);
    let cfg = QuantConfig::float();
    let device = mean.device();
    let mut bn = QBatchNorm::new(mean.dims()[0], false, &Ctx::new(&cfg, "bn", path, &device))?;
    bn.running_mean.set(mean);
    bn.running_var.set(var);
    let multipliers = bns.iter().map(|b| b.wq.as_ref()).collect();
    bn.wq = stack_sites(multipliers, &format!("{path}.weight"))?;
    Ok(bn)
}

fn stacked(ws: Vec<Tensor<4>>) -> Param<Tensor<4>> {
    Param::from_tensor(Tensor::cat(ws, 0).detach())
}

/// Edge `j`'s slice of the stacked `all` (edge after edge) as `p`'s value, under `p`'s id.
fn slice_into(p: &mut Param<Tensor<4>>, all: &Param<Tensor<4>>, j: usize) {
    let c = p.val().dims()[0];
    *p = Param::initialized(p.id, all.val().narrow(0, j * c, c).detach().require_grad());
}

/// Edge `j`'s slice of the stacked BN's running statistics, and its row of the multipliers'
/// quantizer, into `to`.
fn bn_slice_into(to: &QBatchNorm, from: &QBatchNorm, j: usize) {
    let c = to.running_mean.value().dims()[0];
    to.running_mean.set(from.running_mean.value().narrow(0, j * c, c));
    to.running_var.set(from.running_var.value().narrow(0, j * c, c));
    row_into(&from.wq, j, &to.wq);
}

impl WaveOps {
    fn new(
        cell: &SearchCell,
        wave: &Wave,
        primitives: &[Primitive],
        path: &str,
    ) -> Result<Self, BatchError> {
        let (mut pools, mut reduce, mut slots, mut pool_acts) = (vec![], None, vec![], vec![]);
        let (mut seps, mut dils) = (vec![], vec![]);
        let edge_ops = |p: usize| wave.edges.iter().map(move |&k| &cell.edges[k].ops[p]);
        for (p, primitive) in primitives.iter().enumerate() {
            let at = format!("{path}.{primitive}");
            let first = &cell.edges[wave.edges[0]].ops[p];
            let slot = match first {
                CandidateOp::Zero(_) => Slot::Zero,
                CandidateOp::Identity(_) => Slot::Identity,
                CandidateOp::Sep(_) => {
                    seps.push(p);
                    Slot::Conv(0)
                }
                CandidateOp::Dil(_) => {
                    dils.push(p);
                    Slot::Conv(0)
                }
                CandidateOp::Reduce(_) => {
                    let frs: Vec<_> = edge_ops(p)
                        .map(|op| match op {
                            CandidateOp::Reduce(fr) => fr,
                            _ => unreachable!("one primitive is one kind of op on every edge"),
                        })
                        .collect();
                    let bns: Vec<&QBatchNorm> = frs.iter().map(|fr| &fr.bn).collect();
                    let site = |f: fn(&QFactorizedReduce) -> Option<&FakeQuantizer>, name: &str| {
                        stack_sites(frs.iter().map(|fr| f(fr)).collect(), &format!("{at}.{name}"))
                    };
                    let row_ops = wave.edges.iter().map(|e| e * primitives.len() + p);
                    let mix = |f: fn(&QFactorizedReduce) -> Option<&BitMix>, name: &str| {
                        let sites = frs.iter().map(|fr| f(fr)).collect();
                        RowMix::stack(sites, row_ops.clone().collect(), &format!("{at}.{name}"))
                    };
                    reduce = Some(StackedReduce {
                        conv1: stacked(frs.iter().map(|fr| fr.conv1.weight.val()).collect()),
                        conv2: stacked(frs.iter().map(|fr| fr.conv2.weight.val()).collect()),
                        bn: stacked_bn(&bns, &format!("{at}.bn"))?,
                        quant: [
                            site(|fr| fr.conv1.wq.as_ref(), "conv1.weight")?,
                            site(|fr| fr.conv2.wq.as_ref(), "conv2.weight")?,
                            site(|fr| fr.act.as_ref(), "act")?,
                        ],
                        mixes: [
                            mix(|fr| fr.conv1.wmix.as_ref(), "conv1.weight")?,
                            mix(|fr| fr.conv2.wmix.as_ref(), "conv2.weight")?,
                            mix(|fr| fr.act_mix.as_ref(), "act")?,
                        ],
                        edges: frs.len(),
                    });
                    Slot::Reduce
                }
                CandidateOp::Pool(_) => {
                    // The first edge reading each source stands for all of them.
                    pools.push(pool_stack(cell, wave, p, &at)?);
                    pool_acts.push(pool_act(cell, wave, p, &at)?);
                    Slot::Pool(pools.len() - 1)
                }
                CandidateOp::Fac(_) => return Err(BatchError::Primitive(*primitive)),
            };
            slots.push(slot);
        }
        // The bank's kinds: separable first, then dilated, each in the primitives' order.
        for (i, &p) in seps.iter().chain(&dils).enumerate() {
            slots[p] = Slot::Conv(i);
        }
        let kinds = (&seps[..], &dils[..]);
        let bank = conv_bank(cell, wave, kinds, primitives.len(), &format!("{path}.bank"))?;
        let acts = wave.edges.iter().map(|&k| cell.edges[k].act.as_ref()).collect();
        let edge_act = stack_sites(acts, &format!("{path}.act"))?;
        let zeros = slots.iter().position(|s| *s == Slot::Zero).map(|p| {
            let acts = wave.edges.iter().map(|&k| match &cell.edges[k].ops[p] {
                CandidateOp::Zero(z) => z.act.as_ref(),
                _ => unreachable!("one primitive is one kind of op on every edge"),
            });
            stack_sites(acts.collect(), &format!("{path}.none.act"))
        });
        let zero_act = zeros.transpose()?.flatten();
        Ok(WaveOps { bank, pools, reduce, pool_acts, edge_act, zero_act, slots })
    }
}

/// The bank of the separable (`seps`) and dilated (`dils`) candidates of `wave`, by primitive
/// index (of `k`); none where there are neither.
fn conv_bank(
    cell: &SearchCell,
    wave: &Wave,
    (seps, dils): (&[usize], &[usize]),
    k: usize,
    path: &str,
) -> Result<Option<ConvBank>, BatchError> {
    if seps.is_empty() && dils.is_empty() {
        return Ok(None);
    }
    // Each kind's stage of every edge of the wave.
    let stage = |p: usize, second: bool| -> Vec<&QDilConv> {
        let edge_op = |k: usize| match &cell.edges[k].ops[p] {
            CandidateOp::Sep(o) if second => &o.op2,
            CandidateOp::Sep(o) => &o.op1,
            CandidateOp::Dil(o) => o,
            _ => unreachable!("one primitive is one kind of op on every edge"),
        };
        wave.edges.iter().map(|&k| edge_op(k)).collect()
    };
    let kind = |p: usize, op: &QDilConv| {
        let o = op.dw.options();
        BankKind {
            primitive: p,
            kernel: op.dw.weight.val().dims()[2],
            dilation: o.dilation[0],
            padding: o.padding[0].0,
        }
    };
    let build = |ps: Vec<usize>, second: bool, at: &str| -> Result<BankStage, BatchError> {
        let ops: Vec<Vec<&QDilConv>> = ps.iter().map(|&p| stage(p, second)).collect();
        let kinds = ps.iter().zip(&ops).map(|(&p, o)| kind(p, o[0])).collect();
        BankStage::new(&ops, kinds, (&wave.edges, k), at)
    };
    let all: Vec<usize> = seps.iter().chain(dils).copied().collect();
    let first = build(all, false, &format!("{path}.op1"))?;
    let second = (!seps.is_empty())
        .then(|| build(seps.to_vec(), true, &format!("{path}.op2")))
        .transpose()?;
    Ok(Some(ConvBank { first, second }))
}

/// Edge `j`'s weights and statistics of kind `i` of `stage` into `op`.
fn bank_into(stage: &BankStage, i: usize, j: usize, op: &mut QDilConv) {
    let g = stage.group_of(i);
    let dw = stage.filters(&stage.dw[g].val(), i, j);
    op.dw.weight = Param::initialized(op.dw.weight.id, dw.detach().require_grad());
    let pw = stage.rows(stage.pw.val(), i, j);
    op.pw.weight = Param::initialized(op.pw.weight.id, pw.detach().require_grad());
    let (q, row) = (&stage.quant, i * stage.edges + j);
    // The row of kind `i`, edge `j` among its dilation group's.
    let in_group = (i - stage.groups[g].kinds.start) * stage.edges + j;
    bn_slice_into(&op.bn, &stage.bn, row);
    if let (Some(all), Some(site)) = (q.dw.get(g), &op.dw.wq) {
        all.row_into(in_group, site);
    }
    row_into(&q.dw_act, row, &op.dw_act);
    row_into(&q.pw, row, &op.pw.wq);
    row_into(&q.act, row, &op.act);
    let m = &stage.mixes;
    if let (Some(all), Some(site)) = (m.dw.get(g), &op.dw.wmix) {
        all.mix.row_into(in_group, site);
    }
    RowMix::row_into(&m.dw_act, row, &op.dw_act_mix);
    RowMix::row_into(&m.pw, row, &op.pw.wmix);
    RowMix::row_into(&m.act, row, &op.act_mix);
}

/// Row `r` of a stacked quantizer into its site's, where both are quantized.
fn row_into(all: &Option<FakeQuantizer>, r: usize, site: &Option<FakeQuantizer>) {
    if let (Some(all), Some(site)) = (all, site) {
        all.row_into(r, site);
    }
}

/// Primitive `p`'s pool on edge `j` of `wave`.
fn pool_of<'a>(cell: &'a SearchCell, wave: &Wave, p: usize, j: usize) -> &'a QPoolBN {
    match &cell.edges[wave.edges[j]].ops[p] {
        CandidateOp::Pool(op) => op,
        _ => unreachable!("one primitive is one kind of op on every edge"),
    }
}

/// A quantizer of primitive `p`'s pools in `wave` (`site` of each pool): a row per source,
/// from the first edge that reads it, standing for every edge that does.
fn per_source(
    cell: &SearchCell,
    wave: &Wave,
    p: usize,
    site: fn(&QPoolBN) -> Option<&FakeQuantizer>,
    path: &str,
) -> Result<Option<FakeQuantizer>, BatchError> {
    let per = wave.per_source();
    let at = |j: usize| site(pool_of(cell, wave, p, j));
    if (0..wave.edges.len()).any(|j| at(j).is_some() != at(0).is_some()) {
        return Err(BatchError::Quantizers(path.to_string()));
    }
    let firsts = (0..wave.sources.len()).map(|s| at(s * per)).collect();
    let Some(mut q) = stack_sites(firsts, path)? else { return Ok(None) };
    for s in 0..wave.sources.len() {
        let others = (1..per).filter_map(|r| at(s * per + r)).map(|q| q.path().to_string());
        q = q.with_row_aliases(s, others.collect());
    }
    Ok(Some(q))
}

/// The output quantizer of primitive `p`'s pools in `wave` ([`per_source`]).
fn pool_act(
    cell: &SearchCell,
    wave: &Wave,
    p: usize,
    path: &str,
) -> Result<Option<FakeQuantizer>, BatchError> {
    per_source(cell, wave, p, |op| op.act.as_ref(), &format!("{path}.act"))
}

/// Primitive `p`'s pool – BN in `wave`, over the channels of its sources side by side: the
/// kind and stride of the pools, each source's running statistics in its slice (from the
/// first edge that reads it), and the BatchNorm's multiplier quantizer a row per source
/// ([`per_source`]).
fn pool_stack(cell: &SearchCell, wave: &Wave, p: usize, path: &str) -> Result<QPoolBN, BatchError> {
    let per = wave.per_source();
    let firsts: Vec<&QPoolBN> =
        (0..wave.sources.len()).map(|s| pool_of(cell, wave, p, s * per)).collect();
    let bns: Vec<&QBatchNorm> = firsts.iter().map(|op| &op.bn).collect();
    let bn = stacked_bn(&bns, &format!("{path}.bn"))?;
    let mean = bn.running_mean.value();
    let (device, channels) = (mean.device(), mean.dims()[0]);
    let cfg = QuantConfig::float();
    let ctx = Ctx::new(&cfg, "pool", path, &device);
    let mut stack = QPoolBN::new(firsts[0].kind, channels, firsts[0].stride(), false, &ctx)?;
    stack.bn.running_mean.set(mean);
    stack.bn.running_var.set(bn.running_var.value());
    stack.bn.wq = per_source(cell, wave, p, |op| op.bn.wq.as_ref(), &format!("{path}.bn.weight"))?;
    Ok(stack)
}

/// A wave lays its source states side by side on one grid: the quantizers that make them
/// (the inputs' preprocessing, the nodes' adds) must be alike.
fn check_state_grids(cell: &SearchCell) -> Result<(), BatchError> {
    let p0 = match &cell.preproc0 {
        Preprocess::Reduce(op) => op.act.as_ref(),
        Preprocess::Conv(op) => op.act.as_ref(),
    };
    let mut makers = vec![p0, cell.preproc1.act.as_ref()];
    makers.extend(cell.adds.iter().map(|a| a.act.as_ref()));
    let spec = |q: Option<&FakeQuantizer>| q.map(|q| *q.spec());
    if makers.iter().any(|q| spec(*q) != spec(makers[0])) {
        return Err(BatchError::Quantizers(
            "the cell's states (preprocessing and node adds)".into(),
        ));
    }
    Ok(())
}

impl BatchedCell {
    /// The batched form of `cell`'s edges (built over `primitives`), with copies of their
    /// weights and running statistics; the input preprocessing stays `cell`'s.
    ///
    /// # Errors
    /// If `cell` has quantizers that do not stack or a candidate with no batched form.
    pub fn from_cell(cell: &SearchCell, primitives: &[Primitive]) -> Result<Self, BatchError> {
        check_state_grids(cell)?;
        let partial = cell.edges.first().map_or(1, |e| e.partial);
        if primitives.iter().all(|p| *p == Primitive::None) {
            return Err(BatchError::Primitive(Primitive::None));
        }
        let waves = waves(cell.nodes)
            .iter()
            .enumerate()
            .map(|(w, wave)| WaveOps::new(cell, wave, primitives, &format!("waves.{w}")))
            .collect::<Result<_, _>>()?;
        let mixes = cell.edges.iter().map(|e| e.mix.as_ref()).collect();
        let mix = stack_sites(mixes, "mix")?;
        Ok(BatchedCell { waves, mix, nodes: cell.nodes, partial })
    }

    /// Writes the batched cell's weights and running statistics back into `cell`, the cell it
    /// was built from (or one of the same shape): each edge's slice of every stacked tensor,
    /// and a pool's statistics of a source to every edge that reads it. The per-edge cell is the
    /// form records and checkpoints name; this makes it the batched cell's storage.
    pub fn write_into(&self, cell: &mut SearchCell) {
        for (k, edge) in cell.edges.iter().enumerate() {
            row_into(&self.mix, k, &edge.mix);
        }
        for (wave, ops) in waves(self.nodes).iter().zip(&self.waves) {
            let zero = ops.slots.iter().position(|s| *s == Slot::Zero);
            for (j, &k) in wave.edges.iter().enumerate() {
                row_into(&ops.edge_act, j, &cell.edges[k].act);
                if let Some(CandidateOp::Zero(z)) = zero.map(|p| &cell.edges[k].ops[p]) {
                    row_into(&ops.zero_act, j, &z.act);
                }
            }
            for (p, slot) in ops.slots.iter().enumerate() {
                for (j, &k) in wave.edges.iter().enumerate() {
                    match (slot, &mut cell.edges[k].ops[p]) {
                        (Slot::Conv(i), CandidateOp::Sep(op)) => {
                            let bank = ops.bank.as_ref().expect("a Conv slot has its bank");
                            bank_into(&bank.first, *i, j, &mut op.op1);
                            let second = bank.second.as_ref().expect("separable kinds have two");
                            bank_into(second, *i, j, &mut op.op2);
                        }
                        (Slot::Conv(i), CandidateOp::Dil(op)) => {
                            let bank = ops.bank.as_ref().expect("a Conv slot has its bank");
                            bank_into(&bank.first, *i, j, op);
                        }
                        (Slot::Reduce, CandidateOp::Reduce(fr)) => {
                            let r = ops.reduce.as_ref().expect("a Reduce slot has its op");
                            slice_into(&mut fr.conv1.weight, &r.conv1, j);
                            slice_into(&mut fr.conv2.weight, &r.conv2, j);
                            bn_slice_into(&fr.bn, &r.bn, j);
                            let [q1, q2, act] = &r.quant;
                            row_into(q1, j, &fr.conv1.wq);
                            row_into(q2, j, &fr.conv2.wq);
                            row_into(act, j, &fr.act);
                            let [m1, m2, m_act] = &r.mixes;
                            RowMix::row_into(m1, j, &fr.conv1.wmix);
                            RowMix::row_into(m2, j, &fr.conv2.wmix);
                            RowMix::row_into(m_act, j, &fr.act_mix);
                        }
                        (Slot::Pool(i), CandidateOp::Pool(op)) => {
                            bn_slice_into(&op.bn, &ops.pools[*i].bn, wave.source_of[j]);
                            row_into(&ops.pool_acts[*i], wave.source_of[j], &op.act);
                        }
                        (Slot::Zero | Slot::Identity, _) => {}
                        _ => unreachable!("the batched cell was built from a cell of this shape"),
                    }
                }
            }
        }
    }
}
