#!/usr/bin/env python3
"""The oracle of `qdarts compare`'s statistics: SciPy's and statsmodels' figures on fixed data,
written as the fixture sweep/tests/fixtures/stats.json that sweep/tests/stats.rs holds the Rust
code to. CI reads the committed fixture and needs neither library. To remake it:

    python3 -m venv /tmp/statsref && /tmp/statsref/bin/pip install -r scripts/requirements-stats.txt
    /tmp/statsref/bin/python scripts/stats_reference.py > sweep/tests/fixtures/stats.json

The data are top-1 fractions on a 10 000-image test set (multiples of 1e-4, so some tie),
drawn once from a seeded generator; the Monte Carlo figures (a permutation test too large to
enumerate, the bootstrap) come with their resample counts so that a test can bound the
difference from its own draws.
"""

import itertools
import json
import sys
from fractions import Fraction

import numpy as np
import pandas as pd
import scipy
import statsmodels
import statsmodels.formula.api as smf
from scipy import stats
from statsmodels.stats.anova import anova_lm
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.weightstats import ttost_paired

rng = np.random.default_rng(20261203)


def scores(n, mean, sd):
    """n top-1 fractions on 10 000 images."""
    return [round(float(v), 4) for v in np.clip(rng.normal(mean, sd, n), 0, 1)]


def diff(x, y, axis=-1):
    return np.mean(x, axis=axis) - np.mean(y, axis=axis)


def rational(values):
    """The decimal values as exact fractions."""
    return [Fraction(repr(v)) for v in values]


def exact_two_sample_p(x, y):
    """The exact permutation p-value in rational arithmetic: SciPy compares float statistics,
    whose last bits can split theoretical ties."""
    pooled, n1 = rational(x) + rational(y), len(x)
    total, observed = sum(pooled), sum(rational(x))
    le = ge = count = 0
    for split in itertools.combinations(range(len(pooled)), n1):
        s = sum(pooled[i] for i in split)
        count, le, ge = count + 1, le + (s <= observed), ge + (s >= observed)
    return float(min(1, 2 * Fraction(min(le, ge), count)))


def exact_sign_flip_p(x, y):
    d = [a - b for a, b in zip(rational(x), rational(y))]
    observed, le, ge = sum(d), 0, 0
    for mask in range(2 ** len(d)):
        s = sum(-v if mask >> i & 1 else v for i, v in enumerate(d))
        le, ge = le + (s <= observed), ge + (s >= observed)
    return float(min(1, 2 * Fraction(min(le, ge), 2 ** len(d))))


pairs = [
    # (method, baseline): sizes of the experiments, small ones, ties, a large effect.
    (scores(12, 0.862, 0.006), scores(24, 0.855, 0.007)),
    (scores(5, 0.8625, 0.004), scores(10, 0.8552, 0.006)),
    ([0.8612, 0.8650, 0.8571, 0.8612], [0.8540, 0.8612, 0.8555, 0.8530, 0.8612]),
    (scores(3, 0.90, 0.01), scores(4, 0.80, 0.01)),
    (scores(7, 0.85, 0.01), scores(6, 0.85, 0.01)),
]

out = {
    "versions": {"scipy": scipy.__version__, "statsmodels": statsmodels.__version__,
                 "numpy": np.__version__},
    "two_sample": [],
}
for x, y in pairs:
    w = stats.ttest_ind(x, y, equal_var=False)
    u = stats.mannwhitneyu(x, y, alternative="two-sided", method="exact")
    n_splits = int(scipy.special.comb(len(x) + len(y), len(x), exact=True))
    resamples = 100_000
    perm = stats.permutation_test((x, y), diff, permutation_type="independent",
                                  alternative="two-sided", n_resamples=resamples,
                                  vectorized=True, rng=np.random.default_rng(1))
    boot = stats.bootstrap((x, y), diff, method="percentile", confidence_level=0.95,
                           n_resamples=resamples, vectorized=True,
                           rng=np.random.default_rng(2))
    out["two_sample"].append({
        "x": x, "y": y,
        "welch": {"t": float(w.statistic), "df": float(w.df), "p": float(w.pvalue)},
        "mann_whitney": {"u": float(u.statistic), "p": float(u.pvalue),
                         "p_greater": float(u.statistic) / (len(x) * len(y))},
        "permutation": {"p": float(perm.pvalue), "exact": n_splits <= resamples,
                        "splits": n_splits, "resamples": resamples,
                        "p_rational": exact_two_sample_p(x, y) if n_splits <= resamples else None},
        "bootstrap": {"low": float(boot.confidence_interval.low),
                      "high": float(boot.confidence_interval.high),
                      "level": 0.95, "resamples": resamples},
    })

