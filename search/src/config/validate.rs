//! The search config's own checks ([`Experiment::validate_own`](super::Experiment)), one
//! method per part of the config; each names the key at fault and, where two keys conflict,
//! how to resolve it.

use std::path::Path;

use qdarts_engine::ConfigError;
use qdarts_engine::config::Ranges;
use qdarts_genotypes::Primitive;
use qdarts_ops::qconfig::Preset;

use super::{CostCharge, ExperimentConfig, PenaltyKind, Selection};

fn bad(path: &Path, key: &str, message: &str) -> Result<(), ConfigError> {
    Err(ConfigError::invalid(path, key, message))
}

impl ExperimentConfig {
    /// `[model]`: the supernet, and what the batched cells run.
    pub(super) fn validate_model(&self, path: &Path, r: &Ranges<'_>) -> Result<(), ConfigError> {
        let m = &self.model;
        r.count("model.layers", m.layers, 3, 64)?;
        if m.partial_channels == 0 || !m.init_channels.is_multiple_of(m.partial_channels) {
            return bad(
                path,
                "model.partial_channels",
                "must be at least 1 and divide model.init_channels (PC-DARTS uses 4)",
            );
        }
        r.count("model.nodes", m.nodes, 1, 16)?;
        if m.batched_cells && self.quant.preset == Preset::Lsq {
            let message = "runs cells without LSQ quantizers; this config has quant.preset = \
                           \"lsq\": set model.batched_cells = false (or leave it out) to run it \
                           edge by edge";
            return bad(path, "model.batched_cells", message);
        }
        r.count("model.stem_multiplier", m.stem_multiplier, 1, 16)?;
        if m.primitives.is_empty() || m.primitives.iter().all(|p| *p == Primitive::None) {
            return bad(path, "model.primitives", "needs an op other than none");
        }
        let mut seen = m.primitives.clone();
        seen.sort();
        seen.dedup();
        if seen.len() != m.primitives.len() {
            return bad(path, "model.primitives", "lists an op twice");
        }
        Ok(())
    }

    /// The optimizers, the epochs and the data split.
    pub(super) fn validate_training(&self, path: &Path, r: &Ranges<'_>) -> Result<(), ConfigError> {
        let s = &self.search;
        r.count("search.epochs", s.epochs, 1, 1_000_000)?;
        r.count("search.batch_size", s.batch_size, 1, 1 << 16)?;
        if !(self.data.train_portion > 0.0 && self.data.train_portion < 1.0) {
            return bad(path, "data.train_portion", "must lie in (0, 1)");
        }
        r.positive("search.w_lr", s.w_lr)?;
        r.within("search.w_lr_min", s.w_lr_min, 0.0, s.w_lr)?;
        r.fraction("search.w_momentum", s.w_momentum)?;
        r.within("search.w_weight_decay", s.w_weight_decay, 0.0, 1.0)?;
        r.positive("search.w_grad_clip", s.w_grad_clip)?;
        r.positive("search.alpha_lr", s.alpha_lr)?;
        r.fraction("search.alpha_betas[0]", s.alpha_betas[0])?;
        r.fraction("search.alpha_betas[1]", s.alpha_betas[1])?;
        r.within("search.alpha_weight_decay", s.alpha_weight_decay, 0.0, 1.0)
    }

    /// `[search.guards]`: the collapse guards.
    pub(super) fn validate_guards(&self, path: &Path, r: &Ranges<'_>) -> Result<(), ConfigError> {
        let (m, g) = (&self.model, &self.search.guards);
        r.within("search.guards.aux_skip", g.aux_skip, 0.0, 10.0)?;
        r.within("search.guards.beta_decay", g.beta_decay, 0.0, 1e4)?;
        r.within("search.guards.random_smoothing", g.random_smoothing, 0.0, 1.0)?;
        if let Some(max) = g.max_skip {
            // Two edges per node are kept.
            r.count("search.guards.max_skip", max, 0, 2 * m.nodes)?;
            let others =
                m.primitives.iter().any(|p| !matches!(p, Primitive::None | Primitive::SkipConnect));
            if !others {
                return bad(
                    path,
                    "search.guards.max_skip",
                    "needs an op other than none and skip_connect in model.primitives",
                );
            }
        }
        if let Some(max) = g.max_param_free {
            r.count("search.guards.max_param_free", max, 0, 2 * m.nodes)?;
            if !m.primitives.iter().any(|p| p.has_weights()) {
                return bad(
                    path,
                    "search.guards.max_param_free",
                    "needs an op with weights (a convolution) in model.primitives",
                );
            }
        }
        Ok(())
    }

