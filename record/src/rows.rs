//! The CSV tables of a run, one typed row each. A row type knows its file, its columns (the
//! header, in order) and whether its second column is the global step; its fields are written
//! with a fixed number format so that a run's files are byte-for-byte reproducible.

pub use crate::quant_error::{QuantError, QuantErrorRow, TensorRole};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize, Serializer};

/// A CSV table of the run record.
pub trait Table: Serialize + DeserializeOwned {
    /// The file name inside the run folder.
    const FILE: &'static str;
    /// The header, in column order.
    const COLUMNS: &'static [&'static str];
    /// Whether the second column is the global step, so that a resume can cut the table back
    /// to a checkpoint taken inside an epoch (else only whole epochs are kept).
    const STEPPED: bool;
}

/// Which pass a metrics row reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// One training step: its loss and the epoch's running top-1.
    Train,
    /// The end-of-epoch validation (search: the α split; training: the test set).
    Val,
}

/// `metrics.csv`: a `train` row per step and a `val` row per epoch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricsRow {
    /// Epoch (0-based).
    pub epoch: usize,
    /// Global step (1-based; on a `val` row the last step of the epoch).
    pub step: usize,
    /// Train or val.
    pub phase: Phase,
    /// Loss.
    #[serde(serialize_with = "fixed6")]
    pub loss: f64,
    /// Top-1 (a `train` row: running over the epoch so far).
    #[serde(serialize_with = "fixed6")]
    pub top1: f64,
    /// Weight learning rate.
    #[serde(serialize_with = "fixed6")]
    pub lr: f64,
    /// Architecture learning rate; 0 (written `0`) for runs without an architecture step.
    #[serde(serialize_with = "fixed6_or_zero")]
    pub arch_lr: f64,
    /// Wall-clock seconds since the (re)start of the writing process.
    #[serde(serialize_with = "fixed3")]
    pub seconds: f64,
}

impl Table for MetricsRow {
    const FILE: &'static str = "metrics.csv";
    const COLUMNS: &'static [&'static str] =
        &["epoch", "step", "phase", "loss", "top1", "lr", "arch_lr", "seconds"];
    const STEPPED: bool = true;
}

/// Where a non-finite value was found, or what a bookkeeping row of the guard is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NanSite {
    /// The training loss.
    Loss,
    /// A weight gradient (the layer names the first non-finite one).
    Grad,
    /// A weight.
    Weight,
    /// The architecture parameters.
    Alpha,
    /// A quantizer's step size.
    Scale,
    /// An activation.
    Activation,
    /// The validation or test loss at the end of an epoch.
    Eval,
    /// Bookkeeping: the learning rate after a rollback.
    Lr,
    /// Bookkeeping: the guard gave up.
    Guard,
}

/// What the guard did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NanAction {
    /// The step was skipped: weights kept (α restored if it went bad).
    Skipped,
    /// The run went back to its last checkpoint.
    RolledBack,
    /// The learning rate was halved (follows a rollback).
    LrHalved,
    /// The run stopped.
    Aborted,
}

/// `nan_events.csv`: one row per non-finite value found, and the guard's bookkeeping.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NanEventRow {
    /// Epoch.
    pub epoch: usize,
    /// Global step.
    pub step: usize,
    /// Where.
    pub site: NanSite,
    /// Layer path (`-` for bookkeeping rows).
    pub layer: String,
    /// The value found (an `lr` row: the new rate; a `guard` row: the event count).
    #[serde(serialize_with = "display")]
    pub value: f64,
    /// What was done.
    pub action: NanAction,
}

impl Table for NanEventRow {
    const FILE: &'static str = "nan_events.csv";
    const COLUMNS: &'static [&'static str] = &["epoch", "step", "site", "layer", "value", "action"];
    const STEPPED: bool = true;
}

/// Which cell type an α row belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CellType {
    /// The normal cell.
    Normal,
    /// The reduction cell.
    Reduce,
}

/// `alphas.csv`: softmax(α) of one op on one edge at the end of an epoch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AlphaRow {
    /// Epoch.
    pub epoch: usize,
    /// Cell type.
    pub cell_type: CellType,
    /// Edge index (node by node, inputs in order).
    pub edge: usize,
    /// Op name.
    pub op: String,
    /// Its softmax weight on the edge.
    #[serde(serialize_with = "fixed6")]
    pub weight: f64,
}

impl Table for AlphaRow {
    const FILE: &'static str = "alphas.csv";
    const COLUMNS: &'static [&'static str] = &["epoch", "cell_type", "edge", "op", "weight"];
    const STEPPED: bool = false;
}

/// Whose width a bit-width row is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BitSite {
    /// The op's weights.
    Weight,
    /// The op's activations.
    Act,
}

/// `bits.csv` (bit-width searches): the softmax weight of one candidate width of one op on one
/// edge at the end of an epoch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BitRow {
    /// Epoch.
    pub epoch: usize,
    /// Cell type.
    pub cell_type: CellType,
    /// Edge index.
    pub edge: usize,
    /// Op name.
    pub op: String,
    /// Weights or activations.
    pub site: BitSite,
    /// The width.
    pub bits: u32,
    /// Its softmax weight among the op's widths.
    #[serde(serialize_with = "fixed6")]
    pub weight: f64,
}

impl Table for BitRow {
    const FILE: &'static str = "bits.csv";
    const COLUMNS: &'static [&'static str] =
        &["epoch", "cell_type", "edge", "op", "site", "bits", "weight"];
    const STEPPED: bool = false;
}

