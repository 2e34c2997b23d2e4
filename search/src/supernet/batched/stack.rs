//! Building a [`BatchedCell`] from the per-edge cell it batches (stacking each edge's weights
//! and running statistics) and writing it back (each edge's slice).

use burn::module::Param;
use burn::tensor::Tensor;
use qdarts_genotypes::Primitive;
use qdarts_ops::candidates::{CandidateOp, Ctx, QBatchNorm, QDilConv, QPoolBN, QuantSites};
use qdarts_ops::qconfig::QuantConfig;
use qdarts_ops::quant::SpecError;

use super::super::cell::SearchCell;
use super::super::waves::{Wave, waves};
use super::{BatchError, BatchedCell, Slot, StackedConv, StackedReduce, StackedStage, WaveOps};

/// A BN of the stacked channels holding each edge's running statistics.
fn stacked_bn(bns: &[&QBatchNorm], path: &str) -> Result<QBatchNorm, SpecError> {
    let mean = Tensor::cat(bns.iter().map(|b| b.running_mean.value()).collect(), 0);
    let var = Tensor::cat(bns.iter().map(|b| b.running_var.value()).collect(), 0);
    let cfg = QuantConfig::float();
    let device = mean.device();
    let bn = QBatchNorm::new(mean.dims()[0], false, &Ctx::new(&cfg, "bn", path, &device))?;
    bn.running_mean.set(mean);
    bn.running_var.set(var);
    Ok(bn)
}

fn stacked(ws: Vec<Tensor<4>>) -> Param<Tensor<4>> {
    Param::from_tensor(Tensor::cat(ws, 0).detach())
}

impl StackedStage {
    fn new(ops: &[&QDilConv], path: &str) -> Result<Self, SpecError> {
        let o = ops[0].dw.options();
        let bns: Vec<&QBatchNorm> = ops.iter().map(|op| &op.bn).collect();
        Ok(StackedStage {
            dw: stacked(ops.iter().map(|op| op.dw.weight.val()).collect()),
            pw: stacked(ops.iter().map(|op| op.pw.weight.val()).collect()),
            bn: stacked_bn(&bns, path)?,
            geometry: [o.stride[0], o.padding[0].0, o.dilation[0]],
            edges: ops.len(),
        })
    }

    /// Edge `j`'s slices into `op`.
    fn write_into(&self, op: &mut QDilConv, j: usize) {
        slice_into(&mut op.dw.weight, &self.dw, j);
        slice_into(&mut op.pw.weight, &self.pw, j);
        bn_slice_into(&op.bn, &self.bn, j);
    }
}

/// Edge `j`'s slice of the stacked `all` (edge after edge) as `p`'s value, under `p`'s id.
fn slice_into(p: &mut Param<Tensor<4>>, all: &Param<Tensor<4>>, j: usize) {
    let c = p.val().dims()[0];
    *p = Param::initialized(p.id, all.val().narrow(0, j * c, c).detach().require_grad());
}

/// Edge `j`'s slice of the stacked BN's running statistics into `to` (`j` 0 and a BN of
/// `to`'s size: a copy).
fn bn_slice_into(to: &QBatchNorm, from: &QBatchNorm, j: usize) {
    let c = to.running_mean.value().dims()[0];
    to.running_mean.set(from.running_mean.value().narrow(0, j * c, c));
    to.running_var.set(from.running_var.value().narrow(0, j * c, c));
}

impl WaveOps {
    fn new(
        cell: &SearchCell,
        wave: &Wave,
        primitives: &[Primitive],
        path: &str,
    ) -> Result<Self, BatchError> {
        let (mut convs, mut pools, mut reduce, mut slots) = (vec![], vec![], None, vec![]);
        let edge_ops = |p: usize| wave.edges.iter().map(move |&k| &cell.edges[k].ops[p]);
        for (p, primitive) in primitives.iter().enumerate() {
            let at = format!("{path}.{primitive}");
            let first = &cell.edges[wave.edges[0]].ops[p];
            let slot = match first {
                CandidateOp::Zero(_) => Slot::Zero,
                CandidateOp::Identity(_) => Slot::Identity,
                CandidateOp::Sep(_) | CandidateOp::Dil(_) => {
                    let mut stages: Vec<Vec<&QDilConv>> = vec![];
                    for op in edge_ops(p) {
                        let parts = match op {
                            CandidateOp::Sep(o) => vec![&o.op1, &o.op2],
                            CandidateOp::Dil(o) => vec![o],
                            _ => unreachable!("one primitive is one kind of op on every edge"),
                        };
                        stages.resize_with(parts.len(), Vec::new);
                        for (s, part) in stages.iter_mut().zip(parts) {
                            s.push(part);
                        }
                    }
                    let stages = stages
                        .iter()
                        .enumerate()
                        .map(|(i, ops)| StackedStage::new(ops, &format!("{at}.op{}", i + 1)))
                        .collect::<Result<_, _>>()?;
                    convs.push(StackedConv { stages });
                    Slot::Conv(convs.len() - 1)
                }
                CandidateOp::Reduce(_) => {
                    let frs: Vec<_> = edge_ops(p)
                        .map(|op| match op {
                            CandidateOp::Reduce(fr) => fr,
                            _ => unreachable!("one primitive is one kind of op on every edge"),
                        })
                        .collect();
                    let bns: Vec<&QBatchNorm> = frs.iter().map(|fr| &fr.bn).collect();
                    reduce = Some(StackedReduce {
                        conv1: stacked(frs.iter().map(|fr| fr.conv1.weight.val()).collect()),
                        conv2: stacked(frs.iter().map(|fr| fr.conv2.weight.val()).collect()),
                        bn: stacked_bn(&bns, &format!("{at}.bn"))?,
                        edges: frs.len(),
                    });
                    Slot::Reduce
                }
                CandidateOp::Pool(_) => {
                    let index = pools.len() / wave.sources.len();
                    // The first edge reading each source stands for all of them.
                    for s in 0..wave.sources.len() {
                        let k = wave.edges[s * wave.per_source()];
                        let CandidateOp::Pool(op) = &cell.edges[k].ops[p] else {
                            unreachable!("one primitive is one kind of op on every edge")
                        };
                        pools.push(pool_copy(op, &format!("{at}.source{s}"))?);
                    }
                    Slot::Pool(index)
                }
                CandidateOp::Fac(_) => return Err(BatchError::Primitive(*primitive)),
            };
            slots.push(slot);
        }
        Ok(WaveOps { convs, pools, reduce, slots })
    }
}

