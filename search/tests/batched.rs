//! The batched cell (waves) against the per-edge cell it batches: the same output, the same
//! gradients of the inputs, the mixing weights and every weight, the same running statistics,
//! in normal and reduction cells; written back into a per-edge cell; a search run with it; and
//! the cells and configs it refuses.

// A panic is the failure report in tests.
#![allow(clippy::unwrap_used)]

use std::path::Path;

use qdarts_engine::config::Experiment;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::activation::softmax;
use burn::tensor::{Device, Distribution, Gradients, Tensor};
use qdarts_genotypes::Primitive;
use qdarts_ops::candidates::{CandidateOp, OpBits, Pass, QTensor, QuantSites};
use qdarts_ops::qconfig::{Preset, QuantConfig};
use qdarts_ops::quant::{ErrorTape, QuantPass};
use qdarts_search::supernet::waves::waves as plan;
use qdarts_search::supernet::{BatchedCell, BitWeights, CellBits, CellShape, SearchCell, Slot};

mod common;

const PRIMS: [Primitive; 8] = Primitive::DARTS;

struct Case {
    cell: SearchCell,
    batched: BatchedCell,
    s0: Tensor<4>,
    s1: Tensor<4>,
    weights: Vec<Tensor<1>>,
    probe: Tensor<4>,
}

fn shape(reduction: bool, reduction_prev: bool) -> CellShape {
    CellShape { c_pp: 6, c_p: 8, c: 4, reduction, reduction_prev, nodes: 4, partial: 1 }
}

fn case(reduction: bool, reduction_prev: bool, seed: u64) -> Case {
    case_with(&QuantConfig::float(), reduction, reduction_prev, seed)
}

fn case_with(cfg: &QuantConfig, reduction: bool, reduction_prev: bool, seed: u64) -> Case {
    case_shaped(cfg, shape(reduction, reduction_prev), seed)
}

fn case_shaped(cfg: &QuantConfig, s: CellShape, seed: u64) -> Case {
    let (reduction, reduction_prev) = (s.reduction, s.reduction_prev);
    let d = Device::flex().autodiff();
    qdarts_ops::seeded(&d, seed, || {
        let cell = SearchCell::new(s, &PRIMS, cfg, "cells.0", &d).unwrap();
        let batched = BatchedCell::from_cell(&cell, &PRIMS).unwrap();
        let side = if reduction_prev { 16 } else { 8 };
        let normal = Distribution::Normal(0.0, 1.0);
        let s0 = Tensor::<4>::random([2, s.c_pp, side, side], normal, &d).require_grad();
        let s1 = Tensor::<4>::random([2, s.c_p, 8, 8], normal, &d).require_grad();
        let weights = (0..14)
            .map(|_| softmax(Tensor::<1>::random([8], normal, &d), 0).detach().require_grad())
            .collect();
        let out = if reduction { 4 } else { 8 };
        let probe = Tensor::<4>::random([2, 4 * s.c, out, out], normal, &d);
        Case { cell, batched, s0, s1, weights, probe }
    })
}

fn q(t: &Tensor<4>) -> QTensor {
    QTensor::float(t.clone())
}

fn vals<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().try_to_vec::<f32>().unwrap()
}

/// `max |a − b|` within `rel` of `max |a|` (and a floor for tensors near zero).
fn close<const D: usize>(a: Tensor<D>, b: Tensor<D>, rel: f32, what: &str) {
    let (a, b) = (vals(a), vals(b));
    assert_eq!(a.len(), b.len(), "{what}: sizes");
    let scale = a.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let diff = a.iter().zip(&b).fold(0.0f32, |m, (x, y)| m.max((x - y).abs()));
    assert!(diff <= rel * scale + 1e-6, "{what}: max |Δ| {diff:e} at scale {scale:e}");
}

fn grad<const D: usize>(t: &Tensor<D>, g: &Gradients) -> Tensor<D> {
    t.grad(g).unwrap()
}

/// `batched` on the inputs after `cell`'s preprocessing.
fn waves(cell: &SearchCell, batched: &BatchedCell, c: &Case) -> Tensor<4> {
    let (s0, s1) = (cell.preproc0.forward(q(&c.s0)), cell.preproc1.forward(q(&c.s1)));
    batched
        .forward((s0, s1), Tensor::stack(c.weights.clone(), 0), None, 0.0, cell, Pass::default())
        .value
}

fn run(c: &Case) -> (Tensor<4>, Gradients, Tensor<4>, Gradients) {
    let a = c.cell.forward(q(&c.s0), q(&c.s1), &c.weights, None, 0.0, Pass::default()).value;
    let b = waves(&c.cell, &c.batched, c);
    let ga = a.clone().mul(c.probe.clone()).sum().backward();
    let gb = b.clone().mul(c.probe.clone()).sum().backward();
    (a, ga, b, gb)
}

fn index(p: Primitive) -> usize {
    PRIMS.iter().position(|&x| x == p).unwrap()
}

