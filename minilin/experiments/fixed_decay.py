"""Fixed decay: how quickly a written item fades under RetNet's per-head decays.

RetNet multiplies the state by a fixed gamma_h per head at every token, S_t = gamma S_{t-1} + k_t v_t^T,
with gamma_h = 1 - 2^(-5-h). One pair (k, v) written at t = 0 and read with q = k at time t gives
    signal_t = gamma^t (k . k) v = gamma^t v:      half-life log(1/2) / log(gamma) = 22, 44, ..., 2839 tokens,
whatever is written after it. What is written after it does matter for whether the item can still be read:
with a fresh random unit pair written at every token, the read at k also picks up their cross-talk,
    ||cross_t||^2 ~ sum_{j=1..t} gamma^(2(t-j)) / d = (1 - gamma^(2t)) / ((1 - gamma^2) d),
so a slow head keeps an item longer but also accumulates more noise on top of it. The experiment runs
RetNet three ways: the item alone (signal), the item then distractors (what a read returns), and the
distractors alone (cross-talk), with q = k at every position so each output is a read at that time.

Shapes: [trials, T, H, d] with RetNet's default gammas over H = 8 heads, unit keys and values, scale 1.
"""
from __future__ import annotations

import numpy as np

from ..mixers import retnet
from . import _associative as mem, _plot

CHECKPOINTS = (64, 512)


def sizes(quick: bool) -> dict:
    return dict(trials=4, T=1024 if quick else 4096, H=8, d=32)


def first_below(curve, level) -> int | None:
    """The first index at which curve <= level (None if it never is)."""
    hits = np.flatnonzero(np.asarray(curve) <= level)
    return int(hits[0]) if hits.size else None


def run(quick: bool = False) -> dict:
    p = sizes(quick)
    trials, T, H, d = p["trials"], p["T"], p["H"], p["d"]
    rng = np.random.default_rng(7)
    item_key = mem.unit_vectors(rng, trials, 1, d)[:, 0, 0]          # [trials, d]
    item_value = mem.unit_vectors(rng, trials, 1, d)[:, 0, 0]
    queries = np.broadcast_to(item_key[:, None, None, :], (trials, T, H, d))
    item_keys = np.zeros((trials, T, H, d))
    item_values = np.zeros((trials, T, H, d))
    item_keys[:, 0] = item_key[:, None]
    item_values[:, 0] = item_value[:, None]
    distractor_keys = np.concatenate([np.zeros((trials, 1, H, d)), _unit(rng, (trials, T - 1, H, d))], axis=1)
    distractor_values = np.concatenate([np.zeros((trials, 1, H, d)), _unit(rng, (trials, T - 1, H, d))], axis=1)

    signal, _ = retnet.chunked(queries, item_keys, item_values, scale=1.0)
    total, _ = retnet.chunked(queries, item_keys + distractor_keys, item_values + distractor_values, scale=1.0)
    cross, _ = retnet.chunked(queries, distractor_keys, distractor_values, scale=1.0)

    gamma = retnet.default_gamma(H)
    t = np.arange(T)
    retained = np.einsum("bthv,bv->th", signal, item_value) / trials          # mean of <read, v> [T, H]
    retained_with_writes = np.einsum("bthv,bv->th", total, item_value) / trials
    cross_rms = np.sqrt(np.mean(np.sum(cross ** 2, -1), axis=0))              # [T, H]
    heads = []
    for h in range(H):
        predicted_cross = np.sqrt((1 - gamma[h] ** (2 * t)) / ((1 - gamma[h] ** 2) * d))
        heads.append({
            "head": h,
            "gamma": float(gamma[h]),
            "predicted_half_life": float(np.log(0.5) / np.log(gamma[h])),
            "measured_half_life": first_below(retained[:, h], 0.5),
            "retained": retained[:, h].tolist(),
            "retained_with_writes": retained_with_writes[:, h].tolist(),
            "largest_deviation_from_gamma_t": float(np.abs(retained[:, h] - gamma[h] ** t).max()),
            "cross_talk": cross_rms[:, h].tolist(),
            "predicted_cross_talk": predicted_cross.tolist(),
            # measured / predicted cross-talk over the second half of the sequence (one time point is noisy)
            "cross_talk_ratio": float(np.sqrt(np.mean(cross_rms[T // 2:, h] ** 2) / np.mean(predicted_cross[T // 2:] ** 2))),
            "parts_sum_error": float(np.abs(signal[..., h, :] + cross[..., h, :] - total[..., h, :]).max()),
            "signal_below_cross_talk_at": first_below(retained[:, h] - cross_rms[:, h], 0.0),
        })
    return {"T": T, "d": d, "trials": trials, "heads": heads}


def _unit(rng, shape):
    x = rng.standard_normal(shape)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def table(data: dict) -> str:
    T = data["T"]
    marks = [c for c in CHECKPOINTS if c < T] + [T - 1]
    lines = [f"{'head':>4s} {'gamma':>9s} | {'half-life':>9s} {'measured':>8s} | "
             + " ".join(f"{'left @' + str(c):>10s}" for c in marks)
             + f" | {'cross-talk @' + str(T - 1):>16s} {'predicted':>9s} {'signal < cross-talk from t =':>28s}"]
    for h in data["heads"]:
        measured = "-" if h["measured_half_life"] is None else str(h["measured_half_life"])
        buried = h["signal_below_cross_talk_at"]
        buried = "never" if buried is None else str(buried)
        lines.append(f"{h['head']:4d} {h['gamma']:9.6f} | {h['predicted_half_life']:9.1f} {measured:>8s} | "
                     + " ".join(f"{h['retained'][c]:10.3g}" for c in marks)
                     + f" | {h['cross_talk'][T - 1]:16.3f} {h['predicted_cross_talk'][T - 1]:9.3f} {buried:>28s}")
    worst = max(h["largest_deviation_from_gamma_t"] for h in data["heads"])
    lines.append(f"(RetNet, d = {data['d']}, one unit pair written at t = 0 and read with its key at every t: the item "
                 f"left is gamma^t to {worst:.0e}; '-': half-life past T = {T}. Cross-talk: RMS norm of the read of "
                 f"one random unit pair written per token after it, over {data['trials']} trials.)")
    return "\n".join(lines)


def plot(data: dict, path: str) -> None:
    fig, (left, right) = _plot.subplots(2)
    t = np.arange(1, data["T"])
    for h in data["heads"]:
        line, = left.plot(t, h["retained"][1:], label=f"head {h['head']}: gamma = 1 - 2^-{5 + h['head']}")
        right.plot(t, h["cross_talk"][1:], color=line.get_color())
        right.plot(t, h["retained"][1:], color=line.get_color(), ls=":")
    left.axhline(0.5, color="gray", lw=0.8, ls=":", label="half of the item left")
    left.set(xscale="log", xlabel="tokens since the write t", ylabel="fraction of the item left (gamma^t)",
             title="RetNet's heads: how fast one item fades")
    left.legend(fontsize=7)
    right.set(xscale="log", yscale="log", xlabel="tokens since the write t", ylabel="norm of the read (unit values)",
              title="The item vs cross-talk of later writes (colors: heads)", ylim=(1e-3, None))
    from matplotlib.lines import Line2D

    right.legend(handles=[Line2D([], [], color="gray", label="cross-talk of the later writes (RMS)"),
                          Line2D([], [], color="gray", ls=":", label="the item left, gamma^t")], fontsize=7)
    _plot.save(fig, path, "fixed_decay")
