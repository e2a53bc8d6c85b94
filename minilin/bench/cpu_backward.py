"""`minilin bench --device cpu --backward`: each mixer's forward and forward + backward, per form, in NumPy.

Problem: the CPU bench's (B=1, H=4, T=4096, K=V=64, float32), each chunked forward at the CPU bench's chunk size
for it (`cpu.CHUNK_SIZES`, the fastest forward here; column "C fwd") and each chunked backward, a separate call
with its own chunk_size, at `BACKWARD_CHUNK_SIZES` (column "C bwd"). Before anything is timed, every backward form
of the mixer is checked at a small float64 size against central finite differences along a random direction
(all inputs at once); a form that fails is reported and not timed. Then, in alternating rounds
(`timing.interleaved_median_ms`), for the recurrent and the chunked form:

    forward            the form itself
    forward + backward the form, then its `<form>_backward` with random cotangents do and dstate

and the ratios the chapter cares about: chunked forward + backward over chunked forward (what training
costs over inference), and the recurrent backward's time over the chunked backward's. A last column gives
training throughput: tokens per second of one training step (forward, cross-entropy, backward through every
layer, AdamW) of the quick MQAR model (2 blocks of the mixer, d_model 64, batch 64 x 64 tokens).
"""
from __future__ import annotations

import sys
import time

import numpy as np

from .. import catalog
from . import write_json
from .cpu import CHUNK_SIZES, PROBLEM, QUICK_PROBLEM, machine
from .timing import interleaved_median_ms, median_ms

FORMS = ("recurrent", "chunked")

# The chunk size each chunked backward runs at here, chosen by measurement on the 2-core development machine
# (backward times at C = 16, 32 and 64 in one process, alternating rounds). The delta rule's backward runs two
# loops over the N = T / C chunks (the states recomputed, then their adjoints), a few NumPy calls per chunk
# each, so it gains from fewer chunks more than its forward (one loop) does: 2-10% faster at 32 than at the
# forward's 16 in every run. For every other mixer the forward's chunk size was also the backward's best, or
# within the noise of it, and stays (mixers not listed).
BACKWARD_CHUNK_SIZES = {name: 32 for name in ("deltanet", "gated_deltanet", "kda")}
CHECK_PROBLEM = dict(B=1, T=23, H=2, K=5, V=4)


def _cotangents(mod, name, args, kwargs, dtype, seed=0):
    o, state = mod.chunked(*args, **kwargs)
    rng = np.random.default_rng(seed)
    do = rng.standard_normal(o.shape).astype(dtype)
    has_state = catalog.signature(name).state is not None or name == "linear_attention"
    dstate = rng.standard_normal(state.shape).astype(state.dtype) if has_state else None
    return do, dstate


def finite_difference_error(name: str, form: str) -> float:
    """|fd - <g, d>| / max(|<g, d>|, 1) for L = <do, o> + <dstate, S> along one random direction (float64)."""
    mod = catalog.module(name)
    args, kwargs = mod.example_inputs(**CHECK_PROBLEM, dtype=np.float64, seed=3)
    do, dstate = _cotangents(mod, name, args, kwargs, np.float64)
    rng = np.random.default_rng(1)
    dirs = [rng.standard_normal(a.shape) if getattr(a, "ndim", 0) else None for a in args]
    grads = getattr(mod, f"{form}_backward")(*args, **kwargs, do=do, dstate=dstate)

    def loss(shift):
        moved = [a + shift * d if d is not None else a for a, d in zip(args, dirs)]
        o, state = getattr(mod, form)(*moved, **kwargs)
        return float((o * do).sum()) + (0.0 if dstate is None else float((state * dstate).sum()))

    eps = 1e-6
    fd = (loss(eps) - loss(-eps)) / (2 * eps)
    claimed = sum(float(np.real(np.conj(g) * d).sum()) for g, d in zip(grads, dirs) if d is not None)
    return abs(fd - claimed) / max(abs(claimed), 1.0)


def training_tokens_per_second(name: str, repeats: int) -> float:
    """One training step of the quick MQAR model of `name`: tokens / median seconds."""
    from ..nn import AdamW, clip_grad_norm
    from ..train.loop import Run
    from ..train.mqar import MQAR, batch

    run = Run(mixers=[name, name], d_model=64, heads=2, task=MQAR(vocab=64, seq_len=64, num_kv_pairs=8),
              batch_size=64, window=16)
    model = run.model()
    optimizer = AdamW(model, lr=run.lr)
    tokens, targets = batch(run.task, 0, run.batch_size)

    def step():
        model.zero_grad()
        model.loss_and_grads(tokens, targets)
        clip_grad_norm(model, run.clip)
        optimizer.step()

    return tokens.size / (median_ms(step, repeats=repeats, warmup=1) / 1e3)


