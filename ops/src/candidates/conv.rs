//! `QConv`: a bias-free 2-D convolution with a fake-quantized weight (the building block of the
//! conv candidate ops; BN follows it).

use burn::module::{Module, Param};
use burn::tensor::ops::ConvOptions;
use burn::tensor::{Distribution, Tensor};

use super::common::{Ctx, Pass, QuantSites};
use crate::qconfig::Site;
use crate::quant::QuantPass;
use crate::quant::hold::relu_held;
use crate::quant::{BitMix, FakeQuantizer, Grid, RoundMode, SpecError};
use qdarts_kernels::depthwise_conv::conv2d;
use qdarts_kernels::direct_conv::{GroupInputs, conv2d_reading_relu, direct_available};

/// The geometry of a convolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvShape {
    /// Input channels.
    pub c_in: usize,
    /// Output channels.
    pub c_out: usize,
    /// Kernel `[kh, kw]`.
    pub kernel: [usize; 2],
    /// Stride `[sh, sw]`.
    pub stride: [usize; 2],
    /// Zero padding `[ph, pw]` on both sides.
    pub padding: [usize; 2],
    /// Dilation (both axes).
    pub dilation: usize,
    /// Groups (`c_in` for depthwise).
    pub groups: usize,
}

impl ConvShape {
    /// A square `k×k` convolution.
    pub fn square(c_in: usize, c_out: usize, k: usize, stride: usize, padding: usize) -> Self {
        ConvShape {
            c_in,
            c_out,
            kernel: [k, k],
            stride: [stride, stride],
            padding: [padding, padding],
            dilation: 1,
            groups: 1,
        }
    }
}

/// The derived quantization of a bias added to an integer accumulator: one accumulator unit per
/// channel (`s_w,c·s_in`, detached) as the factors of its product, and the rounding.
#[derive(Debug, Clone)]
pub struct Bias {
    /// The factors of one accumulator unit, multiplied in order, each `[L]` for an `L` that
    /// divides `C`: value `i` for channels `i·C/L .. (i + 1)·C/L` (`[C]` one per channel, `[1]`
    /// the same for every channel, `[R]` one per row of `R` rows of channels). Kept apart so
    /// that a kernel can take the product where it is used, rather than a launch per product.
    pub factors: Vec<Tensor<1>>,
    /// Rounding of `bias/unit`.
    pub round: RoundMode,
}

impl Bias {
    /// One accumulator unit per channel, `[channels]`: the factors' product (where every
    /// factor is `[channels]` or `[1]`, the `[1]` product broadcast as a view).
    ///
    /// # Panics
    /// Without factors.
    pub fn unit(&self, channels: usize) -> Tensor<1> {
        let per_channel = |f: &Tensor<1>| {
            let l = f.dims()[0];
            match l {
                1 => f.clone(),
                _ if l == channels => f.clone(),
                _ => f.clone().reshape([l, 1]).expand([l, channels / l]).reshape([channels]),
            }
        };
        let mut factors = self.factors.iter().map(per_channel);
        let first = factors.next().expect("a bias unit has one factor at least");
        let unit = factors.fold(first, |u, f| u.mul(f));
        if unit.dims()[0] == channels { unit } else { unit.expand([channels]) }
    }
}

/// Conv2d without bias whose weight is fake-quantized per output channel.
#[derive(Module, Debug)]
pub struct QConv {
    /// Weight `[c_out, c_in/groups, kh, kw]`.
    pub weight: Param<Tensor<4>>,
    /// Weight quantizer (`<path>.weight`).
    pub wq: Option<FakeQuantizer>,
    /// Under a bit-width search, one weight quantizer per candidate width (`<path>.weight.w<b>`).
    pub wmix: Option<BitMix>,
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: usize,
    groups: usize,
}

impl QConv {
    /// A convolution at `ctx.path`, initialised as PyTorch's Conv2d (uniform ±1/sqrt(fan_in)).
    pub fn new(shape: ConvShape, ctx: &Ctx) -> Result<Self, SpecError> {
        let fan_in = shape.c_in / shape.groups * shape.kernel[0] * shape.kernel[1];
        let bound = 1.0 / (fan_in as f64).sqrt();
        // Drawn now, not lazily at the first forward as burn's Initializer does, so that a
        // caller that seeds the device gets its draws in construction order; on the host, so
        // that every backend gets the same numbers.
        let weight = Param::from_tensor(qdarts_kernels::devices::random(
            [shape.c_out, shape.c_in / shape.groups, shape.kernel[0], shape.kernel[1]],
            Distribution::Uniform(-bound, bound),
            ctx.device,
        ));
        Ok(QConv {
            weight,
            wq: ctx.quantizer(Site::Weight, "weight", shape.c_out)?,
            wmix: ctx.bit_mix(Site::Weight, "weight", shape.c_out)?,
            stride: shape.stride,
            padding: shape.padding,
            dilation: shape.dilation,
            groups: shape.groups,
        })
    }

    /// The weight as the forward pass uses it (fake-quantized when quantized).
    pub fn effective_weight(&self) -> Tensor<4> {
        self.weight_held(QuantPass::OFF)
    }

    /// [`effective_weight`](Self::effective_weight) in the quantizer pass `qp`.
    fn weight_held(&self, qp: QuantPass) -> Tensor<4> {
        match &self.wq {
            Some(q) => q.forward_in(self.weight.val(), qp).0,
            None => self.weight.val(),
        }
    }

