#!/usr/bin/env python3
"""The PyTorch reference of qdarts' search step.

The same DARTS supernet, written the pt.darts way (ops, search cells, search network,
architect), with the quantizers of qdarts' `float` and `tensorrt` presets:

* weights: int8 per output channel, step max|w|/127 of the current weights, integers
  round-half-even and clamped to [-128, 127] (what `max|w|/127` can reach is [-127, 127]);
* activations: int8 per tensor, symmetric, step max(|min|, |max|)/127.5 of a moving-average
  min/max (torch.ao's MovingAverageMinMaxObserver, averaging constant 0.01, the first batch
  setting min and max);
* the softmax mixing weights: uint8 on the fixed range [0, 1] (step 1/255);
* straight-through gradients (1 inside the clamp range, 0 outside);
* a node's sum rounds every operand onto the sum's grid and adds the integers (an integer add);
* average pooling on a grid averages the integers and rounds once;
* BatchNorm (affine-free in the cells, affine in the stem) normalises with the batch, updates
  its running statistics (momentum 0.1, unbiased variance), and its bias `-mean·w` is rounded
  to int32 on the scale input step · weight step · w when both are quantized.

The architect: first order `dL_val/dα`; second order `dL_val(w', α)/dα - ξ·H·dw'` with the
virtual step `w' = w - ξ(μ·v + g + λ·w)` (momentum included, as DARTS and pt.darts do), and the
Hessian-vector product as a central difference divided by 2ε (DARTS; pt.darts multiplies by ε).
Under fake quantization every second-order pass runs on a copy of the network: the pass at w on
the training batch updates the copy's observers, which then stay frozen, and the passes at
w ± ε·dw hold each quantizer's rounding and clipping as it was at w (x·mask + offset), so the
difference is the straight-through surrogate's mixed Hessian and not a count of rounding flips.
The kinks that read a held tensor are held with it: a ReLU keeps the mask of the value at w
(a value at exactly 0 stays blocked on both sides) and a max pool the element it picked at w, so
the difference tends to the exact Hessian-vector product of the piece autograd differentiates
at w (double backward) instead of adding one O(1)/2ε term per value sitting at a kink.

Commands:
  fixtures --out DIR [--inputs DIR]
      For every fixture folder of --inputs (qdarts' `qdarts dump-step` output: spec.json,
      net/alphas/velocity/batches.safetensors), compute the second-order gradient and one
      first-order search step and write them to DIR/<fixture>/expected.safetensors beside a
      copy of the inputs. The Rust test `search/tests/parity.rs` compares qdarts with them
      (QDARTS_PARITY_DIR=DIR to use this folder). --float64 computes in double precision;
      --with-float32 then also writes the float32 step's second-order outputs (the gradient
      at w', the Hessian term and their sum) as expected-float32.safetensors, which bound how close a float32 step can be
      held to the exact one (`qdarts_search::parity::check_fixture`). --spread K also computes
      K variants of each step with every sum in another order (the batches permuted, and every
      other variant's convolutions without oneDNN) and writes each one's distance from the step
      by output group as spread.json: the reference's own spread, which a quantized step at a
      shape where values sit within last bits of rounding boundaries is held to.
  bench --layers 8 --init-channels 16 --batch 64 --quant float|tensorrt --order first|second
      Seconds per search step (architecture step + weight step) and peak RSS of the same
      supernet on random 3x32x32 data, for a side-by-side comparison with `qdarts bench search`.

Needs: pip install torch numpy safetensors.
"""

import argparse
import copy
import json
import math
import os
import resource
import shutil
import sys
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

EPS = float(torch.finfo(torch.float32).eps)  # smallest step (qdarts MIN_SCALE)
PRIMITIVES = [
    "none",
    "max_pool_3x3",
    "avg_pool_3x3",
    "skip_connect",
    "sep_conv_3x3",
    "sep_conv_5x5",
    "dil_conv_3x3",
    "dil_conv_5x5",
]
HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_INPUTS = os.path.join(HERE, "..", "search", "tests", "fixtures", "parity")


# --- quantization ------------------------------------------------------------------------


class Grid:
    """A quantization grid: x -> clamp(round(x*mult) + zp, qmin, qmax), back as (q - zp)*step."""

    def __init__(self, mult, step, zp, qmin, qmax, axis, held=False, at_w=None):
        self.mult, self.step, self.zp = mult, step, zp
        self.qmin, self.qmax, self.axis = qmin, qmax, axis
        # The grid of a held quantizer: the roundings that follow from it (an integer average,
        # an int32 bias) are left out too, and the kinks that read its output (ReLU, max
        # pooling) decide on `at_w`, that output at w.
        self.held, self.at_w = held, at_w

    @staticmethod
    def from_step(step, zp, qmin, qmax, axis=None):
        step = step.clamp_min(EPS)
        return Grid(1.0 / step, step, zp, qmin, qmax, axis)

    @staticmethod
    def from_threshold(t, bin_cnt, qmin, qmax, axis=None):
        t = t.clamp_min(EPS)
        return Grid((1.0 / t) * bin_cnt, t / bin_cnt, torch.zeros_like(t), qmin, qmax, axis)

    def detached(self, held=False, at_w=None):
        d = lambda t: t.detach()
        return Grid(d(self.mult), d(self.step), d(self.zp), self.qmin, self.qmax, self.axis, held, at_w)

    def bc(self, p, ndim):
        shape = [1] * ndim
        if self.axis is not None:
            shape[self.axis] = -1
        return p.detach().reshape(shape)


