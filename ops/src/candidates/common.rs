//! What every candidate op shares: the quantized activation type, the build context, and the
//! visitor over quantizers.

use burn::module::{Flag, Module, ModuleVisitor, Param, ParamId};
use burn::tensor::{Device, Tensor};

use crate::qconfig::{QuantConfig, Site};
use crate::quant::hold::relu_held;
use crate::quant::{
    BitMix, ErrorTape, FakeQuantizer, Grid, QuantError, QuantPass, SpecError, TensorRole,
};

/// An activation and the grid its values lie on (`None`: float).
#[derive(Debug, Clone)]
pub struct QTensor {
    /// The (fake-quantized) values, `[N, C, H, W]`.
    pub value: Tensor<4>,
    /// Their quantization grid.
    pub grid: Option<Grid>,
}

impl QTensor {
    /// A float activation.
    pub fn float(value: Tensor<4>) -> Self {
        QTensor { value, grid: None }
    }

    /// The activation's shape.
    pub fn dims(&self) -> [usize; 4] {
        self.value.dims()
    }

    /// The ReLU of the activation, on its grid (a ReLU of values on a grid is on it: the grid
    /// holds 0); on a held grid with the mask at `w` ([`relu_held`]).
    pub fn relu(self) -> QTensor {
        QTensor { value: relu_held(self.value, self.grid.as_ref()), grid: self.grid }
    }
}

/// Applies an optional quantizer in the quantizer pass `qp`; `None` leaves the tensor float.
pub fn quantize_opt(q: &Option<FakeQuantizer>, x: Tensor<4>, qp: QuantPass) -> QTensor {
    match q {
        Some(q) => {
            let (value, grid) = q.forward_in(x, qp);
            QTensor { value, grid: Some(grid) }
        }
        None => QTensor::float(x),
    }
}

/// A site quantized at one width or mixed over several (a bit-width search): with the pass's
/// widths (the softmax over the mix's widths) the mix runs and the result lies on no single
/// grid.
pub fn quantize_site(
    q: &Option<FakeQuantizer>,
    mix: &Option<BitMix>,
    x: Tensor<4>,
    pass: Pass<Tensor<1>>,
) -> QTensor {
    match (mix, pass.bits) {
        (Some(m), Some(p)) => QTensor::float(m.forward(x, p.clone(), pass.quant)),
        _ => quantize_opt(q, x, pass.quant),
    }
}

/// What one forward pass carries besides its tensors: what its quantizers do besides
/// quantizing ([`QuantPass`]: held rounding, error statistics, the kernel) and, under a
/// bit-width search, the softmaxes over the candidate widths (`B`: a network's, an edge's or an
/// op's). Passed through `forward`, so that nothing of a pass is set on a module and shared by
/// its copies.
#[derive(Debug)]
pub struct Pass<'a, B = BitProbs> {
    /// What the quantizers do besides quantizing.
    pub quant: QuantPass<'a>,
    /// The bit-width softmaxes, with a bit-width search.
    pub bits: Option<&'a B>,
}

impl<B> Clone for Pass<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B> Copy for Pass<'_, B> {}

impl<B> Default for Pass<'_, B> {
    fn default() -> Self {
        Pass { quant: QuantPass::OFF, bits: None }
    }
}

impl<'a, B> Pass<'a, B> {
    /// A pass whose quantizers do as `quant` says, without bit widths to mix.
    pub fn quantizing(quant: QuantPass<'a>) -> Self {
        Pass { quant, bits: None }
    }

    /// A pass mixing the widths `bits`, its quantizers doing nothing else.
    pub fn mixing(bits: Option<&'a B>) -> Self {
        Pass { quant: QuantPass::OFF, bits }
    }

    /// This pass, one level down: the same quantizer pass with that level's bit widths.
    pub fn with_bits<'b, C>(self, bits: Option<&'b C>) -> Pass<'b, C>
    where
        'a: 'b,
    {
        Pass { quant: self.quant, bits }
    }
}

impl<'a> Pass<'a> {
    /// The pass for an op's weights: the softmax over the weight widths.
    pub fn weight(self) -> Pass<'a, Tensor<1>> {
        self.with_bits(self.bits.map(|b| &b.weight))
    }

    /// The pass for an op's activations: the softmax over the activation widths.
    pub fn act(self) -> Pass<'a, Tensor<1>> {
        self.with_bits(self.bits.map(|b| &b.act))
    }
}