# Paired: a method's genotype against the baseline's from the same search seed (12 seeds, as
# in the quantization-aware against float experiment), one set with a zero and tied |d|.
paired = [
    (scores(12, 0.858, 0.006), scores(12, 0.855, 0.006)),
    ([0.8612, 0.8650, 0.8571, 0.8600, 0.8533, 0.8702, 0.8644, 0.8590],
     [0.8600, 0.8650, 0.8583, 0.8612, 0.8521, 0.8690, 0.8600, 0.8578]),
    (scores(6, 0.80, 0.01), scores(6, 0.78, 0.01)),
]
out["paired"] = []
margin = 0.005
for x, y in paired:
    d = np.array(x) - np.array(y)
    t = stats.ttest_rel(x, y)
    w = stats.wilcoxon(x, y, method="exact")
    flips = 2 ** len(x)
    resamples = 100_000
    perm = stats.permutation_test((x, y), lambda a, b, axis=-1: np.mean(a - b, axis=axis),
                                  permutation_type="samples", alternative="two-sided",
                                  n_resamples=resamples, vectorized=True,
                                  rng=np.random.default_rng(3))
    boot = stats.bootstrap((d,), np.mean, method="percentile", confidence_level=0.95,
                           n_resamples=resamples, vectorized=True, rng=np.random.default_rng(4))
    tost = ttost_paired(np.array(x), np.array(y), -margin, margin)
    out["paired"].append({
        "x": x, "y": y,
        "t": {"t": float(t.statistic), "df": float(t.df), "p": float(t.pvalue)},
        "wilcoxon": {"statistic": float(w.statistic), "p": float(w.pvalue)},
        "sign_flip": {"p": float(perm.pvalue), "exact": flips <= resamples, "flips": flips,
                      "p_rational": exact_sign_flip_p(x, y)},
        "bootstrap": {"low": float(boot.confidence_interval.low),
                      "high": float(boot.confidence_interval.high)},
        "equivalence": {"margin": margin, "p": float(tost[0])},
    })

p_values = [0.012, 0.048, 0.003, 0.20, 0.048, 0.9]
out["holm"] = {"p": p_values,
               "adjusted": [float(v) for v in multipletests(p_values, method="holm")[1]]}

groups = [scores(2, 0.86, 0.006) for _ in range(6)] + [scores(3, 0.85, 0.006)]
f = stats.f_oneway(*groups)
out["one_way"] = {"groups": groups, "f": float(f.statistic), "p": float(f.pvalue)}

# Genotype × training seed, crossed and unbalanced as in a search-against-random experiment:
# the first six genotypes (searched) trained with seeds 0 and 1, the other eight (random)
# with seed 0 only; seed 1 shifts every score.
rows = []
for g in range(14):
    effect = rng.normal(0, 0.005)
    for s in ([0, 1] if g < 6 else [0]):
        rows.append((g, s, round(0.855 + effect + 0.004 * s + rng.normal(0, 0.003), 4)))
frame = pd.DataFrame(rows, columns=["genotype", "seed", "y"])
model = smf.ols("y ~ C(genotype) + C(seed)", data=frame).fit()
table = anova_lm(model, typ=2)
grid = pd.DataFrame([(g, s) for g in range(14) for s in (0, 1)], columns=["genotype", "seed"])
ls_means = model.predict(grid).to_numpy().reshape(14, 2).mean(axis=1)
out["two_way"] = {
    "values": [list(r) for r in rows],
    "genotype_f": float(table.loc["C(genotype)", "F"]),
    "genotype_p": float(table.loc["C(genotype)", "PR(>F)"]),
    "seed_f": float(table.loc["C(seed)", "F"]),
    "seed_p": float(table.loc["C(seed)", "PR(>F)"]),
    "df_residual": int(table.loc["Residual", "df"]),
    "residual_std": float(np.sqrt(model.mse_resid)),
    "adjusted_means": [float(v) for v in ls_means],
}

out["distributions"] = {
    "t_two_sided": [{"t": t, "df": df, "p": float(2 * stats.t.sf(abs(t), df))}
                    for t, df in [(2.1, 10.0), (0.3, 3.5), (4.7, 33.2), (1.96, 1e4)]],
    "f_upper": [{"f": fv, "d1": d1, "d2": d2, "p": float(stats.f.sf(fv, d1, d2))}
                for fv, d1, d2 in [(2.39, 14, 15), (0.5, 3, 20), (7.1, 1, 11)]],
}

json.dump(out, sys.stdout, indent=1)
sys.stdout.write("\n")