def quantize(x, g):
    """Integers and the in-range mask (decided before clamping)."""
    n = x.dim()
    r = torch.round(x.detach() * g.bc(g.mult, n)) + g.bc(g.zp, n)
    inside = (r >= g.qmin) & (r <= g.qmax)
    return r.clamp(g.qmin, g.qmax), inside


def fake_quant(x, g):
    q, inside = quantize(x, g)
    n = x.dim()
    deq = (q - g.bc(g.zp, n)) * g.bc(g.step, n)
    return deq + (x - x.detach()) * inside.float()


class Quantizer:
    """One quantization site: `act` (moving-average min/max, int8 symmetric), `weight` (max|w|
    per output channel, int8), or `mix` (fixed [0, 1], uint8)."""

    def __init__(self, kind, name):
        self.kind, self.name = kind, name
        self.observe = True
        self.min = torch.tensor([math.inf])
        self.max = torch.tensor([-math.inf])
        self.threshold = None
        self.hold = "off"  # off | record | kept | replay
        self.kept = None

    def state(self):
        if self.kind == "act":
            return {f"{self.name}.observer.MinMax.min": self.min,
                    f"{self.name}.observer.MinMax.max": self.max}
        if self.kind == "weight":
            return {f"{self.name}.observer.AbsMax.threshold": self.threshold}
        return {}

    def load(self, sd):
        if self.kind == "act":
            self.min = sd[f"{self.name}.observer.MinMax.min"].clone()
            self.max = sd[f"{self.name}.observer.MinMax.max"].clone()
        elif self.kind == "weight":
            self.threshold = sd[f"{self.name}.observer.AbsMax.threshold"].clone()

    def grid(self, x):
        if self.kind == "weight":
            c = x.shape[0]
            t = x.detach().reshape(c, -1).abs().amax(1)
            if self.observe:
                self.threshold = t.clone()
            return Grid.from_threshold(t, 127.0, -128, 127, axis=0)
        if self.kind == "mix":
            lo, hi = torch.zeros(1), torch.ones(1)
            scale = (hi.clamp_min(0.0) - lo.clamp_max(0.0)) / 255.0
            scale = scale.clamp_min(EPS)
            zp = (-torch.round(lo.clamp_max(0.0) / scale) + 0.0).clamp(0.0, 255.0)
            return Grid.from_step(scale, zp, 0, 255)
        if self.observe:
            xd = x.detach()
            xmin, xmax = xd.min().reshape(1), xd.max().reshape(1)
            if torch.isinf(self.min).all():
                self.min, self.max = xmin, xmax
            else:
                self.min = self.min + (xmin - self.min) * 0.01
                self.max = self.max + (xmax - self.max) * 0.01
        max_abs = torch.maximum(-self.min.clamp_max(0.0), self.max.clamp_min(0.0))
        scale = (max_abs / 127.5).clamp_min(EPS)
        return Grid.from_step(scale, torch.zeros_like(scale), -128, 127)

    def _replay(self, x):
        if self.hold != "replay" or self.kept is None:
            return None
        mask, offset, at_w, g = self.kept
        if mask.numel() != x.numel():
            return None
        held = g.detached(held=True, at_w=at_w.reshape(x.shape))
        return x * mask.reshape(x.shape) + offset.reshape(x.shape), held

    def _record(self, x, out, g):
        if self.hold == "record":
            xd = x.detach()
            _, inside = quantize(xd, g)
            mask = inside.float()
            at_w = out.detach().reshape(-1)
            self.kept = (mask.reshape(-1), (out.detach() - xd * mask).reshape(-1), at_w, g.detached())

    def __call__(self, x):
        held = self._replay(x)
        if held is not None:
            return held
        g = self.grid(x)
        out = fake_quant(x, g)
        self._record(x, out, g)
        return out, g

    def sum(self, xs):
        """An integer add: every operand rounded onto the sum's grid, the integers added."""
        total = xs[0]
        for x in xs[1:]:
            total = total + x
        if len(xs) == 1:
            return self(total)
        held = self._replay(total)
        if held is not None:
            return held
        g = self.grid(total)
        n = total.dim()
        r = None
        for x in xs:
            q = torch.round(x.detach() * g.bc(g.mult, n))
            r = q if r is None else r + q
        r = r + g.bc(g.zp, n)
        inside = (r >= g.qmin) & (r <= g.qmax)
        out = (r.clamp(g.qmin, g.qmax) - g.bc(g.zp, n)) * g.bc(g.step, n)
        mask = inside.float()
        for x in xs:
            out = out + (x - x.detach()) * mask
        self._record(total, out, g)
        return out, g


def relu_held(x):
    """ReLU of (value, grid); on a held grid with the mask of the value at w."""
    v, g = x
    if g is not None and g.held:
        return v * (g.at_w > 0).float()
    return F.relu(v)


def max_pool_held(x, k, stride, padding):
    """Max pooling of (value, grid); on a held grid each window takes the element it took at w
    (the first maximum in row-major order) and that element's value now."""
    v, g = x
    if g is not None and g.held:
        _, idx = F.max_pool2d(g.at_w, k, stride, padding, return_indices=True)
        return v.flatten(2).gather(2, idx.flatten(2)).reshape(idx.shape)
    return F.max_pool2d(v, k, stride, padding)


def maybe(q, x):
    """Applies an optional activation quantizer; returns (value, grid or None)."""
    return q(x) if q is not None else (x, None)


def quantize_bias(b, unit):
    step = unit.abs().detach()
    tiny = step < 1e-30
    safe = torch.where(tiny, torch.ones_like(step), step)
    q = torch.round(b.detach() / safe).clamp(-2147483648.0, 2147483647.0)
    bq = torch.where(tiny, b.detach(), q * safe)
    return b + (bq - b.detach())


