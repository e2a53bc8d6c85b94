"""State tracking: the parity of a bit string with a one-dimensional delta rule and hand-set weights.

With K = V = 1 and key k = 1 the delta rule is S_t = (1 - beta_t) S_{t-1} + beta_t v_t: the transition
1 - beta_t k k^T is a number, in [0, 1] for beta in [0, 1] and in [-1, 1] for beta in [0, 2]
(allow_neg_eigval=True, Grazzi et al. 2025).
- beta in [0, 2]: a start token writes S = 1 (beta = 1, v = 1); then bit x_t gets beta_t = 2 x_t, v_t = 0,
  so a 1 multiplies S by 1 - 2 = -1 and a 0 leaves it. The read o_t = S_t = (-1)^(x_1 + ... + x_t): its
  sign is the parity, exactly (multiplying by -1 is exact in floating point), at every length.
- beta in [0, 1]: each bit's map S -> (1 - beta) S + beta v is non-decreasing. Read through a threshold
  theta, a parity tracker needs a 1 bit to send a state a < theta to f(a) > theta and f(a) back below
  theta; but a < f(a) gives f(a) <= f(f(a)) for a non-decreasing f, so no setting gets every string right.
  To show how far off it is, every hand-set choice on a grid (beta and v for a 0 bit and for a 1 bit:
  4 x 4 x 3 x 3 = 144 settings, one per head) is run, each gets the best threshold and sign on training
  strings, and the best setting is scored on held-out strings. Short strings can still be partly right
  (one bit: exact); as strings grow the score falls to chance (a threshold on a count of ones, the best
  such a state can offer, is right 0.5 + O(1/sqrt(L)) of the time).
All settings run in one call of `deltanet.recurrent`, one head per setting; the [0, 2] construction also
runs through `deltanet.chunked` (the WY form), which must agree.
Shapes: q, k, v [strings, T = L + 1, heads, 1], beta [strings, T, heads].
"""
from __future__ import annotations

import itertools

import numpy as np

from ..mixers import deltanet
from . import _plot

BETAS = (0.0, 1 / 3, 2 / 3, 1.0)
WRITES = (-1.0, 0.0, 1.0)


def sizes(quick: bool) -> dict:
    return dict(strings=512, L=64 if quick else 256)


def run_delta(bits, beta_for_bit, value_for_bit, allow_neg_eigval: bool, form: str = "recurrent"):
    """Run the 1-D delta rule over bit strings [strings, L], one head per setting.

    beta_for_bit, value_for_bit: [heads, 2], the (beta, v) a 0 bit and a 1 bit write. A start token
    (beta = 1, v = 1) first sets S = 1. Returns the reads o_t = S_t after each bit: [strings, L, heads].
    """
    strings, L = bits.shape
    heads = beta_for_bit.shape[0]
    is_one = bits[..., None].astype(bool)                                # [strings, L, 1]
    beta = np.where(is_one, beta_for_bit[:, 1], beta_for_bit[:, 0])     # [strings, L, heads]
    value = np.where(is_one, value_for_bit[:, 1], value_for_bit[:, 0])
    beta = np.concatenate([np.ones((strings, 1, heads)), beta], axis=1)
    value = np.concatenate([np.ones((strings, 1, heads)), value], axis=1)[..., None]
    ones = np.ones((strings, L + 1, heads, 1))
    out, _ = getattr(deltanet, form)(ones, ones, value, beta, scale=1.0, allow_neg_eigval=allow_neg_eigval)
    return out[:, 1:, :, 0]


def fit_threshold(x, y):
    """The threshold and sign that best predict y in {0, 1} from x [N] as y = [sign * (x - threshold) > 0].

    Split the sorted x before position i (i = 0..N) and predict 1 from there on (sign +1) or before it
    (sign -1); only splits between distinct values count, so equal reads always get the same answer.
    """
    order = np.argsort(x, kind="stable")
    xs, ys = x[order], y[order]
    ones_from = np.concatenate([[ys.sum()], ys.sum() - np.cumsum(ys)])   # [N + 1]
    zeros_before = np.concatenate([[0], np.cumsum(1 - ys)])
    up = (ones_from + zeros_before) / len(xs)                             # accuracy with sign +1
    valid = np.concatenate([[True], xs[1:] != xs[:-1], [True]])
    score = np.where(valid, np.maximum(up, 1 - up), -1.0)
    i = int(np.argmax(score))
    threshold = -np.inf if i == 0 else np.inf if i == len(xs) else (xs[i - 1] + xs[i]) / 2
    return threshold, (1.0 if up[i] >= 1 - up[i] else -1.0)