def bench_mixer(name: str, repeats: int | None, problem: dict) -> dict:
    mod = catalog.module(name)
    row = {"mixer": name}
    args, kwargs = mod.example_inputs(**problem, dtype=np.float32)
    do, dstate = _cotangents(mod, name, args, kwargs, np.float32)
    fns, runs = {}, {}
    row["chunk_size"] = CHUNK_SIZES.get(name, 64)
    row["backward_chunk_size"] = BACKWARD_CHUNK_SIZES.get(name, row["chunk_size"])
    for form in FORMS:
        error = finite_difference_error(name, form)
        row[f"{form}_fd_error"] = error
        if not error < 1e-5:
            continue
        forward, backward = getattr(mod, form), getattr(mod, f"{form}_backward")
        options = dict(kwargs, chunk_size=row["chunk_size"]) if form == "chunked" else kwargs
        backward_options = dict(kwargs, chunk_size=row["backward_chunk_size"]) if form == "chunked" else kwargs
        fns[f"{form}_forward"] = lambda f=forward, o=options: f(*args, **o)
        fns[f"{form}_forward_backward"] = lambda f=forward, b=backward, o=options, ob=backward_options: (
            f(*args, **o), b(*args, **ob, do=do, dstate=dstate))
        runs[f"{form}_forward"] = runs[f"{form}_forward_backward"] = 1 if form == "recurrent" else 3
    row.update({f"{k}_ms": v for k, v in interleaved_median_ms(fns, runs, rounds=repeats or 3).items()})
    if "chunked_forward_ms" in row:
        row["train_over_forward"] = row["chunked_forward_backward_ms"] / row["chunked_forward_ms"]
    if "recurrent_forward_ms" in row and "chunked_forward_ms" in row:
        recurrent_bwd = row["recurrent_forward_backward_ms"] - row["recurrent_forward_ms"]
        chunked_bwd = row["chunked_forward_backward_ms"] - row["chunked_forward_ms"]
        row["recurrent_over_chunked_backward"] = recurrent_bwd / max(chunked_bwd, 1e-9)
    row["train_tokens_per_s"] = training_tokens_per_second(name, repeats or 3)
    return row


def format_table(rows) -> str:
    def ms(x):
        return "-" if x is None else f"{x:.1f}"

    lines = ["| mixer | C fwd | C bwd | recurrent fwd ms | recurrent fwd+bwd ms | chunked fwd ms | chunked fwd+bwd ms | "
             "chunked fwd+bwd / fwd | recurrent bwd / chunked bwd | training tokens/s |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        ratio = r.get("train_over_forward")
        speed = r.get("recurrent_over_chunked_backward")
        lines.append(f"| {r['mixer']} | {r['chunk_size']} | {r['backward_chunk_size']} | "
                     f"{ms(r.get('recurrent_forward_ms'))} | {ms(r.get('recurrent_forward_backward_ms'))} | "
                     f"{ms(r.get('chunked_forward_ms'))} | {ms(r.get('chunked_forward_backward_ms'))} | "
                     f"{'-' if ratio is None else f'{ratio:.2f}x'} | {'-' if speed is None else f'{speed:.1f}x'} | "
                     f"{r['train_tokens_per_s']:,.0f} |")
    return "\n".join(lines)


def main(args) -> int:
    causal = [n for n in catalog.names() if callable(getattr(catalog.module(n), "step", None))]
    names = args.mixers or causal
    unknown = [n for n in names if n not in causal]
    if unknown:
        print(f"--mixers: {unknown} have no recurrent / chunked backward to time; choose from {causal}", file=sys.stderr)
        return 2
    problem = QUICK_PROBLEM if getattr(args, "quick", False) else PROBLEM
    print(f"minilin bench --device cpu --backward: B={problem['B']} T={problem['T']} H={problem['H']} "
          f"K={problem['K']} V={problem['V']} float32, {machine()}", flush=True)
    rows = []
    start = time.perf_counter()
    for i, name in enumerate(names, 1):
        print(f"[{i}/{len(names)}] {name}: checking against finite differences, then timing ...", file=sys.stderr,
              flush=True)
        rows.append(bench_mixer(name, args.repeats or (1 if getattr(args, "quick", False) else None), problem))
    print(format_table(rows))
    failed = [f"{r['mixer']}.{form}" for r in rows for form in FORMS if not r[f"{form}_fd_error"] < 1e-5]
    if failed:
        print(f"not timed, their gradients disagree with finite differences: {failed}")
    print(f"({time.perf_counter() - start:.0f} s)")
    if args.json:
        write_json(args.json, {"problem": problem, "machine": machine(), "rows": rows})
    return 1 if failed else 0
