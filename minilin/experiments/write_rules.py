"""Write rules: the same n pairs written additively and with the delta rule, then all read back.

    additive (linear attention):  S <- S + k v^T
    delta rule (DeltaNet):        S <- S + beta k (v - S^T k)^T  =  (I - beta k k^T) S + beta k v^T

The delta rule writes only the correction toward v, so with a unit key and beta = 1 the newest pair reads
back exactly and the state stays bounded where the additive one keeps growing: a lower reconstruction error.
The price is in (I - beta k k^T): each write also removes from every older pair the part of its read that
lies along k. With random keys that erasure compounds, so the delta memory keeps its newest ~d pairs and
gradually loses the older ones, while the additive memory keeps every pair's own term at full strength
(k_i . k_i = 1) under growing, but unbiased, cross-talk. Which one "recalls" better depends on the
measure: squared error favours the delta rule, picking the right value among the n stored ones can favour
the additive rule, most of all for old pairs. beta < 1 trades between the two.

Keys, values [trials, n, 1, d]: random unit vectors; recall: the stored value with the largest inner
product with the read is the pair's own. Every memory is written by its mixer (linear_attention,
deltanet) and read with the same S^T k.
"""
from __future__ import annotations

import numpy as np

from . import _associative as mem, _plot

RULES = (("additive", None), ("delta, beta = 1", 1.0), ("delta, beta = 0.5", 0.5))


def sizes(quick: bool) -> dict:
    d = 32 if quick else 64
    return dict(d=d, trials=4 if quick else 8, ns=[d // 4, d // 2, d, 2 * d, 4 * d])


def write(rule_beta, keys, values):
    return mem.write_additive(keys, values) if rule_beta is None else mem.write_delta(keys, values, rule_beta)


def run(quick: bool = False) -> dict:
    p = sizes(quick)
    d, trials = p["d"], p["trials"]
    rng = np.random.default_rng(8)
    rows = []
    for n in p["ns"]:
        keys = mem.unit_vectors(rng, trials, n, d)
        values = mem.unit_vectors(rng, trials, n, d)
        quarter = max(1, n // 4)
        for rule, beta in RULES:
            reads = mem.read(write(beta, keys, values), keys)                   # [trials, n, 1, d]
            errors = mem.relative_errors(reads, values)                          # [trials, n]
            scores = np.einsum("bimv,bjmv->bij", reads, values)                 # read i vs stored value j
            recalled = scores.argmax(-1) == np.arange(n)                         # [trials, n]
            kept = np.einsum("bimv,bimv->bi", reads, values)                     # own value's share of the read
            rows.append({
                "n": n, "rule": rule, "beta": beta,
                "error": mem.rms(errors),
                "newest_error": float(errors[:, -1].max()),
                "recall": float(recalled.mean()),
                "recall_oldest": float(recalled[:, :quarter].mean()),
                "recall_newest": float(recalled[:, -quarter:].mean()),
                "kept_oldest": float(kept[:, :quarter].mean()),
                "kept_newest": float(kept[:, -quarter:].mean()),
            })
    return {"d": d, "trials": trials, "ns": p["ns"], "rows": rows}


def table(data: dict) -> str:
    lines = [f"{'n':>5s} {'n/d':>5s} {'write rule':18s} | {'error':>6s} {'newest':>8s} | {'recall':>6s} "
             f"{'oldest 1/4':>10s} {'newest 1/4':>10s} | {'kept, oldest':>12s} {'newest':>6s}"]
    for r in data["rows"]:
        lines.append(f"{r['n']:5d} {r['n'] / data['d']:5.2f} {r['rule']:18s} | {r['error']:6.3f} {r['newest_error']:8.1e} | "
                     f"{r['recall']:6.3f} {r['recall_oldest']:10.3f} {r['recall_newest']:10.3f} | "
                     f"{r['kept_oldest']:12.3f} {r['kept_newest']:6.3f}")
    lines.append(f"(d = {data['d']}, random unit keys and values, {data['trials']} trials. error: RMS ||read - v|| / ||v||; "
                 "newest: the last pair's error; recall: the read's nearest stored value is its own; kept: <read, v>, "
                 "how much of the pair's own value is left in its read)")
    return "\n".join(lines)


def plot(data: dict, path: str) -> None:
    fig, (left, middle, right) = _plot.subplots(3, width=4.6)
    for rule, _ in RULES:
        rows = [r for r in data["rows"] if r["rule"] == rule]
        n = [r["n"] for r in rows]
        line, = left.plot(n, [r["error"] for r in rows], "o-", label=rule)
        middle.plot(n, [r["recall_oldest"] for r in rows], "s--", color=line.get_color(), label=f"{rule}: oldest 1/4")
        middle.plot(n, [r["recall_newest"] for r in rows], "o-", color=line.get_color(), label=f"{rule}: newest 1/4")
        right.plot(n, [r["kept_oldest"] for r in rows], "s--", color=line.get_color(), label=f"{rule}: oldest 1/4")
    for ax in (left, middle, right):
        ax.axvline(data["d"], color="gray", lw=0.8, ls=":", label=f"n = d = {data['d']}")
        ax.set(xscale="log", xlabel="pairs written n")
        _plot.plain_ticks(ax, data["ns"])
    left.set(ylabel="RMS relative error", title="Reconstruction error")
    middle.set(ylabel="recall (nearest stored value)", ylim=(0, 1.03), title="Recall, oldest vs newest pairs")
    right.set(ylabel="<read, v> of the oldest pairs", ylim=(0, 1.1), title="How much of an old pair is left")
    left.legend(fontsize=8)
    middle.legend(fontsize=6)
    right.legend(fontsize=7)
    _plot.save(fig, path, "write_rules")