# --- ops (pt.darts' ops.py, quantized) ---------------------------------------------------


class Net:
    """Helpers every module shares: the quantizers it owns and its tensors by qdarts path."""

    def quantizers(self):
        out = []
        for v in self.__dict__.values():
            if isinstance(v, Quantizer):
                out.append(v)
            elif isinstance(v, Net):
                out.extend(v.quantizers())
            elif isinstance(v, list):
                for e in v:
                    if isinstance(e, Quantizer):
                        out.append(e)
                    elif isinstance(e, Net):
                        out.extend(e.quantizers())
        return out


class BN(Net):
    def __init__(self, c, affine, name):
        self.name, self.c = name, c
        self.gamma = torch.ones(c, requires_grad=True) if affine else None
        self.beta = torch.zeros(c, requires_grad=True) if affine else None
        self.running_mean, self.running_var = torch.zeros(c), torch.ones(c)
        self.training = True

    def params(self):
        return {f"{self.name}.{k}": getattr(self, k) for k in ("gamma", "beta") if getattr(self, k) is not None}

    def buffers(self):
        return {f"{self.name}.running_mean": self.running_mean, f"{self.name}.running_var": self.running_var}

    def folded(self, x):
        c = self.c
        if self.training:
            rows = x.transpose(0, 1).reshape(c, -1)
            mean = rows.mean(1)
            var = (rows - mean[:, None]).square().mean(1)
            count = rows.shape[1]
            unbiased = var.detach() * (count / max(count - 1.0, 1.0))
            self.running_mean = self.running_mean * 0.9 + mean.detach() * 0.1
            self.running_var = self.running_var * 0.9 + unbiased * 0.1
        else:
            mean, var = self.running_mean, self.running_var
        w = 1.0 / torch.sqrt(var + 1e-5)
        if self.gamma is not None:
            w = w * self.gamma
        b = -(mean * w)
        if self.beta is not None:
            b = b + self.beta
        return w, b

    def __call__(self, x, unit=None):
        w, b = self.folded(x)
        if unit is not None:
            b = quantize_bias(b, unit * w.detach())
        return x * w.reshape(1, -1, 1, 1) + b.reshape(1, -1, 1, 1)


