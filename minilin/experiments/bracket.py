"""The bracket move: (Q K^T) V and Q (K^T V) are the same product, at different costs.

For Q, K [n, d] and V [n, d] (one head, no mask), counting a multiply-add as 2 FLOPs:
    (Q K^T) V:  Q K^T is n x n (2 n^2 d), times V (2 n^2 d)       = 4 n^2 d   quadratic in n
    Q (K^T V):  K^T V is d x d (2 n d^2), Q times it (2 n d^2)    = 4 n d^2   linear in n
The ratio is n / d, so the FLOP crossover is exactly n = d; past it the right bracket wins by n / d.
Softmax cannot move the bracket (exp sits between Q K^T and V); a kernel phi(Q) phi(K)^T can, and that
is linear attention. The measured crossover on this CPU can differ from n = d because small products are
dominated by call overheads, not FLOPs: the table reports where the measured times cross.

Plain NumPy products, float64, timed on one BLAS thread (the FLOP count is the claim, and one thread's time
follows it) in alternating rounds, median per size (experiments/_timing.py). The measured claims (the orders
cross, and past the crossing the state-first order's lead grows about like n / d) are checked on each run's
numbers; one that a run does not reproduce is said under the table and on the plot. The causal forms of the
mixers (whose parallel form is the left bracket and whose recurrence is the right one) are timed in the
`forms` and `cost` experiments.
"""
from __future__ import annotations

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


def sizes(quick: bool) -> dict:
    """Powers of two, plus 48 and 96 to place the crossover near n = d = 64 more finely."""
    ns = sorted([2 ** e for e in range(3, 11 if quick else 13)] + [48, 96])
    return dict(d=64, ns=ns, rounds=3 if quick else 5, budget_s=0.004 if quick else 0.01)


def measure(ns: list[int], d: int, rounds: int, budget_s: float, clock: str = "cpu", seed: int = 2) -> list[dict]:
    """Both orders at every n, timed together in alternating rounds (in the timing process: one BLAS thread).

    Returns one row per n: {"n", "ms_left", "ms_right" (medians), "spread_left", "spread_right" (how far the
    rounds disagree), "relative_difference" (||right - left|| / ||left||)}."""
    rng = np.random.default_rng(seed)
    rows, fns = [], {}
    for n in ns:
        q, k, v = (rng.standard_normal((n, d)) for _ in range(3))
        rows.append({"n": n, "relative_difference": catalog.relative_error(right_bracket(q, k, v),
                                                                          left_bracket(q, k, v))})
        fns[n, "left"] = lambda q=q, k=k, v=v: left_bracket(q, k, v)
        fns[n, "right"] = lambda q=q, k=k, v=v: right_bracket(q, k, v)
    timed = _timing.alternating_ms(fns, rounds, budget_s, clock)
    for row in rows:
        for side in ("left", "right"):
            t = timed[row["n"], side]
            row[f"ms_{side}"], row[f"spread_{side}"] = t["ms"], _timing.spread(t["rounds_ms"])
    return rows


def run(quick: bool = False) -> dict:
    p = sizes(quick)
    d = p["d"]
    load_before = _timing.machine_load()
    timing = "CPU time of one BLAS thread"
    try:
        rows = _timing.single_threaded(measure, ns=p["ns"], d=d, rounds=p["rounds"], budget_s=p["budget_s"])
    except (RuntimeError, OSError) as error:  # timed here instead; the table says so
        rows = measure(p["ns"], d, p["rounds"], p["budget_s"], clock="wall")
        timing = (f"wall-clock time with this process's BLAS threads (the one-thread process failed: "
                  f"{str(error).splitlines()[0]})")
    for r in rows:
        r["flops_left"], r["flops_right"] = flops_left(r["n"], d), flops_right(r["n"], d)
    data = {"d": d, "rows": rows, "rounds": p["rounds"], "timing": timing, "measured_crossover": measured_crossover(rows),
            "load": _timing.busiest(load_before, _timing.machine_load())}
    data["checks"] = checks(data)
    return data


