"""Capacity: write n key/value pairs into a d x d state, read each one back, and watch the error as n
passes d.

Additive linear attention stores S = sum_j k_j v_j^T and reads S^T k_i = v_i + sum_{j != i} (k_j . k_i) v_j.
- Orthogonal unit keys: every k_j . k_i (j != i) is 0, so the read is exact for n <= d. There are no
  more than d orthogonal directions in d dimensions, so past n = d the cross-talk has to start (here
  the keys past d are a second random orthonormal block).
- Random unit keys: k_j . k_i has mean 0 and variance 1/d, and with unit values the cross-talk's squared
  norm adds up over the n - 1 others: relative error ~ sqrt((n - 1) / d), from the very first pair.
Softmax attention reads the same pairs with weights w_j ~ exp(s q . k_j). The weight gap between the
right pair and a wrong one, log w_i - log w_j = s (1 - k_j . k_i), involves only those two keys, so its
average does not depend on n; n only adds more wrong pairs to share the rest of the weight.

Keys, values [trials, n, 1, d] (unit vectors); the state is [trials, 1, d, d]; softmax's logit scale is
s = sqrt(d), what the usual q . k / sqrt(d) gives for keys of norm sqrt(d).
"""
from __future__ import annotations

import numpy as np

from . import _associative as mem, _plot


def sizes(quick: bool) -> dict:
    d = 32 if quick else 64
    return dict(d=d, trials=8 if quick else 16, ns=[n for n in (4, 8, 16, 32, 48, 64, 96, 128, 192, 256) if n <= 4 * d])


def run(quick: bool = False) -> dict:
    """One row per n: RMS relative read-back error of each memory, and softmax's weights."""
    p = sizes(quick)
    d, trials = p["d"], p["trials"]
    rng = np.random.default_rng(4)
    rows = []
    for n in p["ns"]:
        values = mem.unit_vectors(rng, trials, n, d)
        orthogonal = mem.orthogonal_keys(rng, trials, n, d)
        random_keys = mem.unit_vectors(rng, trials, n, d)
        orthogonal_error = mem.relative_errors(mem.read(mem.write_additive(orthogonal, values), orthogonal), values)
        random_error = mem.relative_errors(mem.read(mem.write_additive(random_keys, values), random_keys), values)
        scale = np.sqrt(d)
        softmax_error = mem.relative_errors(mem.softmax_read(random_keys, values, random_keys, scale), values)
        # One-hot values turn softmax's read into its weight vector: row i holds w_i1 .. w_in.
        weights = mem.softmax_read(random_keys, mem.slot_values(trials, n), random_keys, scale)[:, :, 0]
        log_w = np.log(weights)
        right = np.einsum("bii->bi", log_w)
        mean_wrong = (log_w.sum(-1) - right) / (n - 1)
        rows.append({
            "n": n,
            "orthogonal_error": mem.rms(orthogonal_error),
            "random_error": mem.rms(random_error),
            "predicted_random_error": float(np.sqrt((n - 1) / d)),
            "softmax_error": mem.rms(softmax_error),
            "softmax_log_weight_gap": float(np.mean(right - mean_wrong)),
            "softmax_right_weight": float(np.mean(np.exp(right))),
        })
    return {"d": d, "trials": trials, "softmax_scale": float(np.sqrt(d)), "rows": rows}


def table(data: dict) -> str:
    lines = [f"{'n':>5s} {'n/d':>5s} | {'additive, orthogonal':>20s} {'additive, random':>16s} "
             f"{'sqrt((n-1)/d)':>13s} | {'softmax error':>13s} {'log-weight gap':>14s} {'weight on right':>15s}"]
    for r in data["rows"]:
        lines.append(f"{r['n']:5d} {r['n'] / data['d']:5.2f} | {r['orthogonal_error']:20.1e} {r['random_error']:16.3f} "
                     f"{r['predicted_random_error']:13.3f} | {r['softmax_error']:13.3f} "
                     f"{r['softmax_log_weight_gap']:14.2f} {r['softmax_right_weight']:15.3f}")
    lines.append(f"(d = {data['d']}, unit keys and values, RMS relative error ||read - v|| / ||v|| over "
                 f"{data['trials']} trials x n pairs, float64; softmax logit scale sqrt(d) = "
                 f"{data['softmax_scale']:.0f}; log-weight gap: log w_right - mean log w_wrong)")
    return "\n".join(lines)


def plot(data: dict, path: str) -> None:
    fig, (left, right) = _plot.subplots(2)
    n = np.array([r["n"] for r in data["rows"]])
    left.plot(n, [max(r["orthogonal_error"], 1e-17) for r in data["rows"]], "o-",
              label="additive, orthogonal keys (0 drawn at 1e-17)")
    left.plot(n, [r["random_error"] for r in data["rows"]], "s-", label="additive, random unit keys")
    left.plot(n, [r["predicted_random_error"] for r in data["rows"]], "k--", label="sqrt((n-1)/d)")
    left.plot(n, [r["softmax_error"] for r in data["rows"]], "^-", label="softmax, random unit keys")
    left.axvline(data["d"], color="gray", lw=0.8, ls=":", label="n = d")
    left.set(xscale="log", yscale="log", xlabel="pairs written n", ylabel="relative read-back error (RMS)",
             title=f"Reading back n pairs from a {data['d']}x{data['d']} state")
    left.legend(fontsize=8)
    right.plot(n, [r["softmax_log_weight_gap"] for r in data["rows"]], "o-", label="log w_right - mean log w_wrong")
    right.set(xscale="log", xlabel="pairs written n", ylabel="log-weight gap", ylim=(0, None),
              title="Softmax: the gap to each wrong pair does not depend on n")
    twin = right.twinx()
    twin.plot(n, [r["softmax_right_weight"] for r in data["rows"]], "s--", color="C1", label="weight on the right pair")
    twin.set(ylabel="weight on the right pair", ylim=(0, 1.05))
    _plot.plain_ticks(left, list(n))
    _plot.plain_ticks(right, list(n))
    marks, labels = right.get_legend_handles_labels()
    twin_marks, twin_labels = twin.get_legend_handles_labels()
    right.legend(marks + twin_marks, [f"{label} (left axis)" for label in labels] +
                 [f"{label} (right axis)" for label in twin_labels], loc="lower left", fontsize=8)
    _plot.save(fig, path, "capacity")