/// The bit widths of an op's weights and activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OpBits<'a> {
    /// As the quantization config says.
    #[default]
    Config,
    /// The config's specs at these widths (the per-op bits of a derived genotype).
    Fixed {
        /// Weight bits.
        weight: u32,
        /// Activation bits.
        act: u32,
    },
    /// A bit-width search over these widths (EdMIPS): weight and activation sites get a
    /// [`BitMix`] instead of one quantizer.
    Search {
        /// Candidate weight widths.
        weight: &'a [u32],
        /// Candidate activation widths.
        act: &'a [u32],
    },
}

/// The softmaxes over one op's candidate widths that a bit-width search mixes with.
#[derive(Debug, Clone)]
pub struct BitProbs {
    /// Over the weight widths, `[Bw]`.
    pub weight: Tensor<1>,
    /// Over the activation widths, `[Ba]`.
    pub act: Tensor<1>,
}

/// Where an op is built: the quantization config, the op type (for per-op overrides), its layer
/// path, its device, and the bit widths of its weights and activations.
#[derive(Debug, Clone)]
pub struct Ctx<'a> {
    /// Quantization config.
    pub cfg: &'a QuantConfig,
    /// Op type name, e.g. `sep_conv_3x3`.
    pub op: &'a str,
    /// Layer path of the op, e.g. `cells.3.edges.5.sep_conv_3x3`.
    pub path: String,
    /// Device.
    pub device: &'a Device,
    /// Bit widths of the weight and activation sites (mixing weights keep the config's).
    pub bits: OpBits<'a>,
}

impl<'a> Ctx<'a> {
    /// A context at the config's bit widths.
    pub fn new(
        cfg: &'a QuantConfig,
        op: &'a str,
        path: impl Into<String>,
        device: &'a Device,
    ) -> Self {
        Ctx { cfg, op, path: path.into(), device, bits: OpBits::Config }
    }

    /// The same context at other bit widths.
    pub fn with_bits(self, bits: OpBits<'a>) -> Self {
        Ctx { bits, ..self }
    }

    fn role(site: Site) -> TensorRole {
        match site {
            Site::Weight => TensorRole::Weight,
            Site::Act => TensorRole::Act,
            Site::Mix => TensorRole::Mix,
        }
    }

    /// A context for a sub-layer at `path.name`.
    pub fn child(&self, name: &str) -> Ctx<'a> {
        Ctx { path: format!("{}.{name}", self.path), ..self.clone() }
    }

    /// The quantizer of a site at `path.name` (`None` when the config leaves it float, or
    /// when a bit-width search mixes the site: see [`Ctx::bit_mix`]).
    pub fn quantizer(
        &self,
        site: Site,
        name: &str,
        channels: usize,
    ) -> Result<Option<FakeQuantizer>, SpecError> {
        let path = format!("{}.{name}", self.path);
        let Some(spec) = self.cfg.spec_for(self.op, site)? else { return Ok(None) };
        let spec = match (self.bits, site) {
            (_, Site::Mix) | (OpBits::Config, _) => spec,
            (OpBits::Search { .. }, _) => return Ok(None),
            (OpBits::Fixed { weight, .. }, Site::Weight) => spec.at_bits(weight)?,
            (OpBits::Fixed { act, .. }, Site::Act) => spec.at_bits(act)?,
        };
        FakeQuantizer::new(spec, path, Self::role(site), channels, self.device).map(Some)
    }

    /// Under a bit-width search, the quantizers of a weight or activation site at `path.name`,
    /// one per candidate width; otherwise `None` (and [`Ctx::quantizer`] gives the site's one).
    pub fn bit_mix(
        &self,
        site: Site,
        name: &str,
        channels: usize,
    ) -> Result<Option<BitMix>, SpecError> {
        let OpBits::Search { weight, act } = self.bits else { return Ok(None) };
        let bits = match site {
            Site::Weight => weight,
            Site::Act => act,
            Site::Mix => return Ok(None),
        };
        let Some(spec) = self.cfg.spec_for(self.op, site)? else { return Ok(None) };
        let path = format!("{}.{name}", self.path);
        BitMix::new(spec, bits, &path, Self::role(site), channels, self.device).map(Some)
    }

    /// The per-tensor quantizer of a folded BatchNorm weight at `path.name`.
    pub fn bn_quantizer(&self, name: &str) -> Result<Option<FakeQuantizer>, SpecError> {
        let path = format!("{}.{name}", self.path);
        let Some(spec) = self.cfg.bn_weight(self.op)? else { return Ok(None) };
        // Under a bit-width search the multiplier keeps the config's width.
        let spec = match self.bits {
            OpBits::Fixed { weight, .. } => spec.at_bits(weight)?,
            _ => spec,
        };
        FakeQuantizer::new(spec, path, TensorRole::Weight, 1, self.device).map(Some)
    }
}