/// `cost.csv` (searches with a bit-width search or a cost): the expected cost of the
/// architecture at the end of an epoch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CostRow {
    /// Epoch.
    pub epoch: usize,
    /// Expected BitOPs per image of the derived network.
    #[serde(serialize_with = "scientific")]
    pub bitops: f64,
    /// Expected bytes of its weights.
    #[serde(serialize_with = "fixed3")]
    pub weight_bytes: f64,
    /// The penalty added to the architecture loss (0 without `[search.cost]`).
    #[serde(serialize_with = "fixed6")]
    pub penalty: f64,
}

impl Table for CostRow {
    const FILE: &'static str = "cost.csv";
    const COLUMNS: &'static [&'static str] = &["epoch", "bitops", "weight_bytes", "penalty"];
    const STEPPED: bool = false;
}

/// What a perturbation-based selection decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// The op of one edge.
    Op,
    /// The inputs of one node.
    Input,
}

/// A candidate's verdict in a selection decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The op kept on its edge (the one whose removal hurt most).
    Kept,
    /// The input edge taken off its node in this pass (the one whose removal hurt least).
    Removed,
    /// Neither.
    #[serde(rename = "-")]
    None,
}

/// `selection.csv` (`search.selection = "perturbation"`): one row per candidate measured in a
/// decision of DARTS-PT: the supernet's validation top-1 and loss with the candidate taken out
/// (an op of an undecided edge, or an input edge of a node), and the top-1 drop against the
/// supernet as it stood before the decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SelectionRow {
    /// The epoch at whose end the decision was made.
    pub epoch: usize,
    /// Cell type.
    pub cell_type: CellType,
    /// Op or input.
    pub decision: Decision,
    /// The intermediate node (0-based) of the edge.
    pub node: usize,
    /// The edge (pt.darts' order) of the candidate.
    pub edge: usize,
    /// The op taken out, or (an input decision) the op on the edge taken out.
    pub candidate: String,
    /// Validation top-1 with the candidate taken out.
    #[serde(serialize_with = "fixed6")]
    pub top1: f64,
    /// Validation loss with the candidate taken out.
    #[serde(serialize_with = "fixed6")]
    pub loss: f64,
    /// Top-1 of the supernet before the decision minus `top1`.
    #[serde(serialize_with = "fixed6")]
    pub drop: f64,
    /// What the decision did with the candidate.
    pub verdict: Verdict,
}

impl Table for SelectionRow {
    const FILE: &'static str = "selection.csv";
    const COLUMNS: &'static [&'static str] = &[
        "epoch",
        "cell_type",
        "decision",
        "node",
        "edge",
        "candidate",
        "top1",
        "loss",
        "drop",
        "verdict",
    ];
    const STEPPED: bool = false;
}

/// `genotypes.csv`: the genotype derived at the end of an epoch, in DARTS text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenotypeRow {
    /// Epoch.
    pub epoch: usize,
    /// The genotype (pt.darts text).
    pub genotype: String,
}

impl Table for GenotypeRow {
    const FILE: &'static str = "genotypes.csv";
    const COLUMNS: &'static [&'static str] = &["epoch", "genotype"];
    const STEPPED: bool = false;
}

/// `changes.csv`: a setting changed when the run was resumed (`--extend-epochs`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChangeRow {
    /// When (UTC, `YYYYmmdd-HHMMSS`).
    pub utc: String,
    /// The global step the run resumed at.
    pub step: usize,
    /// The key, e.g. `search.epochs`.
    pub key: String,
    /// Its value before.
    pub from: String,
    /// Its value from then on.
    pub to: String,
}

impl Table for ChangeRow {
    const FILE: &'static str = "changes.csv";
    const COLUMNS: &'static [&'static str] = &["utc", "step", "key", "from", "to"];
    const STEPPED: bool = false;
}

/// `plan.json`: how long the run is, for progress displays. (Fields in name order, as the
/// file has always been written; a reader needs only `epochs` and `steps_per_epoch`.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// Images per step.
    #[serde(default)]
    pub batch_size: usize,
    /// Epochs.
    pub epochs: usize,
    /// Steps per epoch.
    pub steps_per_epoch: usize,
    /// Images that train the weights.
    #[serde(default)]
    pub train_images: usize,
    /// Images of the end-of-epoch validation.
    #[serde(default)]
    pub val_images: usize,
}

pub(crate) fn fixed6<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&format_args!("{v:.6}"))
}

pub(crate) fn fixed3<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&format_args!("{v:.3}"))
}

fn fixed6_or_zero<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    if *v == 0.0 { s.serialize_str("0") } else { fixed6(v, s) }
}

pub(crate) fn scientific<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&format_args!("{v:e}"))
}

pub(crate) fn display<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

impl NanSite {
    /// The name written in `nan_events.csv`.
    pub fn name(self) -> &'static str {
        match self {
            NanSite::Loss => "loss",
            NanSite::Grad => "grad",
            NanSite::Weight => "weight",
            NanSite::Alpha => "alpha",
            NanSite::Scale => "scale",
            NanSite::Activation => "activation",
            NanSite::Eval => "eval",
            NanSite::Lr => "lr",
            NanSite::Guard => "guard",
        }
    }
}

impl std::fmt::Display for NanSite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl NanAction {
    /// The name written in `nan_events.csv`.
    pub fn name(self) -> &'static str {
        match self {
            NanAction::Skipped => "skipped",
            NanAction::RolledBack => "rolled_back",
            NanAction::LrHalved => "lr_halved",
            NanAction::Aborted => "aborted",
        }
    }
}

impl std::fmt::Display for NanAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
