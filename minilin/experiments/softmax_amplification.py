"""Softmax amplification: the same pairs read through kernel feature maps and through softmax.

A memory read gives pair j the weight w_j = sim(q, k_j): phi(q) . phi(k_j) for a linear-attention kernel,
exp(s q . k_j) (normalized) for softmax. Querying pair i's own key, the ratio of the right pair's weight to a
wrong pair's is
    kernel:   phi(k_i) . phi(k_i) / phi(k_i) . phi(k_j)      a few times (elu+1, relu: ~1.5-3; FAVOR+ more)
    softmax:  exp(s (k_i . k_i - k_i . k_j))                 the score gap, exponentiated
Each ratio involves two keys only, so it does not change with n; but the right pair's share of the total
weight, 1 / (1 + (n - 1) / ratio), does. A kernel's small ratio lets the n - 1 wrong pairs take most of the
weight once n is large (cross-talk let through); softmax's exponential keeps it on the right pair.

The weights are read off the mixers themselves: the pairs are written with one-hot values e_j, so a read
returns its weight vector (linear_attention with each feature map; attention for softmax).
Keys [trials, n, 1, d] are standard normal (norm ~ sqrt(d), as a layer's keys are), queries = the keys;
softmax's logit scale is the usual d ** -0.5 times a temperature factor.
"""
from __future__ import annotations

import numpy as np

from .. import feature_maps
from . import _associative as mem, _plot


def kernels(d: int) -> list[tuple[str, str, dict]]:
    """(label, kind, options): the feature maps of `minilin.feature_maps`, then softmax at three temperatures."""
    return [
        ("identity", "kernel", {"feature_map": "identity"}),
        ("elu+1", "kernel", {"feature_map": "elu+1"}),
        ("relu", "kernel", {"feature_map": "relu"}),
        ("favor+ (256 features)", "kernel", {"feature_map": feature_maps.FavorPlus(256, seed=0)}),
        ("softmax, scale 0.5/sqrt(d)", "softmax", {"scale": 0.5 / np.sqrt(d)}),
        ("softmax, scale 1/sqrt(d)", "softmax", {"scale": 1.0 / np.sqrt(d)}),
        ("softmax, scale 2/sqrt(d)", "softmax", {"scale": 2.0 / np.sqrt(d)}),
    ]


def weights(keys, kind: str, options: dict) -> np.ndarray:
    """Each query's weight on each stored pair, read through the mixer: [trials, n (queries), n (pairs)]."""
    trials, n = keys.shape[:2]
    slots = mem.slot_values(trials, n)
    if kind == "softmax":
        return mem.softmax_read(keys, slots, keys, options["scale"])[:, :, 0]
    fm = options["feature_map"]
    return mem.read(mem.write_additive(keys, slots, feature_map=fm), keys, feature_map=fm)[:, :, 0]


def sizes(quick: bool) -> dict:
    d = 32 if quick else 64
    return dict(d=d, trials=4 if quick else 8, ns=[d // 4, d, 4 * d])


def run(quick: bool = False) -> dict:
    p = sizes(quick)
    d, trials = p["d"], p["trials"]
    rng = np.random.default_rng(6)
    keys_by_n = {n: rng.standard_normal((trials, n, 1, d)) for n in p["ns"]}
    rows = []
    for label, kind, options in kernels(d):
        ratios, shares = {}, {}
        for n, keys in keys_by_n.items():
            w = np.abs(weights(keys, kind, options))      # identity's weights can be negative: compare sizes
            right = np.einsum("bii->bi", w)
            mean_wrong = (w.sum(-1) - right) / (n - 1)
            ratios[n] = float(np.exp(np.mean(np.log(right / mean_wrong))))  # geometric mean over queries
            shares[n] = float(np.mean(right / w.sum(-1)))
        rows.append({"kernel": label, "kind": kind, "ratio": ratios, "right_share": shares})
    return {"d": d, "trials": trials, "ns": p["ns"], "rows": rows}


def table(data: dict) -> str:
    ns = data["ns"]
    head = " ".join(f"{'n = ' + str(n):>9s}" for n in ns)
    lines = [f"{'similarity':28s} {'right : wrong weight':>22s} | share of the weight on the right pair",
             f"{'':28s} {f'n = {ns[0]} .. {ns[-1]}':>22s} | {head}"]
    for r in data["rows"]:
        ratios = f"{r['ratio'][ns[0]]:.3g} .. {r['ratio'][ns[-1]]:.3g}"
        shares = " ".join(f"{r['right_share'][n]:9.3f}" for n in ns)
        lines.append(f"{r['kernel']:28s} {ratios:>22s} | {shares}")
    lines.append(f"(d = {data['d']}, Gaussian keys, query = the pair's own key, {data['trials']} trials; ratio: geometric "
                 "mean over queries of w_right / mean |w_wrong|; share: |w_right| / sum |w|)")
    return "\n".join(lines)


def plot(data: dict, path: str) -> None:
    fig, (left, right) = _plot.subplots(2)
    labels = [r["kernel"] for r in data["rows"]]
    n_max = data["ns"][-1]
    colors = ["C0" if r["kind"] == "kernel" else "C3" for r in data["rows"]]
    left.barh(labels, [r["ratio"][n_max] for r in data["rows"]], color=colors)
    left.set(xscale="log", xlabel="right : wrong weight ratio (geometric mean over queries)",
             title=f"How much more the right pair weighs (n = {n_max})")
    left.invert_yaxis()
    from matplotlib.patches import Patch

    left.legend(handles=[Patch(color="C0", label="kernel feature map"), Patch(color="C3", label="softmax")],
                fontsize=8, loc="lower right")
    for r in data["rows"]:
        right.plot(data["ns"], [r["right_share"][n] for n in data["ns"]], "o-" if r["kind"] == "kernel" else "s--",
                   label=r["kernel"])
    right.set(xscale="log", xlabel="pairs written n", ylabel="share of the weight on the right pair", ylim=(0, 1.02),
              title=f"The right pair's share of the weight (d = {data['d']})")
    _plot.plain_ticks(right, data["ns"])
    right.legend(fontsize=7)
    _plot.save(fig, path, "softmax_amplification")