    /// The convolution options.
    pub fn options(&self) -> ConvOptions<2> {
        ConvOptions::new(self.stride, self.padding, [self.dilation; 2], self.groups)
    }

    /// # Shapes
    /// - x: `[N, c_in, H, W]`
    /// - output: `[N, c_out, H', W']`, `H' = (H + 2p − d(k − 1) − 1)/s + 1`
    pub fn forward(&self, x: Tensor<4>) -> Tensor<4> {
        conv2d(x, self.effective_weight(), self.options())
    }

    /// [`forward`](Self::forward) in the pass `pass`: under a bit-width search, with the
    /// softmax over the candidate weight widths, EdMIPS' composite convolution, one
    /// convolution of the mixed quantized weight.
    pub fn forward_mixed(&self, x: Tensor<4>, pass: Pass<Tensor<1>>) -> Tensor<4> {
        match (&self.wmix, pass.bits) {
            (Some(m), Some(p)) => {
                conv2d(x, m.forward(self.weight.val(), p.clone(), pass.quant), self.options())
            }
            _ => conv2d(x, self.weight_held(pass.quant), self.options()),
        }
    }

    /// Multiply-accumulates per image on an `h×w` input, and the output's `(h, w)`.
    pub fn macs(&self, h: usize, w: usize) -> (u64, (usize, usize)) {
        let [c_out, c_in_g, kh, kw] = self.weight.val().dims();
        let out = |n: usize, k: usize, i: usize| {
            (n + 2 * self.padding[i] - self.dilation * (k - 1) - 1) / self.stride[i] + 1
        };
        let (ho, wo) = (out(h, kh, 0), out(w, kw, 1));
        ((c_out * c_in_g * kh * kw * ho * wo) as u64, (ho, wo))
    }

    /// Number of weights.
    pub fn params(&self) -> u64 {
        self.weight.val().shape().num_elements() as u64
    }

    /// [`forward`](Self::forward) of an input on the grid `input`, also returning the value of
    /// one accumulator unit per output channel, `s_in·s_w,c` (detached), when both the input
    /// and the weight are quantized: the derived scale of a bias added to this conv's output.
    /// Under a bit-width search (the pass's widths) there is no single weight grid and no
    /// unit.
    pub fn forward_unit(
        &self,
        x: Tensor<4>,
        input: Option<&Grid>,
        pass: Pass<Tensor<1>>,
    ) -> (Tensor<4>, Option<Bias>) {
        self.unit_with(x, input, pass, false)
    }

    /// [`forward_unit`](Self::forward_unit) of `relu(x)` as [`relu_held`] takes it on the
    /// grid `input`. Where the convolution kernels run ([`direct_available`]), the grid is not
    /// held and no bit-width search mixes the weight, they take the ReLU as they read `x`
    /// ([`conv2d_reading_relu`]): the same values, one launch fewer forward and backward.
    pub fn forward_unit_relu(
        &self,
        x: Tensor<4>,
        input: Option<&Grid>,
        pass: Pass<Tensor<1>>,
    ) -> (Tensor<4>, Option<Bias>) {
        let held = input.is_some_and(Grid::is_held);
        let mixed = self.wmix.is_some() && pass.bits.is_some();
        if held || mixed || !direct_available(&x.device(), x.dtype()) {
            return self.forward_unit(relu_held(x, input), input, pass);
        }
        self.unit_with(x, input, pass, true)
    }

    /// [`forward_unit`](Self::forward_unit), of `relu(x)` taken on read with `relu`.
    fn unit_with(
        &self,
        x: Tensor<4>,
        input: Option<&Grid>,
        pass: Pass<Tensor<1>>,
        relu: bool,
    ) -> (Tensor<4>, Option<Bias>) {
        let conv = |x, w| match relu {
            true => conv2d_reading_relu(x, w, self.options(), GroupInputs::own(self.groups)),
            false => conv2d(x, w, self.options()),
        };
        match (&self.wq, input) {
            (Some(q), Some(ig)) => {
                let (w, g) = q.forward_in(self.weight.val(), pass.quant);
                let held = g.is_held() || ig.is_held();
                // `s_w·s_in`, multiplied where it is used.
                let factors = vec![g.step.detach(), ig.step.clone().detach()];
                let y = conv(x, w);
                let bias = (!held).then(|| Bias { factors, round: q.spec().round() });
                (y, bias)
            }
            _ if relu => (conv(x, self.weight_held(pass.quant)), None),
            _ => (self.forward_mixed(x, pass), None),
        }
    }
}

/// Convolutions applied one after another, each reading the previous one's output (ReLU, BN
/// and quantizers between them change no shape): what a bit-width search's cost counts.
pub trait ConvChain {
    /// The convolutions in order.
    fn chain(&self) -> Vec<&QConv>;

    /// Multiply-accumulates per image on an `h×w` input, and the output's `(h, w)`.
    fn macs(&self, h: usize, w: usize) -> (u64, (usize, usize)) {
        self.chain().iter().fold((0, (h, w)), |(m, (h, w)), c| {
            let (mc, out) = c.macs(h, w);
            (m + mc, out)
        })
    }

    /// Number of conv weights.
    fn params(&self) -> u64 {
        self.chain().iter().map(|c| c.params()).sum()
    }
}

impl QuantSites for QConv {
    fn quantizers(&self) -> Vec<&FakeQuantizer> {
        let mut q: Vec<&FakeQuantizer> = self.wq.iter().collect();
        q.extend(self.wmix.iter().flat_map(|m| &m.quantizers));
        q
    }
}
