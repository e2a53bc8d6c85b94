"""Every mixer's forms, run on the same random problem: they agree to rounding, the state stays one
fixed size while a softmax layer's KV cache grows with the sequence, and each form takes its own time."""
from __future__ import annotations

import numpy as np

from .. import catalog
from ..bench.timing import median_ms


def run(quick: bool = False) -> list[dict]:
    """One row per mixer: the largest relative difference between its forms, bytes, and times (float64)."""
    problem = dict(B=1, T=256 if quick else 1024, H=4, K=64, V=64)
    rows = []
    for name in catalog.names():
        mod = catalog.module(name)
        args, kwargs = mod.example_inputs(**problem, dtype=np.float64)
        baseline = catalog.baseline_form(name)
        outputs, times = {}, {}
        for form in catalog.forms(name):
            fn = getattr(mod, form)
            outputs[form] = fn(*args, **kwargs)
            times[form] = median_ms(lambda: fn(*args, **kwargs), repeats=1 if quick else 3, warmup=0)
        reference, state = outputs[baseline]
        approximation_error = None
        if name in catalog.APPROXIMATES:  # one form: measure it against what it approximates instead
            approximation_error = catalog.relative_error(reference, catalog.reference(name)(*args, **kwargs)[0])
        rows.append({
            "mixer": name,
            "forms": list(outputs),
            "max_difference": max((catalog.relative_error(o, reference) for o, _ in outputs.values()), default=0.0),
            "approximation_error": approximation_error,
            "state_bytes": catalog.nbytes(state),
            "kv_cache_bytes": problem["B"] * problem["T"] * problem["H"] * (problem["K"] + problem["V"]) * 8,
            "ms": times,
            "T": problem["T"],
        })
    return rows


def table(rows: list[dict]) -> str:
    lines = [f"{'mixer':18s} {'forms compared':34s} {'max rel diff':>12s} {'state':>10s} {'KV cache':>10s}  time (ms)"]
    for r in rows:
        times = ", ".join(f"{form} {ms:.1f}" for form, ms in r["ms"].items())
        if r["approximation_error"] is None:
            compared = f"{' = '.join(r['forms']):34s} {r['max_difference']:12.1e}"
        else:
            compared = f"{'parallel ~ exact softmax':34s} {r['approximation_error']:12.1e}"
        lines.append(f"{r['mixer']:18s} {compared} "
                     f"{_bytes(r['state_bytes']):>10s} {_bytes(r['kv_cache_bytes']):>10s}  {times}")
    T = rows[0]["T"] if rows else 0
    lines.append(f"(B=1, H=4, K=V=64, T={T}, float64; KV cache: what a softmax layer holds at this length; "
                 "attention's 'state' is that cache. Linformer and Nystromformer approximate non-causal softmax "
                 "attention: their number is approximation error, not rounding.)")
    return "\n".join(lines)


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def plot(rows: list[dict], path: str) -> None:
    """Left: each mixer's time per form (log scale). Right: its state against a softmax layer's KV cache."""
    from . import _plot

    fig, (times, memory) = _plot.subplots(2, width=8.0, height=4.6)
    names = [r["mixer"] for r in rows]
    forms = list(dict.fromkeys(form for r in rows for form in r["ms"]))
    width = 0.8 / len(forms)
    for i, form in enumerate(forms):
        xs = [j + (i - (len(forms) - 1) / 2) * width for j, r in enumerate(rows) if form in r["ms"]]
        times.bar(xs, [r["ms"][form] for r in rows if form in r["ms"]], width, label=form)
    times.set(yscale="log", ylabel="wall time per call (ms)", title=f"Every form, T = {rows[0]['T']} (float64, this CPU)")
    times.legend(fontsize=8)
    memory.bar(range(len(rows)), [r["state_bytes"] / 1024 for r in rows], 0.6, label="state (or cache) held")
    memory.axhline(rows[0]["kv_cache_bytes"] / 1024, color="C3", ls="--", lw=1,
                   label="softmax KV cache at this T")
    for j, r in enumerate(rows):
        if not r["state_bytes"]:  # a log axis has no 0: say it
            memory.text(j, 0.02, "no state (non-causal)", rotation=90, ha="center", va="bottom", fontsize=7,
                        transform=memory.get_xaxis_transform())
    memory.set(yscale="log", ylabel="KiB per layer", title="Fixed state vs KV cache")
    memory.legend(fontsize=8)
    for ax in (times, memory):
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=60, ha="right", fontsize=8)
    _plot.save(fig, path, "forms")
