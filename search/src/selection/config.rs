//! `search.selection` and `[search.perturbation]`: how the genotype is read off the supernet.

use serde::{Deserialize, Serialize};

/// How the genotype is selected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Selection {
    /// DARTS: on each edge the op of largest softmax(α) (none excluded), then each node's two
    /// strongest edges.
    #[default]
    Magnitude,
    /// DARTS-PT (Wang et al., ICLR 2021): after the search, edge by edge, the op whose removal
    /// from the supernet costs the most validation accuracy, then each node's inputs the same
    /// way, with the supernet fine-tuned between decisions (`[search.perturbation]`).
    Perturbation,
}

impl Selection {
    pub(crate) fn is_magnitude(&self) -> bool {
        *self == Selection::Magnitude
    }
}

/// In which order DARTS-PT decides the edges (and then the nodes) of a cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SelectionOrder {
    /// A seeded random order (DARTS-PT's `edge_decision = random`).
    #[default]
    Random,
    /// Edge 0, 1, 2, … (and node 0, 1, …).
    Fixed,
}

/// What the perturbation measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SelectionCriterion {
    /// Validation top-1 (DARTS-PT's `proj_crit = acc`); ties go to the loss.
    #[default]
    Accuracy,
    /// Validation loss (`proj_crit = loss`).
    Loss,
}

/// `[search.perturbation]`: DARTS-PT's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PerturbationConfig {
    /// Epochs of fine-tuning (weights and α, as in the search, at a tenth of `w_lr` annealed
    /// to `w_lr_min`) after each round of decisions (DARTS-PT's `proj_intv`, 10 on DARTS'
    /// 50-epoch search; 0: decide everything at once after the search).
    #[serde(default = "PerturbationConfig::default_tune_epochs")]
    pub tune_epochs: usize,
    /// Order of the edges and nodes.
    #[serde(default)]
    pub order: SelectionOrder,
    /// What is measured.
    #[serde(default)]
    pub criterion: SelectionCriterion,
    /// Validation images of each measurement: the first this many of the α split, the same
    /// for every candidate (0: the whole split).
    #[serde(default)]
    pub eval_images: usize,
}

impl PerturbationConfig {
    fn default_tune_epochs() -> usize {
        1
    }
}

impl Default for PerturbationConfig {
    fn default() -> Self {
        PerturbationConfig {
            tune_epochs: Self::default_tune_epochs(),
            order: SelectionOrder::default(),
            criterion: SelectionCriterion::default(),
            eval_images: 0,
        }
    }
}
