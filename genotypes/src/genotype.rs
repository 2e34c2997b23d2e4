//! `Genotype`: a discrete DARTS cell pair, as pt.darts and DARTS define it.
//!
//! `normal[i]` lists the incoming edges of intermediate node `i` (nodes 0 and 1 are the cell
//! inputs, so node `i` is state `i + 2` and may read states `0..i+2`); `*_concat` lists the
//! states concatenated into the cell output.

use serde::{Deserialize, Serialize};

use crate::error::GenotypeError;
use crate::primitive::Primitive;

/// One incoming edge: an op applied to an earlier state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "(Primitive, usize)", into = "(Primitive, usize)")]
pub struct Edge {
    /// The op.
    pub op: Primitive,
    /// The input state (0, 1: cell inputs; 2..: intermediate nodes).
    pub input: usize,
}

impl From<(Primitive, usize)> for Edge {
    fn from((op, input): (Primitive, usize)) -> Self {
        Edge { op, input }
    }
}

impl From<Edge> for (Primitive, usize) {
    fn from(e: Edge) -> Self {
        (e.op, e.input)
    }
}

/// The bit widths of one kept op: its weights and its activations (2 to 8 bits each), as a
/// bit-width search derives them. JSON: `[weight, act]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "[u8; 2]", into = "[u8; 2]")]
pub struct Bits {
    /// Weight bits.
    pub weight: u8,
    /// Activation bits.
    pub act: u8,
}

impl From<[u8; 2]> for Bits {
    fn from([weight, act]: [u8; 2]) -> Self {
        Bits { weight, act }
    }
}

impl From<Bits> for [u8; 2] {
    fn from(b: Bits) -> Self {
        [b.weight, b.act]
    }
}

impl std::fmt::Display for Bits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "w{}a{}", self.weight, self.act)
    }
}

/// A normal cell and a reduction cell, and (from a bit-width search) the bits of each kept op.
///
/// The DARTS text form carries no bits, so that pt.darts still reads it; `genotype.json`
/// carries them as `normal_bits` / `reduce_bits`, one `[weight, act]` per edge, node by node.
///
/// JSON: `{"normal": [[["sep_conv_3x3", 0], ["sep_conv_3x3", 1]], ...], "normal_concat":
/// [2, 3, 4, 5], "reduce": [...], "reduce_concat": [2, 3, 4, 5]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Genotype {
    /// Incoming edges of each intermediate node of the normal cell.
    pub normal: Vec<Vec<Edge>>,
    /// States concatenated into the normal cell's output.
    pub normal_concat: Vec<usize>,
    /// Incoming edges of each intermediate node of the reduction cell.
    pub reduce: Vec<Vec<Edge>>,
    /// States concatenated into the reduction cell's output.
    pub reduce_concat: Vec<usize>,
    /// Bits of the normal cell's kept ops, shaped as `normal` (absent: the config's bits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub normal_bits: Option<Vec<Vec<Bits>>>,
    /// Bits of the reduction cell's kept ops, shaped as `reduce`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reduce_bits: Option<Vec<Vec<Bits>>>,
}

fn check_bits(
    name: &str,
    nodes: &[Vec<Edge>],
    bits: Option<&Vec<Vec<Bits>>>,
) -> Result<(), GenotypeError> {
    let Some(bits) = bits else { return Ok(()) };
    let shape = |c: &[Vec<Edge>]| c.iter().map(Vec::len).collect::<Vec<_>>();
    let bshape: Vec<usize> = bits.iter().map(Vec::len).collect();
    if bshape != shape(nodes) {
        return Err(GenotypeError::Invalid(format!(
            "`{name}_bits` has {bshape:?} entries per node, but `{name}` has {:?} edges",
            shape(nodes)
        )));
    }
    if let Some(b) =
        bits.iter().flatten().find(|b| !(2..=8).contains(&b.weight) || !(2..=8).contains(&b.act))
    {
        return Err(GenotypeError::Invalid(format!(
            "`{name}_bits` holds {b}: weight and activation bits must be 2 to 8"
        )));
    }
    Ok(())
}

/// The most intermediate nodes a cell may have (DARTS uses 4; the network's width grows with
/// the concatenated nodes, so a much larger cell cannot be built anyway).
pub const MAX_NODES: usize = 64;

/// The most incoming edges one node may have (DARTS keeps 2).
pub const MAX_EDGES: usize = 16;