#[test]
fn the_batched_cell_computes_the_per_edge_cell_forward_and_backward() {
    for (reduction, reduction_prev) in [(false, false), (true, false), (false, true)] {
        let what = format!("reduction {reduction}, after a reduction {reduction_prev}");
        let c = case(reduction, reduction_prev, 11);
        let (a, ga, b, gb) = run(&c);
        close(a, b, 1e-5, &format!("{what}: output"));
        close(grad(&c.s0, &ga), grad(&c.s0, &gb), 1e-4, &format!("{what}: ∂s0"));
        close(grad(&c.s1, &ga), grad(&c.s1, &gb), 1e-4, &format!("{what}: ∂s1"));
        for (k, w) in c.weights.iter().enumerate() {
            close(grad(w, &ga), grad(w, &gb), 1e-4, &format!("{what}: ∂w of edge {k}"));
        }
        for (wi, wave) in plan(4).iter().enumerate() {
            let ops = &c.batched.waves[wi];
            // The padding of a filter smaller than its group's has no gradient, so that it
            // stays zero through every optimizer step.
            let bank = ops.bank.as_ref().unwrap();
            for stage in [&bank.first, bank.second.as_ref().unwrap()] {
                for (g, dw) in stage.groups.iter().zip(&stage.dw) {
                    let big = g.kernel;
                    let values = vals(grad(&dw.val(), &gb));
                    let per_kind = values.len() / g.kinds.len();
                    for (q, kind) in stage.kinds[g.kinds.clone()].iter().enumerate() {
                        let off = (big - kind.kernel) / 2;
                        let inside = |t: usize| t >= off && t < off + kind.kernel;
                        let padding = values[q * per_kind..(q + 1) * per_kind]
                            .iter()
                            .enumerate()
                            .filter(|(t, _)| !(inside(t % (big * big) / big) && inside(t % big)))
                            .fold(0.0f32, |m, (_, v)| m.max(v.abs()));
                        assert_eq!(padding, 0.0, "{what}: gradient of a filter's padding");
                    }
                }
            }
            edge_weights((&c.cell, &c.batched), (wi, wave), (&ga, &gb), &what);
        }
    }
}

/// Wave `wi`'s edges in `cell` against the batched cell built from it: the gradients of both
/// stages' weights of sep_conv_3x3, of dil_conv_5x5's depthwise weight and of FactorizedReduce's
/// (`g`: the per-edge cell's gradients, then the batched cell's), and the BatchNorms' running
/// statistics after one forward pass each (a max pool's its source's).
fn edge_weights(
    (cell, batched): (&SearchCell, &BatchedCell),
    (wi, wave): (usize, &qdarts_search::supernet::waves::Wave),
    (ga, gb): (&Gradients, &Gradients),
    what: &str,
) {
    let ops = &batched.waves[wi];
    for (j, &k) in wave.edges.iter().enumerate() {
        let edge = &cell.edges[k];
        let at = |p: Primitive| &edge.ops[index(p)];
        // Separable 3×3: both stages' depthwise and pointwise weights, and the BN's
        // running statistics (one forward pass each).
        let bank = ops.bank.as_ref().unwrap();
        let Slot::Conv(i) = ops.slots[index(Primitive::SepConv3x3)] else { panic!() };
        let CandidateOp::Sep(sep) = at(Primitive::SepConv3x3) else { panic!() };
        let second = bank.second.as_ref().unwrap();
        for (s, (op, stage)) in
            [(&sep.op1, &bank.first), (&sep.op2, second)].into_iter().enumerate()
        {
            let name = format!("{what}: edge {k} sep_conv_3x3 stage {s}");
            let dw = grad(&stage.dw[stage.group_of(i)].val(), gb);
            let dw = stage.filters(&dw, i, j);
            close(grad(&op.dw.weight.val(), ga), dw, 1e-4, &format!("{name} ∂dw"));
            let pw = stage.rows(grad(&stage.pw.val(), gb), i, j);
            close(grad(&op.pw.weight.val(), ga), pw, 1e-4, &format!("{name} ∂pw"));
            let rm = stage.rows(stage.bn.running_mean.value(), i, j);
            close(op.bn.running_mean.value(), rm, 1e-5, &format!("{name} running mean"));
            let rv = stage.rows(stage.bn.running_var.value(), i, j);
            close(op.bn.running_var.value(), rv, 1e-5, &format!("{name} running var"));
        }
        // Dilated 5×5's depthwise weight.
        let Slot::Conv(i) = ops.slots[index(Primitive::DilConv5x5)] else { panic!() };
        let CandidateOp::Dil(dil) = at(Primitive::DilConv5x5) else { panic!() };
        let stage = &bank.first;
        let dw = stage.filters(&grad(&stage.dw[stage.group_of(i)].val(), gb), i, j);
        let name = format!("{what}: edge {k} dil_conv_5x5 ∂dw");
        close(grad(&dil.dw.weight.val(), ga), dw, 1e-4, &name);
        // Max pool's BN: every edge's running statistics are the pool's of its source.
        let Slot::Pool(i) = ops.slots[index(Primitive::MaxPool3x3)] else { panic!() };
        let CandidateOp::Pool(pool) = at(Primitive::MaxPool3x3) else { panic!() };
        let ch = pool.bn.running_mean.value().dims()[0];
        let from = wave.source_of[j] * ch;
        let shared = ops.pools[i].bn.running_mean.value().narrow(0, from, ch);
        let name = format!("{what}: edge {k} max_pool_3x3 running mean");
        close(pool.bn.running_mean.value(), shared, 1e-6, &name);
        // FactorizedReduce (the reduction cell's first wave).
        if let CandidateOp::Reduce(fr) = at(Primitive::SkipConnect) {
            let reduce = ops.reduce.as_ref().unwrap();
            let half = fr.conv1.weight.val().dims()[0];
            for (mine, stacked) in [(&fr.conv1, &reduce.conv1), (&fr.conv2, &reduce.conv2)] {
                let g = grad(&stacked.val(), gb).narrow(0, j * half, half);
                let name = format!("{what}: edge {k} FactorizedReduce ∂w");
                close(grad(&mine.weight.val(), ga), g, 1e-4, &name);
            }
            let rm = reduce.bn.running_mean.value().narrow(0, j * 2 * half, 2 * half);
            let name = format!("{what}: edge {k} FactorizedReduce running mean");
            close(fr.bn.running_mean.value(), rm, 1e-5, &name);
        }
    }
}