class Conv(Net):
    def __init__(self, c_in, c_out, k, stride, padding, dilation, groups, name, quant):
        self.name = name
        self.weight = torch.zeros(c_out, c_in // groups, k, k, requires_grad=True)
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
        self.wq = Quantizer("weight", f"{name}.wq") if quant else None

    def params(self):
        return {f"{self.name}.weight": self.weight}

    def conv(self, x, w):
        return F.conv2d(x, w, None, self.stride, self.padding, self.dilation, self.groups)

    def __call__(self, x):
        w = self.wq(self.weight)[0] if self.wq else self.weight
        return self.conv(x, w)

    def with_unit(self, x, in_grid):
        if self.wq is None or in_grid is None:
            return self(x), None
        w, g = self.wq(self.weight)
        unit = torch.ones(w.shape[0]) * g.step.detach() * in_grid.step.detach()
        return self.conv(x, w), None if g.held or in_grid.held else unit


def act(quant, name):
    return Quantizer("act", name) if quant else None


class StdConv(Net):
    """ReLU - Conv - BN - quantize."""

    def __init__(self, c_in, c_out, k, stride, padding, affine, name, quant):
        self.conv = Conv(c_in, c_out, k, stride, padding, 1, 1, f"{name}.conv", quant)
        self.bn = BN(c_out, affine, f"{name}.bn")
        self.act = act(quant, f"{name}.act")

    def __call__(self, x):
        y, unit = self.conv.with_unit(relu_held(x), x[1])
        return maybe(self.act, self.bn(y, unit))


class DilConv(Net):
    """ReLU - depthwise conv - quantize - pointwise conv - BN - quantize."""

    def __init__(self, c_in, c_out, k, stride, padding, dilation, affine, name, quant):
        self.dw = Conv(c_in, c_in, k, stride, padding, dilation, c_in, f"{name}.dw", quant)
        self.dw_act = act(quant, f"{name}.dw_act")
        self.pw = Conv(c_in, c_out, 1, 1, 0, 1, 1, f"{name}.pw", quant)
        self.bn = BN(c_out, affine, f"{name}.bn")
        self.act = act(quant, f"{name}.act")

    def __call__(self, x):
        y, g = maybe(self.dw_act, self.dw(relu_held(x)))
        y, unit = self.pw.with_unit(y, g)
        return maybe(self.act, self.bn(y, unit))


class SepConv(Net):
    """DilConv(stride) then DilConv(1), dilation 1."""

    def __init__(self, c, k, stride, affine, name, quant):
        self.op1 = DilConv(c, c, k, stride, k // 2, 1, affine, f"{name}.op1", quant)
        self.op2 = DilConv(c, c, k, 1, k // 2, 1, affine, f"{name}.op2", quant)

    def __call__(self, x):
        return self.op2(self.op1(x))


class PoolBN(Net):
    def __init__(self, kind, c, stride, affine, name, quant):
        self.kind, self.stride = kind, stride
        self.bn = BN(c, affine, f"{name}.bn")
        self.act = act(quant, f"{name}.act")

    def __call__(self, x):
        v, g = x
        c = v.shape[1]
        unit = None if g is None or g.held else torch.ones(c) * g.step.detach()
        if self.kind == "max":
            pooled = max_pool_held(x, 3, self.stride, 1)
        else:
            avg = F.avg_pool2d(v, 3, self.stride, 1, count_include_pad=False)
            if g is None or g.held:
                pooled = avg
            else:
                q = torch.round(v.detach() * g.bc(g.mult, 4))
                qa = torch.round(F.avg_pool2d(q, 3, self.stride, 1, count_include_pad=False))
                pooled = avg + (qa * g.bc(g.step, 4) - avg.detach())
        return maybe(self.act, self.bn(pooled, unit))


class Zero(Net):
    def __init__(self, stride, name, quant):
        self.stride = stride
        self.act = act(quant, f"{name}.act")

    def __call__(self, x):
        n, c, h, w = x[0].shape
        s = self.stride
        return maybe(self.act, torch.zeros(n, c, -(-h // s), -(-w // s)))


class Identity(Net):
    def __call__(self, x):
        return x


class FactorizedReduce(Net):
    def __init__(self, c_in, c_out, affine, name, quant):
        self.conv1 = Conv(c_in, c_out // 2, 1, 2, 0, 1, 1, f"{name}.conv1", quant)
        self.conv2 = Conv(c_in, c_out - c_out // 2, 1, 2, 0, 1, 1, f"{name}.conv2", quant)
        self.bn = BN(c_out, affine, f"{name}.bn")
        self.act = act(quant, f"{name}.act")

    def __call__(self, x):
        v = relu_held(x)
        y1, u1 = self.conv1.with_unit(v, x[1])
        y2, u2 = self.conv2.with_unit(v[:, :, 1:, 1:], x[1])
        unit = None if u1 is None or u2 is None else torch.cat([u1, u2])
        return maybe(self.act, self.bn(torch.cat([y1, y2], 1), unit))


def make_op(p, c, stride, name, quant):
    if p == "none":
        return Zero(stride, f"{name}.Zero", quant)
    if p in ("max_pool_3x3", "avg_pool_3x3"):
        return PoolBN(p[:3], c, stride, False, f"{name}.Pool", quant)
    if p == "skip_connect":
        return Identity() if stride == 1 else FactorizedReduce(c, c, False, f"{name}.Reduce", quant)
    if p.startswith("sep_conv"):
        return SepConv(c, int(p[-1]), stride, False, f"{name}.Sep", quant)
    k = int(p[-1])
    return DilConv(c, c, k, stride, k - 1 if k == 3 else 4, 2, False, f"{name}.Dil", quant)


class MixedOp(Net):
    def __init__(self, c, stride, name, quant):
        self.ops = [make_op(p, c, stride, f"{name}.ops.{i}", quant) for i, p in enumerate(PRIMITIVES)]
        self.mix = Quantizer("mix", f"{name}.mix") if quant else None
        self.act = act(quant, f"{name}.act")

    def __call__(self, x, w):
        wq = self.mix(w)[0] if self.mix else w
        s = None
        for i, op in enumerate(self.ops):
            term = op(x)[0] * wq[i : i + 1].reshape(1, 1, 1, 1)
            s = term if s is None else s + term
        return maybe(self.act, s)


class SearchCell(Net):
    def __init__(self, nodes, c_pp, c_p, c, reduction, reduction_prev, name, quant):
        self.reduction, self.nodes = reduction, nodes
        if reduction_prev:
            self.preproc0 = FactorizedReduce(c_pp, c, False, f"{name}.preproc0.Reduce", quant)
        else:
            self.preproc0 = StdConv(c_pp, c, 1, 1, 0, False, f"{name}.preproc0.Conv", quant)
        self.preproc1 = StdConv(c_p, c, 1, 1, 0, False, f"{name}.preproc1", quant)
        self.edges, k = [], 0
        for i in range(nodes):
            for j in range(2 + i):
                stride = 2 if reduction and j < 2 else 1
                self.edges.append(MixedOp(c, stride, f"{name}.edges.{k}", quant))
                k += 1
        self.adds = [act(quant, f"{name}.adds.{i}.act") for i in range(nodes)]
        self.concat = act(quant, f"{name}.concat.act")

    def __call__(self, s0, s1, weights):
        states, k = [self.preproc0(s0), self.preproc1(s1)], 0
        for add in self.adds:
            terms = [self.edges[k + j](h, weights[k + j]) for j, h in enumerate(states)]
            k += len(states)
            if add is None:
                total = terms[0][0]
                for t in terms[1:]:
                    total = total + t[0]
                states.append((total, None))
            else:
                states.append(add.sum([t[0] for t in terms]))
        return maybe(self.concat, torch.cat([s[0] for s in states[2:]], 1))


class SearchNetwork(Net):
    def __init__(self, c_in, c, classes, layers, nodes, stem_multiplier, quant):
        c_stem = stem_multiplier * c
        self.stem = Conv(c_in, c_stem, 3, 1, 1, 1, 1, "stem", quant)
        self.stem_bn = BN(c_stem, True, "stem_bn")
        self.stem_act = act(quant, "stem_act")
        c_pp, c_p, c_cur = c_stem, c_stem, c
        self.cells, reduction_prev = [], False
        for i in range(layers):
            reduction = i == layers // 3 or i == 2 * layers // 3
            if reduction:
                c_cur *= 2
            self.cells.append(SearchCell(nodes, c_pp, c_p, c_cur, reduction, reduction_prev, f"cells.{i}", quant))
            reduction_prev = reduction
            c_pp, c_p = c_p, c_cur * nodes
        self.gap_act = act(quant, "gap_act")
        self.classifier_weight = torch.zeros(classes, c_p, requires_grad=True)
        self.classifier_bias = torch.zeros(classes, requires_grad=True)
        self.classifier_wq = Quantizer("weight", "classifier.wq") if quant else None

    def __call__(self, x, w_normal, w_reduce):
        s = maybe(self.stem_act, self.stem_bn(self.stem(x)))
        s0 = s1 = s
        for cell in self.cells:
            out = cell(s0, s1, w_reduce if cell.reduction else w_normal)
            s0, s1 = s1, out
        v = s1[0]
        pooled = v.mean(3).mean(2)
        pooled = self.gap_act(pooled)[0] if self.gap_act else pooled
        w = self.classifier_wq(self.classifier_weight)[0] if self.classifier_wq else self.classifier_weight
        return pooled.matmul(w.t()) + self.classifier_bias

    # --- qdarts paths of every tensor ---

    def _walk(self, obj, seen):
        if id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, (Conv, BN)):
            yield obj
        if isinstance(obj, Net):
            for v in obj.__dict__.values():
                yield from self._walk(v, seen)
        elif isinstance(obj, list):
            for v in obj:
                yield from self._walk(v, seen)

    def weights(self):
        """Trainable tensors by qdarts path."""
        out = {"classifier.weight": self.classifier_weight, "classifier.bias": self.classifier_bias}
        for m in self._walk(self, set()):
            out.update(m.params())
        return out

    def state(self):
        """Every tensor qdarts checkpoints: weights, BN running statistics, observer state."""
        out = dict(self.weights())
        for m in self._walk(self, set()):
            if isinstance(m, BN):
                out.update(m.buffers())
        for q in self.quantizers():
            out.update(q.state())
        return out

    def load(self, sd):
        for name, t in self.weights().items():
            with torch.no_grad():
                t.copy_(sd[name])
        for m in self._walk(self, set()):
            if isinstance(m, BN):
                m.running_mean = sd[f"{m.name}.running_mean"].clone()
                m.running_var = sd[f"{m.name}.running_var"].clone()
        for q in self.quantizers():
            q.load(sd)

    def set_hold(self, mode):
        for q in self.quantizers():
            q.hold = mode
            if mode == "off":
                q.kept = None

    def freeze_observers(self):
        for q in self.quantizers():
            q.observe = False


def build(spec):
    quant = spec["preset"] == "tensorrt"
    return SearchNetwork(1, spec["channels"], 10, spec["layers"], spec["nodes"], spec["stem_multiplier"], quant)


def loss_of(net, alphas, batch):
    x, y = batch
    wn, wr = F.softmax(alphas["normal"], 1), F.softmax(alphas["reduce"], 1)
    return F.cross_entropy(net(x, wn, wr), y)


def alpha_grad(net, alphas, batch):
    """dL/dα with the weights untracked."""
    a = {k: v.detach().clone().requires_grad_(True) for k, v in alphas.items()}
    ws = list(net.weights().values())
    for w in ws:
        w.requires_grad_(False)
    loss = loss_of(net, a, batch)
    g = torch.autograd.grad(loss, [a["normal"], a["reduce"]])
    for w in ws:
        w.requires_grad_(True)
    return {"normal": g[0], "reduce": g[1]}


def shifted(net, direction, scale):
    """A copy of `net` with every weight w + scale·direction[w] (pt.darts' in-place p += ...)."""
    c = copy.deepcopy(net)
    with torch.no_grad():
        for name, w in c.weights().items():
            if name in direction:
                w.add_(direction[name] * scale)
    return c


def second_order(net, alphas, train, val, xi, velocity, momentum, decay):
    """(dL_val(w')/dα, H·dw'): DARTS' unrolled gradient, the second part not yet times -ξ."""
    cp = copy.deepcopy(net)
    cp.set_hold("record")
    names, ws = zip(*cp.weights().items())
    loss = loss_of(cp, {k: v.detach() for k, v in alphas.items()}, train)
    gw = dict(zip(names, torch.autograd.grad(loss, ws)))
    cp.freeze_observers()
    cp.set_hold("kept")
    v_net = copy.deepcopy(cp)
    with torch.no_grad():
        for name, w in v_net.weights().items():
            m = velocity[name] * momentum if name in velocity else 0.0
            w.copy_(w - xi * (m + gw[name] + decay * w))
    a = {k: v.detach().clone().requires_grad_(True) for k, v in alphas.items()}
    vnames, vws = zip(*v_net.weights().items())
    loss = loss_of(v_net, a, val)
    grads = torch.autograd.grad(loss, [a["normal"], a["reduce"]] + list(vws))
    dalpha = {"normal": grads[0], "reduce": grads[1]}
    dw = dict(zip(vnames, grads[2:]))
    cp.set_hold("replay")
    norm = torch.cat([g.reshape(-1) for g in dw.values()]).norm()
    eps = 0.01 / norm.item()
    p = alpha_grad(shifted(cp, dw, eps), alphas, train)
    n = alpha_grad(shifted(cp, dw, -eps), alphas, train)
    eps32 = torch.tensor(eps, dtype=torch.float32).item()
    h = {k: p[k] * (1.0 / (2.0 * eps32)) + n[k] * (-1.0 / (2.0 * eps32)) for k in p}
    return dalpha, h


def search_step(net, alphas, train, val, spec, velocity, arch_grad=None):
    """One search step: α's gradient (first order unless `arch_grad` is given) and Adam step,
    then the weight step (SGD with momentum and weight decay, global-norm clip)."""
    first = alpha_grad(net, alphas, val) if arch_grad is None else arch_grad
    a = {k: v.detach().clone().requires_grad_(True) for k, v in alphas.items()}
    b1, b2 = spec["alpha_betas"]
    adam = torch.optim.Adam([a["normal"], a["reduce"]], lr=spec["alpha_lr"], betas=(b1, b2),
                            eps=1e-8, weight_decay=spec["alpha_weight_decay"])
    a["normal"].grad, a["reduce"].grad = first["normal"].clone(), first["reduce"].clone()
    adam.step()
    wn, wr = F.softmax(a["normal"], 1).detach(), F.softmax(a["reduce"], 1).detach()
    names, ws = zip(*net.weights().items())
    for w in ws:
        w.grad = None
    loss = F.cross_entropy(net(train[0], wn, wr), train[1])
    loss.backward()
    torch.nn.utils.clip_grad_norm_(ws, spec["w_grad_clip"])
    sgd = torch.optim.SGD(ws, lr=spec["lr"], momentum=spec["w_momentum"],
                          weight_decay=spec["w_weight_decay"])
    for name, w in zip(names, ws):
        if name in velocity:
            sgd.state[w]["momentum_buffer"] = velocity[name].clone()
    sgd.step()
    return first, {k: v.detach() for k, v in a.items()}, loss.detach()


def widen(tensors):
    """Floating tensors in PyTorch's default dtype (float64 under --float64), others as they are."""
    dtype = torch.get_default_dtype()
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in tensors.items()}


def permuted(batches, seed):
    """The training and the validation batch reordered (labels with their images) by
    `torch.randperm(n, generator=seed)`: the same step, every sum over the batch in another order."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    out = dict(batches)
    for split in ("train", "val"):
        x, y = batches[f"{split}_x"], batches[f"{split}_y"]
        p = torch.randperm(x.shape[0], generator=g).to(x.device)
        out[f"{split}_x"], out[f"{split}_y"] = x[p].contiguous(), y[p].contiguous()
    return out


def step_outputs(inputs, device="cpu", permutation=None):
    """The second-order gradient and one first-order search step from a fixture's inputs."""
    spec = json.load(open(os.path.join(inputs, "spec.json")))
    net = build(spec)
    sd = load_file(os.path.join(inputs, "net.safetensors"), device=device)
    net.load(widen(sd))
    alphas = widen(load_file(os.path.join(inputs, "alphas.safetensors"), device=device))
    velocity = widen(load_file(os.path.join(inputs, "velocity.safetensors"), device=device))
    b = widen(load_file(os.path.join(inputs, "batches.safetensors"), device=device))
    if permutation is not None:
        b = permuted(b, permutation)
    train, val = (b["train_x"], b["train_y"]), (b["val_x"], b["val_y"])
    res = {}
    d, h = second_order(net, alphas, train, val, spec["lr"], velocity, spec["w_momentum"], spec["w_weight_decay"])
    for k in ("normal", "reduce"):
        res[f"second.dalpha.{k}"] = d[k]
        res[f"second.hessian.{k}"] = h[k]
        res[f"second.total.{k}"] = d[k] + h[k] * (-spec["lr"])
    first, after, loss = search_step(net, alphas, train, val, spec, velocity)
    for k in ("normal", "reduce"):
        res[f"first.{k}"] = first[k]
        res[f"alphas_after.{k}"] = after[k]
    res["loss"] = loss.reshape(1)
    for name, t in net.state().items():
        res[f"net_after.{name}"] = t.detach()
    return res


def fixture(inputs, out, device="cpu"):
    res = step_outputs(inputs, device)
    os.makedirs(out, exist_ok=True)
    for f in ("spec.json", "net.safetensors", "alphas.safetensors", "velocity.safetensors", "batches.safetensors"):
        if os.path.abspath(os.path.join(inputs, f)) != os.path.abspath(os.path.join(out, f)):
            shutil.copyfile(os.path.join(inputs, f), os.path.join(out, f))
    meta = {"torch": torch.__version__, "generator": "scripts/torch_reference.py", "device": device,
            "dtype": str(torch.get_default_dtype())}
    if device.startswith("cuda"):
        # PyTorch's defaults, recorded: convolutions through cuDNN may use TF32, matrix products not.
        meta["cudnn_allow_tf32"] = str(torch.backends.cudnn.allow_tf32)
        meta["matmul_allow_tf32"] = str(torch.backends.cuda.matmul.allow_tf32)
        meta["gpu"] = torch.cuda.get_device_name()
    save_file({k: v.contiguous().float().cpu() for k, v in res.items()}, os.path.join(out, "expected.safetensors"),
              metadata=meta)
    return res


# The outputs whose float32 value is not the float64 one to float32 precision: the unheld central
# difference through ReLU kinks and pooling ties, the gradient it enters, and the gradient at
# w' (an activation within last bits of a kink there moves it).
KINK_PRONE = ("second.dalpha.", "second.hessian.", "second.total.")


def output_group(name):
    """The group of an output, as `qdarts_search::parity::check` groups them."""
    if name.startswith("net_after."):
        rest = name[len("net_after."):]
        if ".observer." in rest:
            return "net_after.observers"
        return "net_after.batchnorm" if "running_" in rest else "net_after.weights"
    head, _, last = name.rpartition(".")
    return head if head and last in ("normal", "reduce") else name


def weight_integers(t):
    """A weight's integers on its per-output-channel max|w|/127 grid (round half to even)."""
    rows = t.detach().float().cpu().reshape(t.shape[0], -1)
    m = rows.abs().amax(dim=1, keepdim=True).clamp_min(torch.finfo(torch.float32).eps)
    return torch.round(rows * ((1.0 / m) * 127.0)).clamp(-128, 127).to(torch.int32)


def distances(res, ref, alpha_lr):
    """Per group: the largest |res - ref| over the largest |ref|; the weight integers after the
    step equal to the reference's, of all (conv and classifier weights, as qdarts counts); and
    the entries of α after Adam's step more than `alpha_lr` from the reference's (a first Adam
    step moves each entry by about alpha_lr·sign(gradient): these are the gradient's sign flips)."""
    groups = {}
    for name, r in ref.items():
        d = (res[name].double().cpu() - r.double().cpu()).abs().max().item()
        scale = r.double().abs().max().item()
        e = groups.setdefault(output_group(name), [0.0, 0.0])
        e[0], e[1] = max(e[0], d), max(e[1], scale)
    rel = {g: (d / s if s > 0 else d) for g, (d, s) in groups.items()}
    same = total = 0
    for name, r in ref.items():
        if name.startswith("net_after.") and name.endswith(".weight") and r.dim() >= 2 and "stem_bn" not in name:
            a, b = weight_integers(res[name]), weight_integers(r)
            same += int((a == b).sum().item())
            total += b.numel()
    flipped = sum(int(((res[n].double().cpu() - r.double().cpu()).abs() > alpha_lr).sum().item())
                  for n, r in ref.items() if n.startswith("alphas_after."))
    return rel, same, total, flipped


def spread(inputs, ref, variants, device):
    """The reference's own spread: `variants` copies of the same step with every batch sum in
    another order (the batches permuted by seed 2000 + k) and, for odd k, the convolutions through
    PyTorch's native kernels instead of oneDNN; each one's distance from `ref` by group."""
    alpha_lr = json.load(open(os.path.join(inputs, "spec.json")))["alpha_lr"]
    rows = []
    for k in range(variants):
        onednn = k % 2 == 0
        with torch.backends.mkldnn.flags(enabled=onednn):
            res = step_outputs(inputs, device, permutation=2000 + k)
        rel, same, total, flipped = distances(res, ref, alpha_lr)
        rows.append({"permutation_seed": 2000 + k, "onednn": onednn, "groups": rel,
                     "weights_equal": same, "weights_all": total, "alphas_flipped": flipped})
        print(f"  variant {k}: loss {res['loss'].item():.6f}, {total - same} weight integers apart, "
              f"{flipped} α sign flips", flush=True)
    return alpha_lr, rows


def cmd_fixtures(args):
    torch.manual_seed(0)
    torch.set_num_threads(1)
    if args.device.startswith("cuda"):
        if not torch.cuda.is_available():
            sys.exit(f"--device {args.device}: this PyTorch ({torch.__version__}) sees no CUDA GPU")
        if args.no_tf32:
            torch.backends.cudnn.allow_tf32 = False
            torch.backends.cuda.matmul.allow_tf32 = False
    # Every tensor the step makes lands on the device.
    torch.set_default_device(args.device)
    if args.float64:
        torch.set_default_dtype(torch.float64)
    names = sorted(d for d in os.listdir(args.inputs) if os.path.isfile(os.path.join(args.inputs, d, "spec.json")))
    if not names:
        sys.exit(f"{args.inputs}: no fixture folders (spec.json) found; write them with `qdarts dump-step`")
    if args.with_float32 and not args.float64:
        sys.exit("--with-float32 goes with --float64 (it writes the float32 step beside the float64 one)")
    for name in names:
        res = fixture(os.path.join(args.inputs, name), os.path.join(args.out, name), args.device)
        print(f"{name}: {len(res)} tensors, loss {res['loss'].item():.6f} (torch {torch.__version__})")
        if args.spread:
            alpha_lr, rows = spread(os.path.join(args.inputs, name), res, args.spread, args.device)
            with open(os.path.join(args.out, name, "spread.json"), "w") as f:
                json.dump({"torch": torch.__version__, "generator": "scripts/torch_reference.py --spread",
                           "alpha_lr": alpha_lr, "variants": rows}, f, indent=1)
            print(f"{name}: spread of {len(rows)} variants beside it")
        if args.with_float32:
            torch.set_default_dtype(torch.float32)
            with tempfile.TemporaryDirectory() as tmp:
                res32 = fixture(os.path.join(args.inputs, name), tmp, args.device)
            torch.set_default_dtype(torch.float64)
            kept = {k: v.contiguous().float().cpu() for k, v in res32.items() if k.startswith(KINK_PRONE)}
            save_file(kept, os.path.join(args.out, name, "expected-float32.safetensors"),
                      metadata={"torch": torch.__version__, "generator": "scripts/torch_reference.py",
                                "device": args.device, "dtype": "torch.float32"})
            print(f"{name}: {len(kept)} float32 tensors beside it")


def cmd_bench(args):
    torch.manual_seed(0)
    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        sys.exit(f"--device {args.device}: this PyTorch ({torch.__version__}) sees no CUDA GPU")
    # Every tensor the supernet and the batches make lands on the device.
    torch.set_default_device(args.device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    quant = args.quant == "tensorrt"
    net = SearchNetwork(args.c_in, args.init_channels, 10, args.layers, args.nodes, 3, quant)
    with torch.no_grad():
        for w in net.weights().values():
            w.uniform_(-0.1, 0.1) if w.dim() > 1 else w.zero_()
        for m in net._walk(net, set()):
            if isinstance(m, BN) and m.gamma is not None:
                m.gamma.fill_(1.0)
    n_edges = sum(2 + i for i in range(args.nodes))
    alphas = {k: (1e-3 * torch.randn(n_edges, len(PRIMITIVES))) for k in ("normal", "reduce")}
    batch = lambda: (torch.randn(args.batch, args.c_in, args.size, args.size),
                     torch.randint(0, 10, (args.batch,)))
    train, val = batch(), batch()
    spec = {"alpha_lr": 3e-4, "alpha_betas": [0.5, 0.999], "alpha_weight_decay": 1e-3, "lr": 0.025,
            "w_momentum": 0.9, "w_weight_decay": 3e-4, "w_grad_clip": 5.0}
    velocity = {}
    times = []
    for i in range(args.warmup + args.reps):
        if i == args.warmup and cuda:
            torch.cuda.reset_peak_memory_stats()
        sync()
        t0 = time.perf_counter()
        grad = None
        if args.order == "second":
            d, h = second_order(net, alphas, train, val, 0.025, velocity, 0.9, 3e-4)
            grad = {k: d[k] - 0.025 * h[k] for k in d}
        _, alphas, _ = search_step(net, alphas, train, val, spec, velocity, grad)
        sync()
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    times.sort()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    extra = {"device": args.device}
    if cuda:
        # The caching allocator's peak over the timed steps, as `qdarts bench` reports a GPU
        # backend's pool.
        extra["peak_gpu_mib"] = torch.cuda.max_memory_allocated() / 2**20
        extra["peak_gpu_reserved_mib"] = torch.cuda.max_memory_reserved() / 2**20
        extra["gpu"] = torch.cuda.get_device_name()
    print(json.dumps({
        **extra,
        "torch": torch.__version__, "threads": torch.get_num_threads(), "layers": args.layers,
        "init_channels": args.init_channels, "nodes": args.nodes, "batch": args.batch,
        "c_in": args.c_in, "size": args.size,
        "quant": args.quant, "order": args.order, "reps": args.reps,
        "median_s": times[len(times) // 2], "min_s": times[0], "max_s": times[-1],
        "peak_rss_mib": peak,
    }))


def cmd_bench_ops(args):
    """Milliseconds of forward+backward (sum of the output, gradients of the input and the
    weights) of each candidate op on its own, float and fake-quant, as `qdarts bench ops`."""
    torch.manual_seed(0)
    if args.threads:
        torch.set_num_threads(args.threads)
    x = torch.randn(args.batch, args.channels, args.size, args.size)

    def convs_and_bns(obj, seen):
        if id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, (Conv, BN)):
            yield obj
        values = obj.__dict__.values() if isinstance(obj, Net) else obj if isinstance(obj, list) else []
        for v in values:
            yield from convs_and_bns(v, seen)

    def time_op(op):
        with torch.no_grad():
            for m in convs_and_bns(op, set()):
                for k, w in m.params().items():
                    w.uniform_(-0.1, 0.1) if w.dim() > 1 else w.fill_(k.endswith("gamma"))
        times = []
        for i in range(args.warmup + args.reps):
            t0 = time.perf_counter()
            xg = x.clone().requires_grad_()
            out = op((xg, None))[0]  # an unquantized input, as qdarts' bench feeds
            if out.requires_grad:
                out.sum().backward()
            if i >= args.warmup:
                times.append(time.perf_counter() - t0)
        times.sort()
        return times[len(times) // 2] * 1e3

    for stride in (1, 2):
        for p in PRIMITIVES:
            row = {"op": p, "stride": stride}
            for quant in (False, True):
                op = make_op(p, args.channels, stride, f"bench.{p}", quant)
                row["quant_ms" if quant else "float_ms"] = time_op(op)
            print(json.dumps(row), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fixtures", help="the reference outputs of qdarts' dumped search steps")
    f.add_argument("--out", required=True)
    f.add_argument("--inputs", default=DEFAULT_INPUTS)
    f.add_argument("--device", default="cpu",
                   help="cpu, cuda or cuda:N: the same step on that GPU (PyTorch's TF32 defaults)")
    f.add_argument("--no-tf32", action="store_true", help="on a GPU, full float32 everywhere")
    f.add_argument("--float64", action="store_true",
                   help="the same step in double precision (written as float32): what float32 "
                        "rounding does to either side, for a difference qdarts and PyTorch share")
    f.add_argument("--spread", type=int, default=0, metavar="K",
                   help="also K variants of each step with its sums in another order (spread.json)")
    f.add_argument("--with-float32", action="store_true",
                   help="with --float64: also the float32 step's kink-prone outputs, "
                        "expected-float32.safetensors")
    b = sub.add_parser("bench", help="seconds per search step of the same supernet")
    b.add_argument("--layers", type=int, default=8)
    b.add_argument("--init-channels", type=int, default=16)
    b.add_argument("--nodes", type=int, default=4)
    b.add_argument("--batch", type=int, default=64)
    b.add_argument("--c-in", type=int, default=3, help="image channels (the default search: 1)")
    b.add_argument("--size", type=int, default=32, help="image side (the default search: 28)")
    b.add_argument("--quant", choices=["float", "tensorrt"], default="float")
    b.add_argument("--order", choices=["first", "second"], default="first")
    b.add_argument("--reps", type=int, default=3)
    b.add_argument("--warmup", type=int, default=1)
    b.add_argument("--threads", type=int, default=0, help="torch threads (0: PyTorch's default)")
    b.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (eager PyTorch on that GPU)")
    o = sub.add_parser("bench-ops", help="milliseconds of forward+backward of each candidate op")
    o.add_argument("--batch", type=int, default=32)
    o.add_argument("--channels", type=int, default=16)
    o.add_argument("--size", type=int, default=32)
    o.add_argument("--reps", type=int, default=5)
    o.add_argument("--warmup", type=int, default=1)
    o.add_argument("--threads", type=int, default=0, help="torch threads (0: PyTorch's default)")
    args = ap.parse_args()
    {"fixtures": cmd_fixtures, "bench": cmd_bench, "bench-ops": cmd_bench_ops}[args.cmd](args)


if __name__ == "__main__":
    main()
