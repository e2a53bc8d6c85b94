"""Gradients: the backward pass of a mixer, written by hand in two forms that agree, at two costs.

The recurrent backward runs the definition backwards: the state's adjoint dS_t is carried from the last token
to the first, dS_{t-1} = (transition_t)^T dS_t + (what o_{t-1} read), and every token's gradients are read
off dS_t and the state S_t (recomputed). The chunked backward does the same work as the chunked forward
does: the chunk-boundary states recomputed, the adjoint passed chunk by chunk (T / C sequential steps, not
T), and everything inside a chunk as matrix products. Both are the exact gradient of the same function, so
in float64 they agree to rounding, and both agree with central finite differences; the chunked one is the
faster because it works in large products.

For simple GLA and GLA (the scalar and the per-channel gate), Gated DeltaNet (the delta rule, through the
WY representation and its triangular inverse) and Mamba-2: the largest relative difference between the two
backward forms over every input's gradient (float64), the finite-difference error of the chunked one along a
random direction, and the CPU time of each backward and of the chunked forward (float32, one BLAS thread).
Shapes: B = 1, T = 1024 (quick: 256), H = 2, K = V = 32; chunk 64.
"""
from __future__ import annotations

import numpy as np

from .. import catalog
from . import _plot, _timing

MIXERS = ("simple_gla", "gla", "gated_deltanet", "mamba2")


def sizes(quick: bool) -> dict:
    return dict(B=1, T=256 if quick else 1024, H=2, K=32, V=32, rounds=2 if quick else 3,
                budget_s=0.05 if quick else 0.2)


def _problem(name, dtype, B, T, H, K, V, seed=0):
    mod = catalog.module(name)
    args, kwargs = mod.example_inputs(B, T, H, K, V, dtype=dtype, seed=seed)
    o, state = mod.chunked(*args, **kwargs)
    rng = np.random.default_rng(seed + 1)
    return mod, args, kwargs, rng.standard_normal(o.shape).astype(dtype), rng.standard_normal(state.shape).astype(dtype)


def agreement(name: str, B: int, T: int, H: int, K: int, V: int) -> dict:
    """Float64: max relative difference between recurrent_ and chunked_backward over every gradient, and
    the chunked backward's finite-difference error along one random direction (all inputs at once)."""
    mod, args, kwargs, do, dstate = _problem(name, np.float64, B, T, H, K, V)
    rec = mod.recurrent_backward(*args, **kwargs, do=do, dstate=dstate)
    chk = mod.chunked_backward(*args, **kwargs, do=do, dstate=dstate)
    difference = max(catalog.relative_error(c, r) for c, r in zip(chk, rec) if r is not None)
    rng = np.random.default_rng(7)
    dirs = [rng.standard_normal(a.shape) for a in args]

    def loss(shift):
        o, state = mod.chunked(*(a + shift * d for a, d in zip(args, dirs)), **kwargs)
        return float((o * do).sum() + (state * dstate).sum())

    eps = 1e-6
    fd = (loss(eps) - loss(-eps)) / (2 * eps)
    claimed = sum(float((g * d).sum()) for g, d in zip(chk, dirs))
    return {"forms_difference": difference, "fd_error": abs(fd - claimed) / max(abs(claimed), 1.0)}


def measure(names: list, B: int, T: int, H: int, K: int, V: int, rounds: int, budget_s: float,
            clock: str = "cpu") -> dict:
    """Float32 milliseconds of each mixer's chunked forward, chunked backward and recurrent backward,
    timed together in alternating rounds (in the timing process: one BLAS thread)."""
    fns = {}
    for name in names:
        mod, args, kwargs, do, dstate = _problem(name, np.float32, B, T, H, K, V)
        fns[name, "chunked forward"] = lambda m=mod, a=args, k=kwargs: m.chunked(*a, **k)
        fns[name, "chunked backward"] = lambda m=mod, a=args, k=kwargs, d=do, s=dstate: m.chunked_backward(
            *a, **k, do=d, dstate=s)
        fns[name, "recurrent backward"] = lambda m=mod, a=args, k=kwargs, d=do, s=dstate: m.recurrent_backward(
            *a, **k, do=d, dstate=s)
    timed = _timing.alternating_ms(fns, rounds, budget_s, clock)
    return {f"{name}|{what}": t["ms"] for (name, what), t in timed.items()}


