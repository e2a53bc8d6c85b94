"""The bracket move: (Q K^T) V and Q (K^T V) are the same product, at different costs.

For Q, K [n, d] and V [n, d] (one head, no mask), counting a multiply-add as 2 FLOPs:
    (Q K^T) V:  Q K^T is n x n (2 n^2 d), times V (2 n^2 d)       = 4 n^2 d   quadratic in n
    Q (K^T V):  K^T V is d x d (2 n d^2), Q times it (2 n d^2)    = 4 n d^2   linear in n
The ratio is n / d, so the FLOP crossover is exactly n = d; past it the right bracket wins by n / d.
Softmax cannot move the bracket (exp sits between Q K^T and V); a kernel phi(Q) phi(K)^T can, and that
is linear attention. The measured crossover on this CPU differs from n = d because small products are
dominated by call overheads, not FLOPs: the table reports where the measured times cross.

Plain NumPy products, float64; the causal forms of the mixers (whose parallel form is the left bracket
and whose recurrence is the right one) are timed in the `forms` and `cost` experiments.
"""
from __future__ import annotations

import time

import numpy as np

from .. import catalog
from . import _plot, _timing


def flops_left(n: int, d: int) -> int:
    """(Q K^T) V: 4 n^2 d."""
    return 4 * n * n * d


def flops_right(n: int, d: int) -> int:
    """Q (K^T V): 4 n d^2."""
    return 4 * n * d * d


def left_bracket(q, k, v):
    """(Q K^T) V: [n, d] x3 -> [n, d], through the n x n score matrix."""
    return (q @ k.T) @ v


def right_bracket(q, k, v):
    """Q (K^T V): [n, d] x3 -> [n, d], through the d x d state."""
    return q @ (k.T @ v)


def timed_ms(fn, budget_s: float) -> float:
    """Time of fn() in ms: the fastest of as many calls (3 to 50) as fit in about `budget_s`."""
    start = time.perf_counter()
    fn()
    once = time.perf_counter() - start
    return _timing.best_ms(fn, int(min(50, max(3, budget_s / max(once, 1e-7)))))


def sizes(quick: bool) -> dict:
    """Powers of two, plus 48 and 96 to place the crossover near n = d = 64 more finely."""
    ns = sorted([2 ** e for e in range(3, 11 if quick else 13)] + [48, 96])
    return dict(d=64, ns=ns, budget_s=0.02 if quick else 0.06)


def run(quick: bool = False) -> dict:
    p = sizes(quick)
    d = p["d"]
    rng = np.random.default_rng(2)
    load_before = _timing.machine_load()
    rows = []
    for n in p["ns"]:
        q, k, v = (rng.standard_normal((n, d)) for _ in range(3))
        left = left_bracket(q, k, v)
        right = right_bracket(q, k, v)
        rows.append({
            "n": n,
            "flops_left": flops_left(n, d),
            "flops_right": flops_right(n, d),
            "ms_left": timed_ms(lambda: left_bracket(q, k, v), p["budget_s"]),
            "ms_right": timed_ms(lambda: right_bracket(q, k, v), p["budget_s"]),
            "relative_difference": catalog.relative_error(right, left),
        })
    return {"d": d, "rows": rows, "measured_crossover": measured_crossover(rows),
            "load": _timing.busiest(load_before, _timing.machine_load())}


def measured_crossover(rows: list[dict]):
    """The smallest n from which Q (K^T V) is faster at every larger n measured (None if never)."""
    crossover = None
    for r in reversed(rows):
        if r["ms_right"] < r["ms_left"]:
            crossover = r["n"]
        else:
            break
    return crossover


def table(data: dict) -> str:
    d = data["d"]
    lines = [f"{'n':>6s} {'n/d':>6s} | {'FLOPs (QK^T)V':>14s} {'FLOPs Q(K^TV)':>14s} {'ratio':>7s} | "
             f"{'ms (QK^T)V':>10s} {'ms Q(K^TV)':>10s} {'speed-up':>8s}"]
    for r in data["rows"]:
        lines.append(f"{r['n']:6d} {r['n'] / d:6.3g} | {r['flops_left']:14.3g} {r['flops_right']:14.3g} "
                     f"{r['flops_left'] / r['flops_right']:7.3g} | {r['ms_left']:10.4f} {r['ms_right']:10.4f} "
                     f"{r['ms_left'] / r['ms_right']:7.2f}x")
    crossing = data["measured_crossover"]
    measured = f"n = {crossing} (n/d = {crossing / d:g})" if crossing else "not reached"
    worst = max(r["relative_difference"] for r in data["rows"])
    lines.append(f"(d = {d}, float64, one head, no mask, best wall time on this CPU. FLOP crossover: n = d = {d}; "
                 f"measured time crossover: {measured}. Both orders agree to {worst:.0e}.)")
    note = _timing.load_note(data["load"])
    return "\n".join(lines + ([note] if note else []))


def plot(data: dict, path: str) -> None:
    fig, (left, right) = _plot.subplots(2)
    n = [r["n"] for r in data["rows"]]
    left.plot(n, [r["flops_left"] for r in data["rows"]], "o-", label="(QK^T)V: 4 n^2 d")
    left.plot(n, [r["flops_right"] for r in data["rows"]], "s-", label="Q(K^TV): 4 n d^2")
    right.plot(n, [r["ms_left"] for r in data["rows"]], "o-", label="(QK^T)V")
    right.plot(n, [r["ms_right"] for r in data["rows"]], "s-", label="Q(K^TV)")
    for ax, what in ((left, "FLOPs"), (right, "time on this CPU (ms)")):
        ax.axvline(data["d"], color="gray", lw=0.8, ls=":", label=f"n = d = {data['d']}")
        ax.set(xscale="log", yscale="log", xlabel="sequence length n", ylabel=what)
        ax.legend(fontsize=8)
    if data["measured_crossover"]:
        right.axvline(data["measured_crossover"], color="C3", lw=0.8, ls="--", label="measured crossover")
        right.legend(fontsize=8)
    left.set_title("Counted: the orders cross at n = d")
    right.set_title("Measured")
    _plot.save(fig, path)