#[test]
fn the_batched_cell_refuses_what_it_does_not_batch_naming_it() {
    let d = Device::flex();
    let cfg = QuantConfig::preset(Preset::Lsq);
    let cell = SearchCell::new(shape(false, false), &PRIMS, &cfg, "cells.0", &d).unwrap();
    let err = BatchedCell::from_cell(&cell, &PRIMS).unwrap_err();
    assert!(err.to_string().contains("LSQ"), "{err}");

    let fac = [Primitive::SepConv3x3, Primitive::Conv7x1_1x7];
    let cell = SearchCell::new(shape(false, false), &fac, &QuantConfig::float(), "c", &d).unwrap();
    let err = BatchedCell::from_cell(&cell, &fac).unwrap_err();
    assert!(err.to_string().contains("conv_7x1_1x7"), "{err}");
}

/// A batched cell trained a little (a forward pass moves its BatchNorms' running statistics,
/// and its weights are changed as an optimizer step would), written back into a fresh
/// per-edge cell of the same shape: that cell then computes what the batched cell computes,
/// and batching it again gives back every weight and statistic.
#[test]
fn a_batched_cell_written_back_is_the_per_edge_cell_it_computes() {
    for reduction in [false, true] {
        let what = format!("reduction {reduction}");
        let c = case(reduction, false, 5);
        let d = Device::flex().autodiff();
        let shape = shape(reduction, false);
        let mut fresh = qdarts_ops::seeded(&d, 99, || {
            SearchCell::new(shape, &PRIMS, &QuantConfig::float(), "cells.0", &d).unwrap()
        });
        // The preprocessing is not the batched cell's: the two cells compare when it is shared.
        fresh.preproc0 = c.cell.preproc0.clone();
        fresh.preproc1 = c.cell.preproc1.clone();
        let batched = c.batched.clone();
        let _ = waves(&c.cell, &batched, &c);
        let batched = batched.map(&mut Twice);
        batched.write_into(&mut fresh);
        let again = BatchedCell::from_cell(&fresh, &PRIMS).unwrap();
        let (mut x, mut y) = (Floats::default(), Floats::default());
        batched.visit(&mut x);
        again.visit(&mut y);
        assert_eq!(x.0.len(), y.0.len(), "{what}: tensors");
        for (i, (u, v)) in x.0.into_iter().zip(y.0).enumerate() {
            assert_eq!(u, v, "{what}: tensor {i} of the round trip");
        }
        // (After the round trip: a forward pass moves the running statistics of both.)
        let a = fresh.forward(q(&c.s0), q(&c.s1), &c.weights, None, 0.0, Pass::default()).value;
        let b = waves(&c.cell, &batched, &c);
        close(a, b, 1e-5, &format!("{what}: output after the write-back"));
    }
}

/// Doubles every float parameter and buffer (a stand-in for an optimizer step).
struct Twice;

impl ModuleMapper for Twice {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let (id, value, mapper) = param.consume();
        Param::from_mapped_value(id, value.mul_scalar(2.0).detach(), mapper)
    }
}

/// Every float parameter and buffer's values, in visiting order.
#[derive(Default)]
struct Floats(Vec<Vec<f32>>);

impl ModuleVisitor for Floats {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        self.0.push(vals(param.val()));
    }
}

