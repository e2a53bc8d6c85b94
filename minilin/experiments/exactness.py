"""Exactness: moving the bracket changes the cost, not the result.

Linear attention's parallel form computes the left bracket, (phi(Q) phi(K)^T masked causally) V, through
the T x T score matrix; its recurrence computes the right bracket, phi(q_t)^T (sum_{j<=t} phi(k_j) v_j^T),
through the running K x V state; the chunked form mixes the two. Matrix products are associative, so for
the same feature map phi they are one function, and in float64 they agree to rounding (~1e-16 relative,
growing slowly with the length of the sums). In float32 the same comparison sits near float32's ~1e-7:
the forms differ only by the order of the additions.

Each feature map of `minilin.feature_maps` is run through linear_attention's three forms on the same
random problem, without and (for the positive maps) with normalization.
Shapes: q, k [B, T, H, K], v [B, T, H, V] with B = 2, T = 512 (quick: 128), H = 2, K = V = 32.
"""
from __future__ import annotations

import numpy as np

from .. import catalog, feature_maps
from ..mixers import linear_attention
from . import _plot

FORMS = ("recurrent", "chunked", "parallel")


def cases() -> list[tuple[str, object, bool]]:
    """(label, feature map, normalize). Normalizing divides by phi(q) . z, so only positive maps get it."""
    favor = feature_maps.FavorPlus(128, seed=0)
    return [("identity", "identity", False), ("elu+1", "elu+1", False), ("relu", "relu", False),
            ("favor+ (128)", favor, False), ("elu+1, normalized", "elu+1", True),
            ("favor+ (128), normalized", favor, True)]


def sizes(quick: bool) -> dict:
    return dict(B=2, T=128 if quick else 512, H=2, K=32, V=32)


def run(quick: bool = False) -> dict:
    """Largest relative difference between the forms (against the recurrence), in float64 and float32."""
    problem = sizes(quick)
    args, _ = linear_attention.example_inputs(**problem, dtype=np.float64, seed=3)
    rows = []
    for label, fm, normalize in cases():
        row = {"feature_map": label}
        for dtype in (np.float64, np.float32):
            q, k, v = (a.astype(dtype) for a in args)
            outputs = {form: getattr(linear_attention, form)(q, k, v, feature_map=fm, normalize=normalize)[0]
                       for form in FORMS}
            name = np.dtype(dtype).name
            # What the forms actually computed in: a feature map that promotes its input shows up here.
            row[f"computed_in_{name}"] = str(outputs["recurrent"].dtype)
            for form in ("chunked", "parallel"):
                row[f"{form}_{name}"] = catalog.relative_error(outputs[form], outputs["recurrent"])
        rows.append(row)
    return {"problem": problem, "rows": rows}


def table(data: dict) -> str:
    lines = [f"{'feature map':26s} | {'float64: chunked':>16s} {'parallel':>9s} | {'float32: chunked':>16s} {'parallel':>9s}"]
    promoted = []
    for r in data["rows"]:
        note = ""
        if r["computed_in_float32"] != "float32":
            note = f"  (float32 input came out {r['computed_in_float32']})"
            promoted.append(r["feature_map"])
        lines.append(f"{r['feature_map']:26s} | {r['chunked_float64']:16.1e} {r['parallel_float64']:9.1e} | "
                     f"{r['chunked_float32']:16.1e} {r['parallel_float32']:9.1e}{note}")
    p = data["problem"]
    lines.append(f"(relative difference ||form - recurrent|| / ||recurrent||; linear_attention, B={p['B']} T={p['T']} "
                 f"H={p['H']} K={p['K']} V={p['V']}; parallel = (phi(Q)phi(K)^T)V, recurrent = phi(Q)(phi(K)^T V))")
    if promoted:
        lines.append(f"Note: {', '.join(promoted)} turned float32 inputs into float64 outputs, so their float32 "
                     "column is a float64 comparison.")
    return "\n".join(lines)


ZERO_DRAWN_AT = 1e-18  # a log axis has no 0: an exact agreement is drawn here


def plot(data: dict, path: str) -> None:
    fig, (ax,) = _plot.subplots(1, width=7.5)
    labels = [r["feature_map"] for r in data["rows"]]
    y = np.arange(len(labels))
    for offset, key, name in ((-0.3, "parallel_float64", "parallel vs recurrent, float64"),
                              (-0.1, "chunked_float64", "chunked vs recurrent, float64"),
                              (0.1, "parallel_float32", "parallel vs recurrent, float32"),
                              (0.3, "chunked_float32", "chunked vs recurrent, float32")):
        ax.barh(y + offset, [max(r[key], ZERO_DRAWN_AT) for r in data["rows"]], height=0.2, label=name)
    ax.set_yticks(y)
    ax.set_yticklabels(labels)
    ax.invert_yaxis()
    ax.set(xscale="log", xlabel=f"relative difference between bracket orders (0 drawn at {ZERO_DRAWN_AT:g})",
           title="Same feature map, both bracket orders: equal to rounding")
    ax.legend(fontsize=8)
    _plot.save(fig, path, "exactness")