    /// `search.selection` and `[search.perturbation]`.
    pub(super) fn validate_selection(
        &self,
        path: &Path,
        r: &Ranges<'_>,
    ) -> Result<(), ConfigError> {
        let s = &self.search;
        if s.perturbation.is_some() && s.selection != Selection::Perturbation {
            return bad(
                path,
                "search.perturbation",
                "is read only with search.selection = \"perturbation\"",
            );
        }
        if s.selection != Selection::Perturbation {
            return Ok(());
        }
        let p = s.perturbation_or_default();
        r.count("search.perturbation.tune_epochs", p.tune_epochs, 0, 1000)?;
        for (key, set) in [
            ("search.guards.max_skip", s.guards.max_skip),
            ("search.guards.max_param_free", s.guards.max_param_free),
        ] {
            if set.is_some() {
                let message = format!(
                    "limits the magnitude derivation; search.selection = \"perturbation\" \
                     decides every edge by measurement: remove it from the config, or with \
                     `--set {key}=` (an empty value removes a key)"
                );
                return bad(path, key, &message);
            }
        }
        if s.guards.edge_normalization {
            return bad(
                path,
                "search.guards.edge_normalization",
                "is not supported with search.selection = \"perturbation\"",
            );
        }
        Ok(())
    }

    /// `[search.bits]`: the bit-width search.
    pub(super) fn validate_bits(&self, path: &Path) -> Result<(), ConfigError> {
        let Some(b) = &self.search.bits else { return Ok(()) };
        for (key, set) in [("search.bits.weight", &b.weight), ("search.bits.act", &b.act)] {
            let mut seen = set.clone();
            seen.sort_unstable();
            seen.dedup();
            if set.is_empty() || seen.len() != set.len() {
                return bad(path, key, "give one or more widths, each once");
            }
            if let Some(w) = set.iter().find(|w| !(2..=8).contains(*w)) {
                return bad(path, key, &format!("{w} bits: widths lie in 2..8"));
            }
        }
        if self.quant.preset == Preset::Float {
            return bad(path, "search.bits", "needs quantization: quant.preset is float");
        }
        Ok(())
    }

    /// `[search.cost]`: the hardware-cost penalty.
    pub(super) fn validate_cost(&self, path: &Path, r: &Ranges<'_>) -> Result<(), ConfigError> {
        let s = &self.search;
        let Some(c) = &s.cost else { return Ok(()) };
        r.within("search.cost.weight", c.weight, 0.0, 1e6)?;
        if self.model.partial_channels > 1 {
            return bad(
                path,
                "search.cost",
                "is counted on the supernet's ops, which see C/K channels with \
                 model.partial_channels > 1: not supported",
            );
        }
        if c.charge == CostCharge::Bits && s.bits.is_none() {
            return bad(
                path,
                "search.cost.charge",
                "\"bits\" (the default) needs [search.bits]; without a bit-width search use \
                 charge = \"ops_and_bits\"",
            );
        }
        match (c.penalty, c.target) {
            (PenaltyKind::Hinge, None) => {
                bad(path, "search.cost.target", "the hinge penalty needs a target")
            }
            (PenaltyKind::Hinge, Some(t)) if !(t.is_finite() && t > 0.0) => {
                bad(path, "search.cost.target", "must be a positive number")
            }
            (PenaltyKind::Log, Some(_)) => {
                bad(path, "search.cost.target", "the log penalty has no target")
            }
            _ => Ok(()),
        }
    }
}
