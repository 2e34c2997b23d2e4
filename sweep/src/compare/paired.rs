//! A method against the baseline pair by pair: each of its genotypes set against the
//! baseline's genotype from a search with the same seed (a quantization-aware search and a
//! float one started alike), and the paired differences tested.

use super::analysis::{MethodResult, RESAMPLE_SEED, RESAMPLES, Unit};
use crate::stats::{Bootstrap, PairedT, SignFlip, Wilcoxon, holm};

/// The paired differences of one method and their tests.
#[derive(Debug, Clone, PartialEq)]
pub struct PairedResult {
    /// (search seed, method score, baseline score), in the order of the method's genotypes.
    pub pairs: Vec<(String, f64, f64)>,
    /// The method's genotypes with no baseline genotype of the same search seed, or with no
    /// search seed: left out.
    pub unpaired: usize,
    /// The paired t-test of the mean difference.
    pub t: Option<PairedT>,
    /// The exact Wilcoxon signed-rank test.
    pub wilcoxon: Option<Wilcoxon>,
    /// The sign-flip permutation test of the mean difference.
    pub sign_flip: Option<SignFlip>,
    /// The mean difference with its 95 % percentile bootstrap interval (pairs resampled).
    pub bootstrap: Option<Bootstrap>,
    /// (margin, p) of the two one-sided tests of equivalence, when a margin was given.
    pub equivalence: Option<(f64, f64)>,
    /// Holm-adjusted p-values across methods: t, Wilcoxon, sign flips.
    pub holm: [Option<f64>; 3],
}

impl PairedResult {
    /// Pairs method `m`'s units with the baseline's by search seed and tests the differences.
    pub(super) fn of(units: &[Unit], m: usize, margin: Option<f64>) -> PairedResult {
        let mut pairs = Vec::new();
        let mut unpaired = 0;
        for u in units.iter().filter(|u| u.method == Some(m)) {
            let partner = u.search_seed.as_ref().and_then(|seed| {
                units.iter().find(|b| b.method.is_none() && b.search_seed.as_ref() == Some(seed))
            });
            match (partner, &u.search_seed) {
                (Some(b), Some(seed)) => pairs.push((seed.clone(), u.score, b.score)),
                _ => unpaired += 1,
            }
        }
        let d: Vec<f64> = pairs.iter().map(|p| p.1 - p.2).collect();
        let t = PairedT::of(&d);
        PairedResult {
            unpaired,
            wilcoxon: Wilcoxon::of(&d),
            sign_flip: SignFlip::of(&d, RESAMPLES, RESAMPLE_SEED),
            bootstrap: Bootstrap::of_mean(&d, 0.95, RESAMPLES, RESAMPLE_SEED),
            equivalence: margin.zip(t).map(|(margin, t)| (margin, t.equivalence_p(margin))),
            holm: [None; 3],
            t,
            pairs,
        }
    }

    /// Holm's correction of each paired test's p-values across the methods.
    pub(super) fn holm_across(methods: &mut [MethodResult]) {
        let columns: [fn(&PairedResult) -> Option<f64>; 3] =
            [|p| p.t.map(|t| t.p), |p| p.wilcoxon.map(|w| w.p), |p| p.sign_flip.map(|s| s.p)];
        for (c, column) in columns.iter().enumerate() {
            let with: Vec<usize> = (0..methods.len())
                .filter(|&m| methods[m].paired.as_ref().and_then(column).is_some())
                .collect();
            let p: Vec<f64> =
                with.iter().filter_map(|&m| methods[m].paired.as_ref().and_then(column)).collect();
            for (&m, adjusted) in with.iter().zip(holm(&p)) {
                if let Some(paired) = methods[m].paired.as_mut() {
                    paired.holm[c] = Some(adjusted);
                }
            }
        }
    }
}
