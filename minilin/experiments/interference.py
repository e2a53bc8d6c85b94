"""Interference: one query's read, split into its own pair's term and the other pairs' cross-talk.

The additive memory S = sum_j k_j v_j^T is linear in the pairs written, so the read at key k_i splits as

    S^T k_i = (k_i . k_i) v_i + sum_{j != i} (k_j . k_i) v_j  =  own term + cross-talk

and each part is what the mixer returns when only those pairs are written. The experiment runs the mixer
three ways (all pairs, pair i alone, all pairs but i) and checks that the parts add up to the whole,
then writes the others with one-hot values to read off each one's coefficient k_j . k_i and so its term.
With unit keys the own term is v_i exactly, whatever n. With orthogonal keys the cross-talk is zero up
to n = d and appears as soon as n passes d; with random unit keys it is there from the first pair and
is made of many small terms (|k_j . k_i| ~ 1/sqrt(d)) that add like a random walk: ||cross|| ~ sqrt((n-1)/d).

Shapes: keys, values [trials, n, 1, d] (unit vectors); the query is pair i = 0; reads [trials, 1, 1, d].
"""
from __future__ import annotations

import numpy as np

from . import _associative as mem, _plot

QUERY = 0  # which pair is read back (the first written; the additive memory does not care about order)


def sizes(quick: bool) -> dict:
    d = 32 if quick else 64
    return dict(d=d, trials=8 if quick else 16, ns=[max(2, d * m // 4) for m in (1, 2, 3, 4, 5, 6, 8, 12, 16)])


def split_read(keys, values, i: int = QUERY) -> dict:
    """Read pair i from the memory of all pairs, of pair i alone and of the others; [trials, d] each."""
    query = keys[:, i:i + 1]
    others = np.delete(np.arange(keys.shape[1]), i)
    total = mem.read(mem.write_additive(keys, values), query)[:, 0, 0]
    own = mem.read(mem.write_additive(keys[:, i:i + 1], values[:, i:i + 1]), query)[:, 0, 0]
    cross = mem.read(mem.write_additive(keys[:, others], values[:, others]), query)[:, 0, 0]
    # The weight of each other pair in the read: the same memory written with one-hot values e_j, so that
    # its read at k_i is the vector of coefficients (k_j . k_i). Each cross term is that coefficient times v_j.
    trials, n = keys.shape[:2]
    slots = mem.slot_values(trials, n - 1)
    coefficients = mem.read(mem.write_additive(keys[:, others], slots), query)[:, 0, 0]  # [trials, n - 1]
    terms = coefficients[..., None] * values[:, others, 0]                              # [trials, n - 1, d]
    return {"total": total, "own": own, "cross": cross, "terms": terms}


def run(quick: bool = False) -> dict:
    p = sizes(quick)
    d, trials = p["d"], p["trials"]
    rng = np.random.default_rng(5)
    rows = []
    for n in p["ns"]:
        values = mem.unit_vectors(rng, trials, n, d)
        orthogonal = split_read(mem.orthogonal_keys(rng, trials, n, d), values)
        random = split_read(mem.unit_vectors(rng, trials, n, d), values)
        target = values[:, QUERY, 0]
        norm = lambda x: np.linalg.norm(x, axis=-1)  # noqa: E731
        cosine = np.sum(random["total"] * target, -1) / (norm(random["total"]) * norm(target))
        rows.append({
            "n": n,
            "own_norm": mem.rms(norm(random["own"])),
            "own_error": float(max(np.abs(s["own"] - target).max() for s in (orthogonal, random))),
            "parts_sum_error": float(max(np.abs(s["own"] + s["cross"] - s["total"]).max()
                                         for s in (orthogonal, random))),
            "terms_sum_error": float(np.abs(random["terms"].sum(1) - random["cross"]).max()),
            "orthogonal_cross": mem.rms(norm(orthogonal["cross"])),
            "random_cross": mem.rms(norm(random["cross"])),
            "predicted_cross": float(np.sqrt((n - 1) / d)),
            "largest_term": float(np.mean(norm(random["terms"]).max(-1))),
            "cosine": float(np.mean(cosine)),
        })
    return {"d": d, "trials": trials, "rows": rows}


def table(data: dict) -> str:
    lines = [f"{'n':>5s} {'n/d':>5s} {'|own|':>6s} | {'|cross|, orthogonal':>19s} | {'|cross|, random':>15s} "
             f"{'sqrt((n-1)/d)':>13s} {'largest term':>12s} {'cos(read, v)':>12s}"]
    for r in data["rows"]:
        lines.append(f"{r['n']:5d} {r['n'] / data['d']:5.2f} {r['own_norm']:6.3f} | {r['orthogonal_cross']:19.2e} | "
                     f"{r['random_cross']:15.3f} {r['predicted_cross']:13.3f} {r['largest_term']:12.3f} "
                     f"{r['cosine']:12.3f}")
    worst = max(max(r["parts_sum_error"], r["terms_sum_error"]) for r in data["rows"])
    lines.append(f"(d = {data['d']}, unit keys and values, query = the first pair, RMS over {data['trials']} trials; "
                 f"own + cross = read and the single terms sum to the cross-talk to {worst:.0e}; "
                 f"largest term: the biggest single |(k_j . k_i) v_j|)")
    return "\n".join(lines)


def plot(data: dict, path: str) -> None:
    fig, (ax,) = _plot.subplots(1, width=6.5)
    n = [r["n"] for r in data["rows"]]
    ax.plot(n, [r["own_norm"] for r in data["rows"]], "o-", label="own term |v_i| (either key set)")
    ax.plot(n, [r["random_cross"] for r in data["rows"]], "s-", label="cross-talk, random unit keys")
    ax.plot(n, [r["predicted_cross"] for r in data["rows"]], "k--", label="sqrt((n-1)/d)")
    ax.plot(n, [r["orthogonal_cross"] for r in data["rows"]], "^-", label="cross-talk, orthogonal keys")
    ax.plot(n, [r["largest_term"] for r in data["rows"]], "x:", label="largest single cross term (random)")
    ax.axvline(data["d"], color="gray", lw=0.8, ls=":", label="n = d")
    ax.set(xscale="log", xlabel="pairs written n", ylabel="norm of the part of the read (unit values)",
           title=f"One read, split: own term vs cross-talk (d = {data['d']})")
    _plot.plain_ticks(ax, n)
    ax.legend(fontsize=8)
    _plot.save(fig, path, "interference")