fn check_cell(name: &str, nodes: &[Vec<Edge>], concat: &[usize]) -> Result<(), GenotypeError> {
    if nodes.is_empty() {
        return Err(GenotypeError::Invalid(format!("`{name}` has no nodes")));
    }
    if nodes.len() > MAX_NODES {
        return Err(GenotypeError::Invalid(format!(
            "`{name}` has {} nodes; at most {MAX_NODES} are supported",
            nodes.len()
        )));
    }
    for (i, edges) in nodes.iter().enumerate() {
        if edges.is_empty() {
            return Err(GenotypeError::Invalid(format!("`{name}` node {} has no edges", i + 2)));
        }
        if edges.len() > MAX_EDGES {
            return Err(GenotypeError::Invalid(format!(
                "`{name}` node {} has {} edges; at most {MAX_EDGES} are supported",
                i + 2,
                edges.len()
            )));
        }
        for e in edges {
            if e.input >= i + 2 {
                return Err(GenotypeError::Invalid(format!(
                    "`{name}` node {} reads state {}, but only states 0..{} exist before it",
                    i + 2,
                    e.input,
                    i + 1
                )));
            }
        }
    }
    let states = nodes.len() + 2;
    if concat.is_empty() {
        return Err(GenotypeError::Invalid(format!("`{name}_concat` is empty")));
    }
    if let Some(&s) = concat.iter().find(|&&s| s >= states) {
        return Err(GenotypeError::Invalid(format!(
            "`{name}_concat` names state {s}, but the cell has states 0..{}",
            states - 1
        )));
    }
    let mut seen = vec![false; states];
    for &s in concat {
        if std::mem::replace(&mut seen[s], true) {
            return Err(GenotypeError::Invalid(format!("`{name}_concat` names state {s} twice")));
        }
    }
    Ok(())
}

impl Genotype {
    /// Checks that every edge reads an earlier state and every concatenated state exists.
    pub fn validate(&self) -> Result<(), GenotypeError> {
        check_cell("normal", &self.normal, &self.normal_concat)?;
        check_cell("reduce", &self.reduce, &self.reduce_concat)?;
        check_bits("normal", &self.normal, self.normal_bits.as_ref())?;
        check_bits("reduce", &self.reduce, self.reduce_bits.as_ref())
    }

    /// Reads JSON, validated.
    pub fn from_json(text: &str) -> Result<Self, GenotypeError> {
        let g: Genotype =
            serde_json::from_str(text).map_err(|e| GenotypeError::Json(e.to_string()))?;
        g.validate()?;
        Ok(g)
    }

    /// Writes pretty JSON.
    pub fn to_json(&self) -> Result<Vec<u8>, GenotypeError> {
        let mut v =
            serde_json::to_vec_pretty(self).map_err(|e| GenotypeError::Json(e.to_string()))?;
        v.push(b'\n');
        Ok(v)
    }

    /// Reads the DARTS text form (pt.darts' nested lists or the original flat list), validated.
    pub fn from_darts_text(text: &str) -> Result<Self, GenotypeError> {
        let g = crate::text::parse(text)?;
        g.validate()?;
        Ok(g)
    }

    /// Writes the pt.darts text form, on one line:
    /// `Genotype(normal=[[('sep_conv_3x3', 0), ...], ...], normal_concat=range(2, 6), ...)`.
    pub fn to_darts_text(&self) -> String {
        crate::text::write(self)
    }

    /// The share of the normal cell's kept edges whose op has no weights (pooling,
    /// skip_connect): the symptom of DARTS' collapse when it passes one half.
    pub fn param_free_share(&self) -> f64 {
        let edges: Vec<&Edge> = self.normal.iter().flatten().collect();
        if edges.is_empty() {
            return 0.0;
        }
        edges.iter().filter(|e| !e.op.has_weights()).count() as f64 / edges.len() as f64
    }

    /// The collapse alert: a line saying so when more than half of the normal cell's kept
    /// edges are parameter-free, else `None`.
    pub fn collapse_alert(&self) -> Option<String> {
        let share = self.param_free_share();
        (share > 0.5).then(|| {
            let n = self.normal.iter().flatten().count();
            let free = (share * n as f64).round() as usize;
            format!(
                "collapse: {free} of the normal cell's {n} edges are parameter-free (pooling or \
                 skip_connect); see the collapse guards in [search.guards]"
            )
        })
    }

    /// The op names used by this genotype, sorted and deduplicated.
    pub fn primitives(&self) -> Vec<Primitive> {
        let mut ops: Vec<Primitive> =
            self.normal.iter().chain(&self.reduce).flatten().map(|e| e.op).collect();
        ops.sort();
        ops.dedup();
        ops
    }
}