/// A module that owns quantizers: the visitor that collects their error rows.
pub trait QuantSites {
    /// Every quantizer of the module, in a stable order.
    fn quantizers(&self) -> Vec<&FakeQuantizer>;

    /// The error rows of every quantizer that recorded a tensor on `tape`, in the stable
    /// order.
    fn quant_stats(&self, tape: &ErrorTape) -> Result<Vec<QuantError>, SpecError> {
        let mut rows = Vec::new();
        for q in self.quantizers() {
            rows.extend(q.error_rows(tape)?);
        }
        Ok(rows)
    }
}

/// The quantizers that Burn's traversal of `m` reaches (the ones its records save), each by
/// the id of its `training` flag, in traversal order.
///
/// [`QuantSites`] impls are written by hand, so a quantizer left out of one would silently
/// miss its error rows and LSQ initialisation; [`check_quant_sites`] holds an impl to
/// this list.
pub fn visited_quantizers<M: Module>(m: &M) -> Vec<ParamId> {
    struct Visitor {
        path: Vec<(String, String)>,
        found: Vec<ParamId>,
    }
    impl ModuleVisitor for Visitor {
        fn enter_module(&mut self, name: &str, container_type: &str) {
            self.path.push((name.to_string(), container_type.to_string()));
        }
        fn exit_module(&mut self, _name: &str, _container_type: &str) {
            self.path.pop();
        }
        fn visit_flag(&mut self, flag: &Param<Flag>) {
            // `FakeQuantizer::training`, and no other flag.
            if let Some((name, container)) = self.path.last()
                && name == "training"
                && container == "Struct:FakeQuantizer"
            {
                self.found.push(flag.id);
            }
        }
    }
    let mut v = Visitor { path: Vec::new(), found: Vec::new() };
    m.visit(&mut v);
    v.found
}

/// Checks that `m`'s [`QuantSites::quantizers`] lists every quantizer Burn's traversal of `m`
/// reaches, each once, and nothing else ([`visited_quantizers`]). Returns their number, or
/// what differs.
pub fn check_quant_sites<M: Module + QuantSites>(m: &M) -> Result<usize, String> {
    let listed: Vec<(ParamId, String)> =
        m.quantizers().iter().map(|q| (q.training.id, q.path().to_string())).collect();
    let visited = visited_quantizers(m);
    let mut seen = std::collections::HashSet::new();
    if let Some((_, path)) = listed.iter().find(|(id, _)| !seen.insert(*id)) {
        return Err(format!("{path} is listed twice"));
    }
    if let Some((_, path)) = listed.iter().find(|(id, _)| !visited.contains(id)) {
        return Err(format!("{path} is listed but not a field of the module tree"));
    }
    let missing = visited.iter().filter(|id| !seen.contains(*id)).count();
    if missing > 0 {
        return Err(format!(
            "{missing} of the module's {} quantizers are not listed (listed: {})",
            visited.len(),
            listed.iter().map(|(_, p)| p.as_str()).collect::<Vec<_>>().join(", ")
        ));
    }
    Ok(listed.len())
}

/// Collects the quantizers of optional bit mixes.
pub fn mixes<'a>(ms: impl IntoIterator<Item = &'a Option<BitMix>>) -> Vec<&'a FakeQuantizer> {
    ms.into_iter().flatten().flat_map(|m| &m.quantizers).collect()
}

/// Collects the quantizers of optional sites.
pub fn sites<'a>(
    qs: impl IntoIterator<Item = &'a Option<FakeQuantizer>>,
) -> Vec<&'a FakeQuantizer> {
    qs.into_iter().flatten().collect()
}