/// The train rows of a run's metrics: `(loss, top-1)` per step.
/// The tiny search (`extra` in its TOML, `sets` as `--set`) edge by edge and in waves
/// (`model.batched_cells`) on flex: both finish with as many training rows, every loss
/// finite, the first within `rel` of the per-edge one.
fn edges_and_waves(
    dir: &Path,
    extra: &str,
    sets: &[&str],
    rel: f64,
) -> (qdarts_search::SearchOutcome, qdarts_search::SearchOutcome) {
    let mut go = |_: &qdarts_engine::Progress| std::ops::ControlFlow::Continue(());
    let mut run = |name: &str, on: &[&str]| {
        let cfg = common::tiny_with(&dir.join(name), extra, on);
        qdarts_search::run_search(&cfg, &Device::flex(), None, &mut go).unwrap()
    };
    let edges = run("edges", sets);
    let waves = run("waves", &[sets, &["model.batched_cells=true"]].concat());
    assert!(edges.finished && waves.finished);
    let (a, b) = (train_rows(&edges.run_dir), train_rows(&waves.run_dir));
    assert_eq!(a.len(), b.len());
    let (la, lb) = (a[0].0, b[0].0);
    assert!(
        (la - lb).abs() <= rel * la.abs(),
        "{sets:?}: first loss {la} edge by edge, {lb} in waves"
    );
    assert!(b.iter().all(|(l, _)| l.is_finite()), "{sets:?}: {b:?}");
    (edges, waves)
}

fn train_rows(run: &std::path::Path) -> Vec<(f64, f64)> {
    let text = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    let mut lines = text.lines();
    let head: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = |name: &str| head.iter().position(|h| *h == name).unwrap();
    let (phase, loss, top1) = (col("phase"), col("loss"), col("top1"));
    lines
        .map(|l| l.split(',').collect::<Vec<_>>())
        .filter(|f| f[phase] == "train")
        .map(|f| (f[loss].parse().unwrap(), f[top1].parse().unwrap()))
        .collect()
}

/// A float search with `model.batched_cells` runs to its genotype, and its first step is the
/// per-edge search's: the same loss to float rounding (both start from the same weights);
/// with PC-DARTS' partial channels (K = 2) too. A config that cannot run batched is refused
/// before anything is written, naming the key.
#[test]
fn a_search_with_batched_cells_takes_the_per_edge_first_step_and_finishes() {
    let dir = common::scratch("batched-search");
    let float = "[quant]\npreset = \"float\"";
    for k in [1, 2] {
        let part = format!("model.partial_channels={k}");
        let (_, waves) = edges_and_waves(&dir.join(format!("k{k}")), float, &[&part], 1e-5);
        assert!(!waves.genotype.to_darts_text().is_empty());
    }

    let text = common::tiny_text(&dir.join("refused"), "");
    let set = ["model.batched_cells=true".to_string(), "quant.preset=lsq".to_string()];
    let err = qdarts_search::config::ExperimentConfig::parse(&text, Path::new("t.toml"), &set)
        .unwrap_err()
        .to_string();
    assert!(err.contains("model.batched_cells") && err.contains("quant.preset"), "{err}");
    assert!(!dir.join("refused").exists());
}