def accuracy(x, y, threshold, sign) -> float:
    return float(np.mean((sign * (x - threshold) > 0) == y))


def run(quick: bool = False) -> dict:
    p = sizes(quick)
    L = p["L"]
    rng = np.random.default_rng(11)
    bits = rng.integers(0, 2, (p["strings"], L))
    parity = np.cumsum(bits, axis=1) % 2
    train, test = slice(0, p["strings"] // 2), slice(p["strings"] // 2, None)
    lengths = [n for n in (1, 2, 3, 4, 8, 16, 64, 256) if n <= L]

    # beta in [0, 2]: the construction.
    flip = run_delta(bits, np.array([[0.0, 2.0]]), np.array([[0.0, 0.0]]), True)[..., 0]
    flip_chunked = run_delta(bits, np.array([[0.0, 2.0]]), np.array([[0.0, 0.0]]), True, "chunked")[..., 0]

    # beta in [0, 1]: every setting on the grid, one head each.
    settings = list(itertools.product(BETAS, BETAS, WRITES, WRITES))  # (beta_0, beta_1, v_0, v_1)
    grid = np.array(settings)
    reads = run_delta(bits, grid[:, :2], grid[:, 2:], False)           # [strings, L, heads]

    rows = []
    for n in lengths:
        t, y = n - 1, parity[:, n - 1]
        fits = [fit_threshold(reads[train, t, h], y[train]) for h in range(len(settings))]
        train_scores = [accuracy(reads[train, t, h], y[train], *fits[h]) for h in range(len(settings))]
        best = int(np.argmax(train_scores))
        rows.append({
            "L": n,
            "negative_eigenvalues": float(np.mean((flip[:, t] < 0) == parity[:, t])),
            "best_setting": dict(zip(("beta_0", "beta_1", "v_0", "v_1"), settings[best])),
            "best_train": train_scores[best],
            "best_held_out": accuracy(reads[test, t, best], y[test], *fits[best]),
        })
    return {
        "strings": p["strings"], "settings": len(settings), "rows": rows,
        "flip_values": sorted({float(v) for v in np.unique(flip)}),
        "chunked_difference": float(np.abs(flip_chunked - flip).max()),
        "all_positions_exact": bool(np.all((flip < 0) == parity)),
    }


def table(data: dict) -> str:
    lines = [f"{'length':>6s} | {'beta in [0, 2]':>14s} | {'beta in [0, 1]: best of ' + str(data['settings']):>26s} "
             f"{'(train)':>8s}  best setting (beta_0, beta_1, v_0, v_1)"]
    for r in data["rows"]:
        s = r["best_setting"]
        lines.append(f"{r['L']:6d} | {r['negative_eigenvalues']:14.3f} | {r['best_held_out']:26.3f} "
                     f"{r['best_train']:8.3f}  ({s['beta_0']:.2g}, {s['beta_1']:.2g}, {s['v_0']:g}, {s['v_1']:g})")
    lines.append(f"(parity accuracy after `length` bits, sign/threshold readout, {data['strings'] // 2} held-out strings, "
                 f"chance 0.5. beta in [0, 2]: reads are exactly {data['flip_values']}, right at every position: "
                 f"{data['all_positions_exact']}; chunked (WY) form differs by {data['chunked_difference']:.0e})")
    return "\n".join(lines)


def plot(data: dict, path: str) -> None:
    fig, (ax,) = _plot.subplots(1, width=6.5)
    L = [r["L"] for r in data["rows"]]
    ax.plot(L, [r["negative_eigenvalues"] for r in data["rows"]], "o-", label="beta in [0, 2]: beta = 2 x_t, v = 0")
    ax.plot(L, [r["best_held_out"] for r in data["rows"]], "s-",
            label=f"beta in [0, 1]: best of {data['settings']} hand-set settings (held out)")
    ax.axhline(0.5, color="gray", lw=0.8, ls=":", label="chance")
    ax.set(xscale="log", ylim=(0.3, 1.05), xlabel="string length (bits)", ylabel="parity accuracy (held-out strings)",
           title="Parity with a one-dimensional delta rule")
    _plot.plain_ticks(ax, L)
    ax.legend(fontsize=8)
    _plot.save(fig, path, "state_tracking")