def measured_crossover(rows: list[dict]):
    """The smallest n from which Q (K^T V) is faster at every larger n measured (None if never)."""
    crossover = None
    for r in reversed(rows):
        if r["ms_right"] < r["ms_left"]:
            crossover = r["n"]
        else:
            break
    return crossover


LEAD_SHARE = 0.5  # past the crossing, a measured lead of at least this share of n / d counts as "wins by n/d"


def checks(data: dict) -> list[dict]:
    """The measured claims, each {"claim", "reproduced", "measured"}: the orders cross (the state-first order
    is faster from some n on), and past the crossing its lead grows with n, by about n / d (at least
    LEAD_SHARE of it at each of the three largest n, and larger at each; more than n / d is allowed: the left
    order also writes and reads the n x n score matrix, which FLOPs do not count)."""
    rows, d = data["rows"], data["d"]
    crossing = data["measured_crossover"]
    top = rows[-3:]
    leads = [r["ms_left"] / r["ms_right"] for r in top]
    grows = all(b > a for a, b in zip(leads, leads[1:]))
    enough = all(lead >= LEAD_SHARE * r["n"] / d for lead, r in zip(leads, top))
    return [
        {"claim": "the measured times cross: Q(K^T V) is faster from some n on",
         "reproduced": crossing is not None,
         "measured": f"faster from n = {crossing}" if crossing else
                     f"still slower at n = {rows[-1]['n']} ({leads[-1]:.2f}x)"},
        {"claim": "past the crossing the state-first order wins by about n/d, more as n grows",
         "reproduced": crossing is not None and grows and enough,
         "measured": ", ".join(f"{lead:.1f}x at n = {r['n']} (n/d = {r['n'] / d:g})" for lead, r in zip(leads, top))},
    ]


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
    noisiest = max(max(r["spread_left"], r["spread_right"]) for r in data["rows"])
    lines.append(f"(d = {d}, float64, one head, no mask; this CPU, {data['timing']}, median of {data['rounds']} "
                 f"alternating rounds, which disagree by up to {noisiest:.0%}. FLOP crossover: n = d = {d}; "
                 f"measured time crossover: {measured}. Both orders agree to {worst:.0e}.)")
    lines += _timing.not_reproduced(data["checks"])
    note = _timing.load_note(data["load"])
    return "\n".join(lines + ([note] if note else []))


def plot(data: dict, path: str) -> None:
    fig, (left, right) = _plot.subplots(2)
    n = [r["n"] for r in data["rows"]]
    left.plot(n, [r["flops_left"] for r in data["rows"]], "o-", label="(QK^T)V: 4 n^2 d")
    left.plot(n, [r["flops_right"] for r in data["rows"]], "s-", label="Q(K^TV): 4 n d^2")
    right.plot(n, [r["ms_left"] for r in data["rows"]], "o-", label="(QK^T)V")
    right.plot(n, [r["ms_right"] for r in data["rows"]], "s-", label="Q(K^TV)")
    for ax in (left, right):
        ax.axvline(data["d"], color="gray", lw=0.8, ls=":", label=f"n = d = {data['d']} (FLOPs equal)")
    if data["measured_crossover"]:
        right.axvline(data["measured_crossover"], color="C3", lw=0.8, ls="--",
                      label=f"measured crossover, n = {data['measured_crossover']}")
    left.set(xscale="log", yscale="log", xlabel="sequence length n", ylabel="FLOPs (multiply-add = 2)",
             title=f"Counted: the orders cross at n = d = {data['d']}")
    right.set(xscale="log", yscale="log", xlabel="sequence length n", ylabel="CPU time per call (ms, one thread)",
              title=f"Measured on this CPU (median of {data['rounds']} rounds)")
    for ax in (left, right):
        _plot.plain_ticks(ax, [x for x in n if x not in (48, 96)])
        ax.legend(fontsize=8)
    _plot.save(fig, path, "bracket", _timing.not_reproduced(data["checks"]))