/// Every quantizer's grid as it stands (step and zero point), by layer path.
fn grids(sites: &impl QuantSites) -> Vec<(String, Vec<f32>, Vec<f32>)> {
    let d = Device::flex();
    let mut out: Vec<_> = sites
        .quantizers()
        .iter()
        .map(|q| {
            let g = q.current_grid(&d);
            (q.path().to_string(), vals(g.step), vals(g.zero_point))
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// A quantized cell in waves against the per-edge cell, on flex: every output bit for bit
/// (each quantizer a row of a stacked one, each edge's sum added in the per-edge order), the
/// gradients to float rounding, every quantizer's state written back bit for bit, and every
/// site's error row; two steps, the second on other inputs (the observers move). The last
/// case quantizes every BatchNorm's multiplier too.
#[test]
fn a_quantized_batched_cell_is_the_per_edge_cell_bit_for_bit() {
    let multiplier =
        QuantConfig { quantize_bn_multiplier: true, ..QuantConfig::preset(Preset::Tensorrt) };
    let presets = [Preset::Tensorrt, Preset::OnnxQdq, Preset::Paddle].map(QuantConfig::preset);
    for cfg in presets.into_iter().chain([multiplier]) {
        let preset = (cfg.preset, cfg.quantize_bn_multiplier);
        for (reduction, reduction_prev) in [(false, false), (true, false), (false, true)] {
            let what = format!("{preset:?}, reduction {reduction}, after one {reduction_prev}");
            // Two cells from one seed: the per-edge one, and the one the batched cell reads.
            let a = case_with(&cfg, reduction, reduction_prev, 5);
            let mut b = case_with(&cfg, reduction, reduction_prev, 5);
            let batched = BatchedCell::from_cell(&b.cell, &PRIMS).unwrap();
            // The error rows of the second step, each cell's on its own tape.
            let (tape_a, tape_b) = (ErrorTape::default(), ErrorTape::default());
            for step in 0..2 {
                let rec = |tape| QuantPass::recording((step == 1).then_some(tape));
                let (rec_a, rec_b) = (rec(&tape_a), rec(&tape_b));
                // Each graph its own product (a backward consumes the nodes it reaches).
                let s0 = || a.s0.clone().mul_scalar(1.0 + step as f32);
                let pass = Pass::quantizing(rec_a);
                let ya = a.cell.forward(q(&s0()), q(&a.s1), &a.weights, None, 0.0, pass).value;
                let p0 = b.cell.preproc0.forward_in(q(&s0()), rec_b);
                let p1 = b.cell.preproc1.forward_in(q(&a.s1), rec_b);
                let w = Tensor::stack(a.weights.clone(), 0);
                let yb =
                    batched.forward((p0, p1), w, None, 0.0, &b.cell, Pass::quantizing(rec_b)).value;
                assert_eq!(vals(ya.clone()), vals(yb.clone()), "{what} step {step}: output");
                let ga = ya.mul(a.probe.clone()).sum().backward();
                let gb = yb.mul(a.probe.clone()).sum().backward();
                let at = |x: &str| format!("{what} step {step}: {x}");
                close(grad(&a.s0, &ga), grad(&a.s0, &gb), 1e-4, &at("∂s0"));
                close(grad(&a.s1, &ga), grad(&a.s1, &gb), 1e-4, &at("∂s1"));
                for (k, w) in a.weights.iter().enumerate() {
                    close(grad(w, &ga), grad(w, &gb), 1e-4, &at(&format!("∂w of edge {k}")));
                }
            }
            // Each site's error row (the sites of the per-edge cell that ran in waves are
            // the batched cell's rows).
            let mut rows_a = a.cell.quant_stats(&tape_a).unwrap();
            let mut rows_b = b.cell.quant_stats(&tape_b).unwrap();
            rows_b.extend(batched.quant_stats(&tape_b).unwrap());
            rows_a.sort_by(|x, y| x.layer.cmp(&y.layer));
            rows_b.sort_by(|x, y| x.layer.cmp(&y.layer));
            let names =
                |r: &[qdarts_ops::quant::QuantError]| -> std::collections::BTreeSet<String> {
                    r.iter().map(|e| e.layer.clone()).collect()
                };
            let (na, nb) = (names(&rows_a), names(&rows_b));
            let only_a: Vec<_> = na.difference(&nb).collect();
            let only_b: Vec<_> = nb.difference(&na).collect();
            assert!(only_a.is_empty() && only_b.is_empty(), "{what}: rows {only_a:?} / {only_b:?}");
            assert_eq!(rows_a.len(), rows_b.len(), "{what}: error rows");
            for (x, y) in rows_a.iter().zip(&rows_b) {
                assert_eq!((&x.layer, x.scale, x.zero_point), (&y.layer, y.scale, y.zero_point));
                assert_eq!(x.clip_frac, y.clip_frac, "{what}: {}", x.layer);
                let near = |u: f64, v: f64| (u - v).abs() <= 1e-5 * u.abs().max(v.abs()) + 1e-12;
                assert!(near(x.mse, y.mse) && near(x.sqnr_db, y.sqnr_db), "{what}: {x:?} {y:?}");
            }
            // Every quantizer's state written back is the per-edge cell's.
            batched.write_into(&mut b.cell);
            assert_eq!(grids(&a.cell), grids(&b.cell), "{what}: quantizer states");
        }
    }
}

/// Under a bit-width search (EdMIPS' composite quantization: every searched site mixes its
/// quantizers at each candidate width by its op's softmax over the widths), a cell in waves
/// against the per-edge cell on flex: the output bit for bit, the gradients of the inputs,
/// the mixing weights and the bit-width parameters to float rounding, and every width's
/// quantizer state written back; two steps, the observers moving.
#[test]
fn under_a_bit_width_search_the_batched_cell_is_the_per_edge_cell() {
    let cfg = QuantConfig::preset(Preset::Tensorrt);
    let (wb, ab) = ([2u32, 4, 8], [4u32, 8]);
    let d = Device::flex().autodiff();
    for (reduction, reduction_prev) in [(false, false), (true, false), (false, true)] {
        let what = format!("reduction {reduction}, after one {reduction_prev}");
        let s = shape(reduction, reduction_prev);
        let make = || {
            qdarts_ops::seeded(&d, 7, || {
                let bits = OpBits::Search { weight: &wb, act: &ab };
                SearchCell::with_bits(s, &PRIMS, &cfg, "cells.0", &d, bits).unwrap()
            })
        };
        let (a, mut b) = (make(), make());
        let batched = BatchedCell::from_cell(&b, &PRIMS).unwrap();
        let c = case_with(&QuantConfig::float(), reduction, reduction_prev, 5);
        // Bit-width parameters away from uniform, `[edges, K, B]`, the normal cell's and the
        // reduction cell's.
        let normal = Distribution::Normal(0.0, 1.0);
        let alpha = |b: usize| Tensor::<3>::random([14, 8, b], normal, &d).require_grad();
        let (aw, aa) = qdarts_ops::seeded(&d, 13, || (alpha(wb.len()), alpha(ab.len())));
        // Each graph its own softmaxes (a backward consumes the nodes it reaches).
        let softmaxes = || BitWeights {
            weight_normal: softmax(aw.clone(), 2),
            weight_reduce: softmax(aw.clone(), 2),
            act_normal: softmax(aa.clone(), 2),
            act_reduce: softmax(aa.clone(), 2),
        };
        for step in 0..2 {
            let (bits, cell_bits) = (softmaxes(), CellBits::of(&softmaxes(), reduction));
            let s0 = || c.s0.clone().mul_scalar(1.0 + step as f32);
            let pass = Pass { quant: QuantPass::OFF, bits: Some(&bits) };
            let ya = a.forward(q(&s0()), q(&c.s1), &c.weights, None, 0.0, pass).value;
            let (p0, p1) = (b.preproc0.forward(q(&s0())), b.preproc1.forward(q(&c.s1)));
            let w = Tensor::stack(c.weights.clone(), 0);
            let pass = Pass { quant: QuantPass::OFF, bits: Some(&cell_bits) };
            let yb = batched.forward((p0, p1), w, None, 0.0, &b, pass).value;
            assert_eq!(vals(ya.clone()), vals(yb.clone()), "{what} step {step}: output");
            let ga = ya.mul(c.probe.clone()).sum().backward();
            let gb = yb.mul(c.probe.clone()).sum().backward();
            let at = |x: &str| format!("{what} step {step}: {x}");
            close(grad(&c.s0, &ga), grad(&c.s0, &gb), 1e-4, &at("∂s0"));
            close(grad(&c.s1, &ga), grad(&c.s1, &gb), 1e-4, &at("∂s1"));
            close(grad(&aw, &ga), grad(&aw, &gb), 1e-4, &at("∂ weight widths' α"));
            close(grad(&aa, &ga), grad(&aa, &gb), 1e-4, &at("∂ activation widths' α"));
            for (wi, wave) in plan(4).iter().enumerate() {
                edge_weights((&a, &batched), (wi, wave), (&ga, &gb), &at("weights"));
            }
            for (k, w) in c.weights.iter().enumerate() {
                close(grad(w, &ga), grad(w, &gb), 1e-4, &at(&format!("∂w of edge {k}")));
            }
        }
        // Every width's quantizer written back is the per-edge cell's.
        batched.write_into(&mut b);
        assert!(grids(&a).iter().any(|(p, _, _)| p.ends_with(".w2")), "{what}: mixed sites");
        assert_eq!(grids(&a), grids(&b), "{what}: quantizer states");
    }
}

/// The batched cell against the per-edge cell on each of `cases` (a preset and a cell shape)
/// with PC-DARTS' edge weights (`edges`) and DARTS-' auxiliary skip β (`aux`, 0: none): the
/// output (bit for bit quantized on flex, where each edge's sum is added term by term and
/// every node's operands in the per-edge order) and every gradient.
fn against_the_per_edge_cell(cases: &[(Preset, CellShape)], edges: bool, aux: f32) {
    let d = Device::flex().autodiff();
    for &(preset, s) in cases {
        let cfg = QuantConfig::preset(preset);
        let what = format!("{preset:?}, {s:?}, edges {edges}, β {aux}");
        let (c, b) = (case_shaped(&cfg, s, 17), case_shaped(&cfg, s, 17));
        let batched = BatchedCell::from_cell(&b.cell, &PRIMS).unwrap();
        let e = qdarts_ops::seeded(&d, 3, || {
            let normal = Distribution::Normal(0.0, 1.0);
            softmax(Tensor::<1>::random([14], normal, &d), 0).detach().require_grad()
        });
        let rows: Vec<Tensor<1>> = (0..14).map(|i| e.clone().slice(i..i + 1)).collect();
        let rows = edges.then_some(rows.as_slice());
        let ya = c.cell.forward(q(&c.s0), q(&c.s1), &c.weights, rows, aux, Pass::default()).value;
        let (p0, p1) = (b.cell.preproc0.forward(q(&c.s0)), b.cell.preproc1.forward(q(&c.s1)));
        let w = Tensor::stack(c.weights.clone(), 0);
        let yb = batched
            .forward((p0, p1), w, edges.then(|| e.clone()), aux, &b.cell, Pass::default())
            .value;
        if preset == Preset::Float {
            close(ya.clone(), yb.clone(), 1e-5, &format!("{what}: output"));
        } else {
            assert_eq!(vals(ya.clone()), vals(yb.clone()), "{what}: output");
        }
        let ga = ya.mul(c.probe.clone()).sum().backward();
        let gb = yb.mul(c.probe.clone()).sum().backward();
        close(grad(&c.s0, &ga), grad(&c.s0, &gb), 1e-4, &format!("{what}: ∂s0"));
        close(grad(&c.s1, &ga), grad(&c.s1, &gb), 1e-4, &format!("{what}: ∂s1"));
        if edges {
            close(grad(&e, &ga), grad(&e, &gb), 1e-4, &format!("{what}: ∂ edge weights"));
        }
        for (k, w) in c.weights.iter().enumerate() {
            close(grad(w, &ga), grad(w, &gb), 1e-4, &format!("{what}: ∂w of edge {k}"));
        }
    }
}

/// Float and tensorrt, a normal and a reduction cell.
fn both_presets() -> Vec<(Preset, CellShape)> {
    let shapes = [shape(false, false), shape(true, false)];
    [Preset::Float, Preset::Tensorrt].iter().flat_map(|&p| shapes.map(|s| (p, s))).collect()
}

#[test]
fn with_pc_darts_edge_weights_the_batched_cell_computes_the_per_edge_cell() {
    against_the_per_edge_cell(&both_presets(), true, 0.0);
}

#[test]
fn with_darts_minus_auxiliary_skip_the_batched_cell_computes_the_per_edge_cell() {
    // β large enough that the auxiliary terms move the node grids' ranges.
    against_the_per_edge_cell(&both_presets(), false, 0.7);
    against_the_per_edge_cell(&both_presets(), true, 0.3);
}

/// The layers of a run's `quant_error.csv` rows, with how often each appears.
fn error_layers(run: &std::path::Path) -> std::collections::BTreeMap<String, usize> {
    let text = std::fs::read_to_string(run.join("quant_error.csv")).unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let layer = header.iter().position(|h| *h == "layer").unwrap();
    let mut seen = std::collections::BTreeMap::new();
    for l in lines {
        *seen.entry(l.split(',').nth(layer).unwrap().to_string()).or_insert(0) += 1;
    }
    seen
}

/// A quantized search (the default preset) in waves, first order with PC-DARTS' partial
/// channels (K = 2) and second order with DARTS-' auxiliary skip: the per-edge search's first step to float rounding (the step's
/// forward is the per-edge cell's bit for bit; the architecture step before it adds its
/// gradients in another order), finite losses, and an error row for every quantizer site the
/// per-edge search records.
#[test]
fn a_quantized_search_in_waves_takes_the_per_edge_first_step() {
    let dir = common::scratch("batched-quantized");
    for order in ["first", "second"] {
        let set = format!("search.order={order}");
        let second = order == "second";
        let aux = format!("search.guards.aux_skip={}", if second { 0.5 } else { 0.0 });
        let part = format!("model.partial_channels={}", if second { 1 } else { 2 });
        let sets = [set.as_str(), aux.as_str(), part.as_str()];
        let (edges, waves) = edges_and_waves(&dir.join(order), "", &sets, 1e-4);
        assert_eq!(error_layers(&edges.run_dir), error_layers(&waves.run_dir), "{order}");
    }
}

/// A bit-width search (with a BitOPs cost on the widths) and a quantized BatchNorm multiplier
/// in waves: the per-edge search's first step to float rounding, finite losses, the same
/// bit-width rows, and an error row for every quantizer site the per-edge search records.
#[test]
fn a_bit_width_search_in_waves_takes_the_per_edge_first_step() {
    let dir = common::scratch("batched-bits");
    let extra = "[search.bits]\nweight = [2, 4, 8]\nact = [4, 8]\n[search.cost]\n\
                 metric = \"bitops\"\ntarget = 1e5\nweight = 1.0\ncharge = \"bits\"\n";
    let sets = ["quant.quantize_bn_multiplier=true"];
    let (edges, waves) = edges_and_waves(&dir, extra, &sets, 1e-4);
    assert_eq!(error_layers(&edges.run_dir), error_layers(&waves.run_dir));
    let rows = |run: &Path| -> Vec<String> {
        let text = std::fs::read_to_string(run.join("bits.csv")).unwrap();
        text.lines().map(|l| l.rsplit_once(',').unwrap().0.to_string()).collect()
    };
    let (a, b) = (rows(&edges.run_dir), rows(&waves.run_dir));
    assert!(a.len() > 1, "bits.csv rows: {a:?}");
    assert_eq!(a, b, "bits.csv's rows");
}

/// Perturbation selection's measurements in waves (DARTS-PT: the supernet with one op or whole
/// edges taken out, on the decisions made so far): the per-edge network's logits, float within
/// rounding and tensorrt bit for bit on flex, in the frozen-statistics network the selection
/// measures with.
#[test]
fn perturbation_trials_in_waves_are_the_per_edge_network_s() {
    use qdarts_search::selection::{Projection, Trial};
    use qdarts_search::supernet::{Alphas, NetShape, SearchNetwork};
    let d = Device::flex().autodiff();
    let shape = NetShape {
        c_in: 1,
        classes: 10,
        channels: 4,
        layers: 3,
        nodes: 3,
        stem_multiplier: 3,
        primitives: PRIMS.to_vec(),
        partial_channels: 1,
        bits: None,
    };
    for preset in [Preset::Float, Preset::Tensorrt] {
        let (net, mut alphas, x) = qdarts_ops::seeded(&d, 5, || {
            let net = SearchNetwork::new(&shape, &QuantConfig::preset(preset), &d).unwrap();
            let alphas = Alphas::new(shape.nodes, PRIMS.len(), &d);
            let x = Tensor::<4>::random([4, 1, 16, 16], Distribution::Normal(0.0, 1.0), &d);
            (net, alphas, x)
        });
        // One training forward sets the observers and BatchNorm statistics the measurement
        // then reads frozen.
        drop(net.forward_arch(x.clone(), alphas.arch()));
        let mut projection = Projection::new(shape.nodes);
        projection.normal.ops[0] = Some(index(Primitive::SepConv3x3));
        projection.normal.ops[3] = Some(index(Primitive::SkipConnect));
        projection.reduce.ops[1] = Some(index(Primitive::MaxPool3x3));
        projection.reduce.inputs[1] = Some(vec![2, 4]);
        alphas.projection = Some(projection);
        let edges = net.valid();
        let mut batched = net.clone();
        batched.batch_cells(&PRIMS).unwrap();
        let waves = batched.valid();
        let alphas = alphas.valid();
        let trials = [
            (false, Trial::Nothing),
            (false, Trial::Op { edge: 1, op: index(Primitive::DilConv5x5) }),
            (true, Trial::Op { edge: 0, op: index(Primitive::SkipConnect) }),
            (true, Trial::Edges(vec![6, 8])),
        ];
        let x = x.inner();
        let whole = vals(edges.forward_arch(x.clone(), alphas.arch()));
        for (reduction, trial) in trials {
            let what = format!("{preset:?}, reduction {reduction}, {trial:?}");
            let a = edges.forward_arch(x.clone(), alphas.arch_with(reduction, &trial));
            let b = waves.forward_arch(x.clone(), alphas.arch_with(reduction, &trial));
            // A trial that takes something out moves the logits.
            assert_eq!(trial == Trial::Nothing, vals(a.clone()) == whole, "{what}");
            if preset == Preset::Float {
                close(a, b, 1e-5, &what);
            } else {
                assert_eq!(vals(a), vals(b), "{what}");
            }
        }
    }
}

/// A quantized search with perturbation selection in waves runs every round: each edge's op
/// and the three-input node decided (5 edges × 2 cells × 7 candidates and 2 × 3 input rows,
/// `selection.csv`), and the genotype is the rows' decisions.
#[test]
fn a_perturbation_search_in_waves_decides_every_edge() {
    let selection = "[search.perturbation]\ntune_epochs = 1\norder = \"random\"\neval_images = 16";
    let on = ["search.selection=\"perturbation\"", "model.batched_cells=true"];
    let cfg = common::tiny_with(&common::scratch("batched-pt"), selection, &on);
    let mut go = |_: &qdarts_engine::Progress| std::ops::ControlFlow::Continue(());
    let out = qdarts_search::run_search(&cfg, &Device::flex(), None, &mut go).unwrap();
    assert!(out.finished);
    let rows = std::fs::read_to_string(out.run_dir.join("selection.csv")).unwrap();
    let lines: Vec<&str> = rows.lines().skip(1).collect();
    assert_eq!(lines.len(), 5 * 2 * 7 + 2 * 3, "{rows}");
    assert_eq!(lines.iter().filter(|l| l.ends_with(",kept")).count(), 10, "{rows}");
    assert_eq!(lines.iter().filter(|l| l.ends_with(",removed")).count(), 2, "{rows}");
    for (cell, name) in [(&out.genotype.normal, "normal"), (&out.genotype.reduce, "reduce")] {
        for (node, edges) in cell.iter().enumerate() {
            for e in edges {
                let edge = qdarts_genotypes::edge_index(node, e.input);
                let want = format!("{name},op,{node},{edge},{},", e.op);
                assert!(lines.iter().any(|l| l.contains(&want) && l.ends_with(",kept")), "{want}");
            }
        }
    }
}

/// PC-DARTS' partial channels in waves (a cell of 4 channels, K = 2, and K = 4 but not in a
/// reduction cell), float and tensorrt (K = 2), normal and reduction cells (whose input edges
/// max-pool their bypassed channels) and a cell after a reduction, with and without PC-DARTS'
/// edge weights and DARTS-' auxiliary skip.
#[test]
fn with_partial_channels_the_batched_cell_computes_the_per_edge_cell() {
    let mut cases = Vec::new();
    for (preset, k) in [(Preset::Float, 2), (Preset::Float, 4), (Preset::Tensorrt, 2)] {
        for (reduction, reduction_prev) in [(false, false), (true, false), (false, true)] {
            // K = 4 leaves one channel a candidate: FactorizedReduce cannot halve it.
            if !(reduction && k == 4) {
                cases.push((preset, CellShape { partial: k, ..shape(reduction, reduction_prev) }));
            }
        }
    }
    against_the_per_edge_cell(&cases, false, 0.0);
    against_the_per_edge_cell(&cases, true, 0.4);
}
