//! The candidate ops and cells of the evaluation network as graph nodes.

use burn::tensor::Tensor;
use qdarts_frozen::{Node, PoolKind};
use qdarts_ops::candidates::{
    CandidateOp, PoolKind as OpPool, QDilConv, QFactorizedReduce, QStdConv,
};
use qdarts_ops::network::Preprocess;

use super::{FreezeError, Freezer, floats};
use crate::network::EvalCell;

impl Freezer<'_> {
    pub(super) fn std_conv(
        &mut self,
        path: &str,
        op: &QStdConv,
        input: usize,
    ) -> Result<usize, FreezeError> {
        let out = self.act(&op.act, path)?;
        let c = op.conv.weight.val().dims()[0];
        self.conv(&format!("{path}.conv"), input, true, &op.conv, Some((&op.bn, 0..c)), 0, out)
    }

    pub(super) fn reduce(
        &mut self,
        path: &str,
        op: &QFactorizedReduce,
        input: usize,
    ) -> Result<usize, FreezeError> {
        let out = self.act(&op.act, path)?;
        let c1 = op.conv1.weight.val().dims()[0];
        let c2 = op.conv2.weight.val().dims()[0];
        let a = self.conv(
            &format!("{path}.conv1"),
            input,
            true,
            &op.conv1,
            Some((&op.bn, 0..c1)),
            0,
            out,
        )?;
        let b = self.conv(
            &format!("{path}.conv2"),
            input,
            true,
            &op.conv2,
            Some((&op.bn, c1..c1 + c2)),
            1,
            out,
        )?;
        self.merge(&[a, b], out, false, path)
    }

    pub(super) fn dil(
        &mut self,
        path: &str,
        op: &QDilConv,
        input: usize,
    ) -> Result<usize, FreezeError> {
        let mid = self.act(&op.dw_act, &format!("{path}.dw"))?;
        let dw = self.conv(&format!("{path}.dw"), input, true, &op.dw, None, 0, mid)?;
        let out = self.act(&op.act, path)?;
        let c = op.pw.weight.val().dims()[0];
        self.conv(&format!("{path}.pw"), dw, false, &op.pw, Some((&op.bn, 0..c)), 0, out)
    }

    pub(super) fn op(
        &mut self,
        path: &str,
        op: &CandidateOp,
        input: usize,
    ) -> Result<usize, FreezeError> {
        match op {
            CandidateOp::Identity(_) => Ok(input),
            CandidateOp::Zero(z) => {
                let out = self.act(&z.act, path)?;
                Ok(self.push(Node::Zero { input, stride: z.stride(), out }, out))
            }
            CandidateOp::Pool(p) => {
                let kind = match p.kind {
                    OpPool::Max => PoolKind::Max,
                    OpPool::Avg => PoolKind::Avg,
                };
                let g = self.grids[input];
                let pooled = self
                    .push(Node::Pool { input, kind, kernel: 3, stride: p.stride(), padding: 1 }, g);
                let out = self.act(&p.act, path)?;
                let (w, b) = p.bn.folded(&Tensor::<4>::zeros([1, 1, 1, 1], self.device));
                let (w, b) = (floats(w, path)?, floats(b, path)?);
                let c = w.len();
                let name = format!("{path}.bn");
                self.conv_node(
                    &name,
                    pooled,
                    false,
                    [c, 1, 1, 1],
                    vec![1; c],
                    &|_| 1.0,
                    &w,
                    &b,
                    ([1, 1], [0, 0], 1, c, 0),
                    (out, 8),
                )
            }
            CandidateOp::Reduce(r) => self.reduce(path, r, input),
            CandidateOp::Sep(s) => {
                let a = self.dil(&format!("{path}.op1"), &s.op1, input)?;
                self.dil(&format!("{path}.op2"), &s.op2, a)
            }
            CandidateOp::Dil(d) => self.dil(path, d, input),
            CandidateOp::Fac(f) => {
                let mid = self.act(&f.mid, &format!("{path}.conv1"))?;
                let a = self.conv(&format!("{path}.conv1"), input, true, &f.conv1, None, 0, mid)?;
                let out = self.act(&f.act, path)?;
                let c = f.conv2.weight.val().dims()[0];
                self.conv(&format!("{path}.conv2"), a, false, &f.conv2, Some((&f.bn, 0..c)), 0, out)
            }
        }
    }

    pub(super) fn cell(
        &mut self,
        i: usize,
        cell: &EvalCell,
        s0: usize,
        s1: usize,
    ) -> Result<usize, FreezeError> {
        let path = format!("cells.{i}");
        let p0 = match &cell.preproc0 {
            Preprocess::Reduce(r) => self.reduce(&format!("{path}.preproc0"), r, s0)?,
            Preprocess::Conv(c) => self.std_conv(&format!("{path}.preproc0"), c, s0)?,
        };
        let p1 = self.std_conv(&format!("{path}.preproc1"), &cell.preproc1, s1)?;
        let mut states = vec![p0, p1];
        let mut k = 0;
        for (n, (add, &count)) in cell.adds.iter().zip(&cell.per_node).enumerate() {
            let mut terms = Vec::new();
            for _ in 0..count {
                let v =
                    self.op(&format!("{path}.ops.{k}"), &cell.ops[k], states[cell.inputs[k]])?;
                terms.push(v);
                k += 1;
            }
            let what = format!("{path}.nodes.{}", n + 2);
            let out = self.act(&add.act, &what)?;
            states.push(self.merge(&terms, out, true, &what)?);
        }
        let out = self.act(&cell.concat.act, &format!("{path}.concat"))?;
        let ins: Vec<usize> = cell.concat_idx.iter().map(|&j| states[j]).collect();
        self.merge(&ins, out, false, &format!("{path}.concat"))
    }
}