def run(quick: bool = False) -> dict:
    p = sizes(quick)
    shape = {d: p[d] for d in "BTHKV"}
    load_before = _timing.machine_load()
    rows = [{"mixer": name, **agreement(name, **shape)} for name in MIXERS]
    timing = "CPU time of one BLAS thread"
    try:
        ms = _timing.single_threaded(measure, names=list(MIXERS), **shape, rounds=p["rounds"], budget_s=p["budget_s"])
    except (RuntimeError, OSError) as error:
        ms = measure(list(MIXERS), **shape, rounds=p["rounds"], budget_s=p["budget_s"], clock="wall")
        timing = f"wall-clock time in this process (the one-thread process failed: {str(error).splitlines()[0]})"
    for row in rows:
        for what in ("chunked forward", "chunked backward", "recurrent backward"):
            row[what.replace(" ", "_") + "_ms"] = ms[f"{row['mixer']}|{what}"]
        row["backward_speedup"] = row["recurrent_backward_ms"] / row["chunked_backward_ms"]
        row["train_over_forward"] = (row["chunked_forward_ms"] + row["chunked_backward_ms"]) / row["chunked_forward_ms"]
    data = {"shape": shape, "rows": rows, "timing": timing, "load": _timing.busiest(load_before, _timing.machine_load())}
    data["checks"] = checks(data)
    return data


def checks(data: dict) -> list[dict]:
    rows = data["rows"]
    worst = max(r["forms_difference"] for r in rows)
    worst_fd = max(r["fd_error"] for r in rows)
    slowest = min(rows, key=lambda r: r["backward_speedup"])
    return [
        {"claim": "the recurrent and chunked backward forms agree to float64 rounding",
         "reproduced": worst < 1e-10, "measured": f"largest relative difference {worst:.1e}"},
        {"claim": "the hand-written gradients agree with finite differences",
         "reproduced": worst_fd < 1e-6, "measured": f"largest error {worst_fd:.1e}"},
        {"claim": "the chunked backward is the faster form",
         "reproduced": slowest["backward_speedup"] > 1.0,
         "measured": f"{slowest['backward_speedup']:.1f}x at the least ({slowest['mixer']})"},
    ]


def table(data: dict) -> str:
    s = data["shape"]
    lines = [f"B={s['B']} T={s['T']} H={s['H']} K=V={s['K']}, chunk 64; agreement in float64, times in float32 "
             f"({data['timing']})",
             "| mixer | recurrent vs chunked backward | vs finite differences | chunked forward ms | "
             "chunked backward ms | recurrent backward ms | recurrent / chunked backward | "
             "chunked (forward + backward) / forward |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in data["rows"]:
        lines.append(f"| {r['mixer']} | {r['forms_difference']:.1e} | {r['fd_error']:.1e} | "
                     f"{r['chunked_forward_ms']:.2f} | {r['chunked_backward_ms']:.2f} | {r['recurrent_backward_ms']:.2f} | "
                     f"{r['backward_speedup']:.1f}x | {r['train_over_forward']:.1f}x |")
    lines += _timing.not_reproduced(data["checks"])
    note = _timing.load_note(data["load"])
    return "\n".join(lines + ([note] if note else []))


def plot(data: dict, path: str) -> None:
    fig, (ax,) = _plot.subplots(1, width=6.5)
    rows = data["rows"]
    x = np.arange(len(rows))
    for i, (what, label) in enumerate([("chunked_forward_ms", "chunked forward"),
                                       ("chunked_backward_ms", "chunked backward"),
                                       ("recurrent_backward_ms", "recurrent backward")]):
        ax.bar(x + (i - 1) * 0.27, [r[what] for r in rows], width=0.27, label=label)
    ax.set_xticks(x)
    ax.set_xticklabels([r["mixer"] for r in rows])
    ax.set_yscale("log")
    ax.set_ylabel("milliseconds per call (float32, log scale)")
    ax.set_xlabel(f"mixer (B=1, T={data['shape']['T']}, H=2, K=V=32)")
    ax.legend(fontsize=8)
    _plot.save(fig, path, "gradients", _timing.not_reproduced(data["checks"]))