/// A pool – BN with `op`'s kind, stride and running statistics, and state of its own.
fn pool_copy(op: &QPoolBN, path: &str) -> Result<QPoolBN, SpecError> {
    let cfg = QuantConfig::float();
    let mean = op.bn.running_mean.value();
    let device = mean.device();
    let ctx = Ctx::new(&cfg, "pool", path, &device);
    let copy = QPoolBN::new(op.kind, mean.dims()[0], op.stride(), false, &ctx)?;
    bn_slice_into(&copy.bn, &op.bn, 0);
    Ok(copy)
}

impl BatchedCell {
    /// The batched form of `cell`'s edges (built over `primitives`), with copies of their
    /// weights and running statistics; the input preprocessing stays `cell`'s.
    ///
    /// # Errors
    /// If `cell` has quantizers, partial channels or a candidate with no batched form.
    pub fn from_cell(cell: &SearchCell, primitives: &[Primitive]) -> Result<Self, BatchError> {
        let quantizers = cell.quantizers().len();
        if quantizers > 0 {
            return Err(BatchError::Quantized(quantizers));
        }
        if let Some(e) = cell.edges.iter().find(|e| e.partial > 1) {
            return Err(BatchError::Partial(e.partial));
        }
        if primitives.iter().all(|p| *p == Primitive::None) {
            return Err(BatchError::Primitive(Primitive::None));
        }
        let waves = waves(cell.nodes)
            .iter()
            .enumerate()
            .map(|(w, wave)| WaveOps::new(cell, wave, primitives, &format!("waves.{w}")))
            .collect::<Result<_, _>>()?;
        Ok(BatchedCell { waves, nodes: cell.nodes })
    }

    /// Writes the batched cell's weights and running statistics back into `cell`, the cell it
    /// was built from (or one of the same shape): each edge's slice of every stacked tensor,
    /// and a pool's statistics to every edge that reads its source. The per-edge cell is the
    /// form records and checkpoints name; this makes it the batched cell's storage.
    pub fn write_into(&self, cell: &mut SearchCell) {
        for (wave, ops) in waves(self.nodes).iter().zip(&self.waves) {
            for (p, slot) in ops.slots.iter().enumerate() {
                for (j, &k) in wave.edges.iter().enumerate() {
                    match (slot, &mut cell.edges[k].ops[p]) {
                        (Slot::Conv(i), CandidateOp::Sep(op)) => {
                            for (stage, part) in
                                ops.convs[*i].stages.iter().zip([&mut op.op1, &mut op.op2])
                            {
                                stage.write_into(part, j);
                            }
                        }
                        (Slot::Conv(i), CandidateOp::Dil(op)) => {
                            ops.convs[*i].stages[0].write_into(op, j)
                        }
                        (Slot::Reduce, CandidateOp::Reduce(fr)) => {
                            let r = ops.reduce.as_ref().expect("a Reduce slot has its op");
                            slice_into(&mut fr.conv1.weight, &r.conv1, j);
                            slice_into(&mut fr.conv2.weight, &r.conv2, j);
                            bn_slice_into(&fr.bn, &r.bn, j);
                        }
                        (Slot::Pool(i), CandidateOp::Pool(op)) => {
                            let shared = &ops.pools[i * wave.sources.len() + wave.source_of[j]];
                            bn_slice_into(&op.bn, &shared.bn, 0);
                        }
                        (Slot::Zero | Slot::Identity, _) => {}
                        _ => unreachable!("the batched cell was built from a cell of this shape"),
                    }
                }
            }
        }
    }
}
