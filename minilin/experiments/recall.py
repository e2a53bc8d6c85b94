"""Far-key recall: associative recall with explicit writes and no training.

n pairs (key, token id) are written into each memory; every key is then queried, and the read is decoded
as the token id with the largest score (values are one-hot rows over a vocabulary of token ids). "Far"
keys are the oldest quarter, written longest before the query. Nothing is learned: keys are random unit
vectors, the write strength and decay are set by hand, so the table shows what each memory can hold.
    softmax attention: keeps every key; the right one's logit s = sqrt(d) stands out from the others'
                       ~N(0, 1) (the usual q . k / sqrt(d) for keys of norm sqrt(d))
    linear attention:  additive d x vocab state; cross-talk grows like sqrt(n / d)
    DeltaNet:          delta rule, beta = 1: newest pairs exact, older ones partly erased by later writes
    Gated DeltaNet:    the same, with the state also decayed by alpha = 0.99 per token
Shapes: keys [trials, n, 1, d], values [trials, n, 1, vocab]; each memory is written by its mixer.
"""
from __future__ import annotations

import numpy as np

from . import _associative as mem, _plot

VOCAB = 64
ALPHA = 0.99
MEMORIES = ("softmax", "linear attention", "DeltaNet", "Gated DeltaNet")


def sizes(quick: bool) -> dict:
    return dict(ds=[16, 32] if quick else [16, 32, 64], multiples=[0.5, 1, 2, 4], trials=4 if quick else 8)


def decode(reads) -> np.ndarray:
    """Reads [trials, n, 1, vocab] -> token ids [trials, n]: the highest-scoring id."""
    return reads[:, :, 0].argmax(-1)


def recall_reads(memory: str, keys, values) -> np.ndarray:
    d = keys.shape[-1]
    if memory == "softmax":
        return mem.softmax_read(keys, values, keys, np.sqrt(d))
    if memory == "linear attention":
        return mem.read(mem.write_additive(keys, values), keys)
    if memory == "DeltaNet":
        return mem.read(mem.write_delta(keys, values, 1.0), keys)
    if memory == "Gated DeltaNet":
        return mem.read(mem.write_delta(keys, values, 1.0, log_decay=np.log(ALPHA)), keys)
    raise ValueError(f"memory: expected one of {MEMORIES}, got {memory!r}")


def run(quick: bool = False) -> dict:
    p = sizes(quick)
    rng = np.random.default_rng(10)
    rows = []
    for d in p["ds"]:
        for multiple in p["multiples"]:
            n = int(multiple * d)
            keys = mem.unit_vectors(rng, p["trials"], n, d)
            ids = rng.integers(0, VOCAB, (p["trials"], n))
            values = mem.one_hot(ids, VOCAB)[:, :, None, :]
            far = max(1, n // 4)
            row = {"d": d, "n": n, "accuracy": {}, "far_accuracy": {}}
            for memory in MEMORIES:
                correct = decode(recall_reads(memory, keys, values)) == ids
                row["accuracy"][memory] = float(correct.mean())
                row["far_accuracy"][memory] = float(correct[:, :far].mean())
            rows.append(row)
    return {"vocab": VOCAB, "alpha": ALPHA, "trials": p["trials"], "rows": rows}


def table(data: dict) -> str:
    lines = [f"{'d':>4s} {'n':>5s} {'n/d':>5s} | " + " ".join(f"{m:>18s}" for m in MEMORIES),
             f"{'':16s} | " + " ".join(f"{'all (far 1/4)':>18s}" for _ in MEMORIES)]
    for r in data["rows"]:
        cells = " ".join(f"{r['accuracy'][m]:10.3f} ({r['far_accuracy'][m]:.2f})" for m in MEMORIES)
        lines.append(f"{r['d']:4d} {r['n']:5d} {r['n'] / r['d']:5.2g} | {cells}")
    lines.append(f"(accuracy of the decoded token id, vocabulary {data['vocab']} (chance {1 / data['vocab']:.3f}), "
                 f"{data['trials']} trials; far: the oldest quarter of the pairs; DeltaNet beta = 1, Gated DeltaNet "
                 f"beta = 1 and alpha = {data['alpha']}; random unit keys, nothing trained)")
    return "\n".join(lines)


def plot(data: dict, path: str) -> None:
    ds = sorted({r["d"] for r in data["rows"]})
    fig, axes = _plot.subplots(len(ds), width=4.2)
    for ax, d in zip(axes, ds):
        rows = [r for r in data["rows"] if r["d"] == d]
        n = [r["n"] for r in rows]
        for memory in MEMORIES:
            line, = ax.plot(n, [r["accuracy"][memory] for r in rows], "o-", label=memory)
            ax.plot(n, [r["far_accuracy"][memory] for r in rows], "s:", color=line.get_color())
        ax.axvline(d, color="gray", lw=0.8, ls=":", label="n = d")
        ax.set(xscale="log", ylim=(0, 1.03), xlabel="pairs written n", title=f"d = {d}")
        _plot.plain_ticks(ax, n)
    axes[0].set_ylabel("recall accuracy (solid: all keys, dotted: oldest 1/4)")
    from matplotlib.lines import Line2D

    marks, labels = axes[0].get_legend_handles_labels()
    axes[0].legend(marks + [Line2D([], [], color="gray", marker="o", label="all keys"),
                            Line2D([], [], color="gray", marker="s", ls=":", label="the oldest quarter")],
                   labels + ["all keys", "the oldest quarter"], fontsize=7, loc="lower left")
    _plot.save(fig, path, "recall")
