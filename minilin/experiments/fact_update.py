"""Updating a fact: a key whose value changes mid-sequence, read back at every step.

The sequence: (k*, v_old) at t = 0, m random distractor pairs, (k*, v_new) at t_u = m + 1, m more
distractors. With q = k* at every position, each output is what the memory currently says about k*.
    additive:          S^T k* = v_old + v_new + cross-talk   never lets go of v_old: off by ~||v_old||
    additive + decay:  v_old fades as alpha^t instead of being removed, and v_new fades the same way
    delta, beta = 1:   writing (k*, v_new) first reads v_old back and replaces it: S^T k* = v_new exactly
                       (unit key), whatever cross-talk was there
    gated delta:       the same replacement, on a memory that also decays (v_new then fades too)
The later distractors disturb every rule a little (cross-talk, or the delta rule's partial erasure).

Shapes: [trials, T = 2m + 2, 1, d], random unit keys and values, scale 1. Mixers: linear_attention,
simple_gla (constant log-decay g = log alpha), deltanet, gated_deltanet (beta = 1).
"""
from __future__ import annotations

import numpy as np

from ..mixers import deltanet, gated_deltanet, linear_attention, simple_gla
from . import _associative as mem, _plot

ALPHA = 0.95  # the decay of the gated rules: a half-life of about 13.5 tokens

RULES = ("additive", "additive + decay", "delta, beta = 1", "gated delta, beta = 1")


def sizes(quick: bool) -> dict:
    d = 32 if quick else 64
    return dict(d=d, m=d // 4, trials=8 if quick else 16)


def reads(rule: str, queries, keys, values) -> np.ndarray:
    """Run `rule`'s mixer over the sequence; the outputs are the reads at q_t = k*: [trials, T, 1, d]."""
    ones = np.ones(keys.shape[:3])
    log_alpha = np.full(keys.shape[:3], np.log(ALPHA))
    if rule == "additive":
        return linear_attention.recurrent(queries, keys, values, scale=1.0)[0]
    if rule == "additive + decay":
        return simple_gla.recurrent(queries, keys, values, log_alpha, scale=1.0)[0]
    if rule == "delta, beta = 1":
        return deltanet.recurrent(queries, keys, values, ones, scale=1.0)[0]
    if rule == "gated delta, beta = 1":
        return gated_deltanet.recurrent(queries, keys, values, log_alpha, ones, scale=1.0)[0]
    raise ValueError(f"rule: expected one of {RULES}, got {rule!r}")


def run(quick: bool = False) -> dict:
    p = sizes(quick)
    d, m, trials = p["d"], p["m"], p["trials"]
    T, update = 2 * m + 2, m + 1
    rng = np.random.default_rng(9)
    keys = mem.unit_vectors(rng, trials, T, d)
    values = mem.unit_vectors(rng, trials, T, d)
    keys[:, update] = keys[:, 0]                   # the same key k*, written twice
    v_old, v_new = values[:, 0, 0], values[:, update, 0]
    queries = np.broadcast_to(keys[:, :1], keys.shape)
    rows = []
    for rule in RULES:
        out = reads(rule, queries, keys, values)[:, :, 0]                     # [trials, T, d]
        current = np.where((np.arange(T) < update)[None, :, None], v_old[:, None], v_new[:, None])
        error = np.linalg.norm(out - current, axis=-1)                       # vs the fact at that time
        old_part = np.einsum("btd,bd->bt", out, v_old)                       # how much v_old is in the read
        rows.append({
            "rule": rule,
            "error": error.mean(0).tolist(),
            "old_part": old_part.mean(0).tolist(),
            "error_before": float(error[:, update - 1].mean()),
            "error_at_update": float(error[:, update].mean()),
            "worst_error_at_update": float(error[:, update].max()),
            "old_part_at_update": float(old_part[:, update].mean()),
            "error_at_end": float(error[:, -1].mean()),
        })
    return {"d": d, "m": m, "trials": trials, "T": T, "update": update, "alpha": ALPHA,
            "predicted_additive_error": float(np.sqrt(1 + m / d)), "rows": rows}


def table(data: dict) -> str:
    u, T = data["update"], data["T"]
    lines = [f"{'write rule':22s} | {'error vs v_old':>16s} | {'error vs v_new':>16s} {'v_old left':>10s} | "
             f"{'error vs v_new':>16s}",
             f"{'':22s} | {'t = ' + str(u - 1) + ' (before)':>16s} | {'t = ' + str(u) + ' (update)':>16s} "
             f"{'':>10s} | {'t = ' + str(T - 1) + ' (end)':>16s}"]
    for r in data["rows"]:
        lines.append(f"{r['rule']:22s} | {r['error_before']:16.3f} | {r['error_at_update']:16.2e} "
                     f"{r['old_part_at_update']:10.3f} | {r['error_at_end']:16.3f}")
    lines.append(f"(d = {data['d']}, m = {data['m']} random distractor pairs before and after the update, unit keys and "
                 f"values, mean over {data['trials']} trials; error: ||read(k*) - current value||; v_old left: "
                 f"<read, v_old>; decay alpha = {data['alpha']}. Additive at the update: ||v_old + cross-talk|| ~ "
                 f"sqrt(1 + m/d) = {data['predicted_additive_error']:.2f})")
    return "\n".join(lines)


def plot(data: dict, path: str) -> None:
    fig, (ax,) = _plot.subplots(1, width=7)
    t = np.arange(data["T"])
    for r in data["rows"]:
        ax.plot(t, np.maximum(r["error"], 1e-17), "o-", ms=3, label=r["rule"])  # 0 drawn at 1e-17 (log axis)
    ax.axvline(data["update"], color="gray", lw=0.8, ls=":", label="value of k* changes")
    ax.set(yscale="log", xlabel="position t (tokens)", ylabel="||read(k*) - current value of k*|| (0 drawn at 1e-17)",
           title="Which write rule follows the change")
    ax.legend(fontsize=8)
    _plot.save(fig, path, "fact_update")
