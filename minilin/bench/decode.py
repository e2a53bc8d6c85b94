"""`minilin bench --decode`: one decode step (one token for each of N sequences) on the GPU, against the floor of
moving the state once, and beside flash-linear-attention's fused_recurrent kernels when FLA imports.

Problem: H=16, K=V=128, N in 1, 64, 256 sequences; q, k, v in bfloat16, gates and beta float32, the states
[N, H, K, V] float32 updated in place (what a serving loop does every token). Mixers: gated_deltanet, kda and
simple_gla (--mixers takes the others of minilin.cuda.STEPS whose inputs this bench makes, ARRAYS: linear attention,
GLA, RetNet, Lightning, DeltaNet; HGRN2's and Mamba-2's steps are checked in tests/test_cuda_decode.py, not timed).

- Floor: the state read once and written once, 2 N H K V 4 bytes, at the device copy rate measured at the start
  (bench/gpu_timing.copy_bandwidth_gbs, bytes read + written): 31.4 us at N = 64 and 125.7 us at N = 256 at
  4.27 TB/s. q, k, v, g and o add under 0.5% to it.
- Checked first: one step out of place (check_values on) against minilin's NumPy `step` in float64 on CuPy, on
  the same inputs; o and the new state within 1e-2 relative error (bfloat16 inputs), else the row is not timed.
- Timed: bench/gpu_timing.alternating_medians, 3 alternating rounds of up to --repeats (default 200) runs each,
  medians; **device us**: runs queued back to back with the L2 cache overwritten between them (the host's
  dispatch hides behind that overwrite, so this is the kernel's time); **call us**: one call from an idle
  stream, minilin's Python checks and the launch included (check_values=False).
- FLA: fused_recurrent_gated_delta_rule / fused_recurrent_kda / fused_recurrent_simple_gla on the same values laid
  out [N, 1, H, K] (B = N sequences of T = 1), initial_state the states, output_final_state=True (a new final
  state per call: FLA's out-of-place form), checked against the same reference first and timed with torch's events
  in the same rounds. An FLA row never fails the run.

Targets: at most 1.3x the floor at N = 256 and at most 15 us at N = 1, device time.
"""
from __future__ import annotations

import sys

from . import write_json

PROBLEM = dict(H=16, K=128, V=128)
SEQUENCES = (1, 64, 256)
DEFAULT_MIXERS = ("gated_deltanet", "kda", "simple_gla")
TOLERANCE = 1e-2  # bfloat16 inputs, fp32 state and accumulation
TARGET_FLOOR_RATIO = 1.3  # at N = 256
TARGET_SINGLE_US = 15.0  # at N = 1
REPEATS = 200
ROUNDS = 3
ROUND_BUDGET_MS = 400.0
# The arrays each mixer's step takes, in order (gk: a gate per key channel).
ARRAYS = {"linear_attention": ("q", "k", "v"), "simple_gla": ("q", "k", "v", "g"), "gla": ("q", "k", "v", "gk"),
          "retnet": ("q", "k", "v"), "lightning": ("q", "k", "v"), "deltanet": ("q", "k", "v", "beta"),
          "gated_deltanet": ("q", "k", "v", "g", "beta"), "kda": ("q", "k", "v", "gk", "beta")}
DELTA = {"deltanet", "gated_deltanet", "kda"}
FLA_KERNELS = {"gated_deltanet": ("fla.ops.gated_delta_rule", "fused_recurrent_gated_delta_rule"),
               "kda": ("fla.ops.kda", "fused_recurrent_kda"),
               "simple_gla": ("fla.ops.simple_gla", "fused_recurrent_simple_gla")}


def state_bytes(N: int) -> int:
    """The floor's bytes: the fp32 state [N, H, K, V] read once and written once."""
    H, K, V = (PROBLEM[d] for d in "HKV")
    return 2 * N * H * K * V * 4


def floor_us(N: int, copy_gbs: float) -> float:
    return state_bytes(N) / (copy_gbs * 1e9) * 1e6


def make_inputs(mixer: str, N: int, seed: int) -> dict:
    """Fresh random float32 CuPy arrays, q, k, v on the bfloat16 grid, each in its mixer's valid range (for the delta
    rule unit keys times bf16.UNIT_KEY_SCALE), and a random state (never zeros)."""
    import cupy

    from ..cuda import from_bf16, to_bf16
    from ..cuda.bf16 import UNIT_KEY_SCALE

    H, K, V = (PROBLEM[d] for d in "HKV")
    rng = cupy.random.default_rng(seed)
    on_grid = lambda x: from_bf16(to_bf16(x))  # noqa: E731
    q = on_grid(rng.standard_normal((N, H, K), dtype=cupy.float32))
    k = rng.standard_normal((N, H, K), dtype=cupy.float32)
    if mixer in DELTA:  # unit keys, short enough that their bf16 rounding keeps beta |k|^2 <= 1
        k *= UNIT_KEY_SCALE / cupy.linalg.norm(k, axis=-1, keepdims=True)
    out = {"q": q, "k": on_grid(k), "v": on_grid(rng.standard_normal((N, H, V), dtype=cupy.float32)),
           "g": rng.uniform(-1.0, -0.01, (N, H), dtype=cupy.float32),
           "gk": rng.uniform(-1.0, -0.01, (N, H, K), dtype=cupy.float32),
           "beta": rng.uniform(0.0, 1.0, (N, H), dtype=cupy.float32),
           "state": 0.1 * rng.standard_normal((N, H, K, V), dtype=cupy.float32)}
    return out


def reference(mixer: str, inputs: dict):
    """minilin's NumPy step in float64, on CuPy: (o [N, H, V], new state)."""
    import cupy

    from .. import catalog

    args = [inputs[n].astype(cupy.float64) for n in ARRAYS[mixer]]
    return catalog.module(mixer).step(*args, state=inputs["state"].astype(cupy.float64))


def minilin_call(mixer: str, inputs: dict):
    """(checked out-of-place call, timed closure: in place, into a preallocated o, unchecked) of minilin.cuda's step
    on bf16 q, k, v."""
    from .. import cuda

    step = cuda.STEPS[mixer]
    args = [cuda.to_bf16(inputs[n]) if n in ("q", "k", "v") else inputs[n] for n in ARRAYS[mixer]]
    state = inputs["state"].copy()  # the timed runs write over this one
    out = args[2].copy()  # o, in v's dtype: written by every timed run, as a serving loop reuses its buffers
    check = lambda: step(*args, state=inputs["state"], in_place=False)  # noqa: E731
    run = lambda: step(*args, state=state, out=out, check_values=False)  # noqa: E731
    return check, run


def fla_call(mixer: str, inputs: dict):
    """(checked call, timed closure) of FLA's fused_recurrent kernel for the mixer, or None where FLA has none.
    Raises ImportError when FLA (or torch) does not import."""
    if mixer not in FLA_KERNELS:
        return None
    import importlib

    import cupy
    import torch

    from ..cuda import to_bf16

    module, name = FLA_KERNELS[mixer]
    kernel = getattr(importlib.import_module(module), name)

    def tensor(name):
        x = inputs[name]
        if name in ("q", "k", "v"):
            return torch.as_tensor(to_bf16(x, bits=True), device="cuda").view(torch.bfloat16)[:, None]
        return torch.as_tensor(x, device="cuda")[:, None] if name != "state" else torch.as_tensor(x, device="cuda")

    t = {n: tensor(n) for n in (*ARRAYS[mixer], "state")}
    # By keyword: FLA's positional order differs between kernels (fused_recurrent_gated_delta_rule takes q, k, v,
    # g, gk, gv, beta); KDA's per-channel gate is its `g`.
    gates = {name if name != "gk" else "g": t[name] for name in ARRAYS[mixer][3:]}
    run = lambda: kernel(t["q"], t["k"], t["v"], **gates, scale=PROBLEM["K"] ** -0.5,  # noqa: E731
                         initial_state=t["state"], output_final_state=True)

    def check():
        o, state = run()
        return cupy.asarray(o[:, 0].float()), cupy.asarray(state.float())

    return check, run


def _errors(out, ref):
    from .. import catalog
    from ..cuda import bf16

    o, state = out
    o = bf16.from_bf16(o) if bf16.is_bf16(o.dtype) else o
    return catalog.relative_error(o, ref[0]), catalog.relative_error(state, ref[1])


def bench(mixers, sequences, repeats: int, copy_gbs: float, log) -> list[dict]:
    import cupy

    from .gpu_timing import alternating_medians

    rows = []
    for N in sequences:
        candidates = []  # (row, run, events)
        for mixer in mixers:
            inputs = make_inputs(mixer, N, seed=N)
            ref = reference(mixer, inputs)
            for implementation in ("minilin", "fla"):
                row = {"mixer": mixer, "N": N, "implementation": implementation, "floor_us": floor_us(N, copy_gbs)}
                try:
                    made = minilin_call(mixer, inputs) if implementation == "minilin" else fla_call(mixer, inputs)
                except ImportError:
                    continue
                if made is None:
                    continue
                check, run = made
                try:
                    row["error"], row["state_error"] = _errors(check(), ref)
                except Exception as error:  # noqa: BLE001 - FLA may fail in its own ways; minilin's failure is kept
                    row["note"] = f"failed: {type(error).__name__}: {error}"
                    rows.append(row)
                    continue
                if not (row["error"] <= TOLERANCE and row["state_error"] <= TOLERANCE):  # NaN fails
                    row["note"] = f"WRONG (tolerance {TOLERANCE:g}): not timed"
                else:
                    candidates.append((row, run, "cupy" if implementation == "minilin" else "torch"))
                rows.append(row)
        timed = alternating_medians([(run, events) for _, run, events in candidates], repeats=repeats, rounds=ROUNDS,
                                    budget_ms=ROUND_BUDGET_MS)
        for (row, _, _), (ms, round_ms, runs, call_ms) in zip(candidates, timed):
            row.update(us=1e3 * ms, rounds_us=[1e3 * m for m in round_ms], runs=runs, call_us=1e3 * call_ms)
            row["floor_ratio"] = row["us"] / row["floor_us"]
        for row in rows:
            if row["N"] == N:
                log(row)
        cupy.get_default_memory_pool().free_all_blocks()
    by_key = {(r["mixer"], r["N"]): r for r in rows if r["implementation"] == "fla" and "us" in r}
    for r in rows:
        fla = by_key.get((r["mixer"], r["N"]))
        if r["implementation"] == "minilin" and "us" in r and fla:
            r["vs_fla"] = r["us"] / fla["us"]
    return rows


def format_table(rows: list[dict], copy_gbs: float) -> str:
    H, K, V = (PROBLEM[d] for d in "HKV")
    out = [f"\nOne decode step, H={H} K={K} V={V}, q k v bf16, state fp32 in place; floor: the state read and written "
           f"once at {copy_gbs:.0f} GB/s",
           "| mixer | N | implementation | device us | call us | floor us | / floor | / FLA | error o / state |",
           "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        us = f"{r['us']:.1f}" if "us" in r else "-"
        call = f"{r['call_us']:.1f}" if "call_us" in r else "-"
        ratio = f"{r['floor_ratio']:.2f}x" if "floor_ratio" in r else "-"
        fla = f"{r['vs_fla']:.2f}" if "vs_fla" in r else "-"
        err = f"{r['error']:.1e} / {r['state_error']:.1e}" if "error" in r else "-"
        name = r["implementation"] + (" fused_recurrent" if r["implementation"] == "fla" else "")
        name += f" [{r['note']}]" if r.get("note") else ""
        out.append(f"| {r['mixer']} | {r['N']} | {name} | {us} | {call} | {r['floor_us']:.1f} | {ratio} | {fla} | {err} |")
    out.append(targets(rows))
    return "\n".join(out)


def targets(rows: list[dict]) -> str:
    """One line per target: at most 1.3x the floor at N = 256, at most 15 us at N = 1 (minilin's rows)."""
    lines = []
    for r in rows:
        if r["implementation"] != "minilin" or "us" not in r:
            continue
        if r["N"] == 256:
            met = "met" if r["floor_ratio"] <= TARGET_FLOOR_RATIO else "NOT met"
            lines.append(f"target N=256 {r['mixer']}: {r['floor_ratio']:.2f}x the floor (<= {TARGET_FLOOR_RATIO}x): {met}")
        if r["N"] == 1:
            met = "met" if r["us"] <= TARGET_SINGLE_US else "NOT met"
            lines.append(f"target N=1 {r['mixer']}: {r['us']:.1f} us (<= {TARGET_SINGLE_US:g} us): {met}")
    return "\n".join(lines)


def main(args) -> int:
    from ..cuda import STEPS, available
    from .gpu import machine
    from .gpu_timing import copy_bandwidth_gbs

    ok, reason = available()
    if not ok:
        print(f"minilin bench --decode: {reason}. `minilin doctor` says what is missing.", file=sys.stderr)
        return 2
    mixers = args.mixers or list(DEFAULT_MIXERS)
    unknown = [m for m in mixers if m not in STEPS or m not in ARRAYS]
    if unknown:
        print(f"--mixers: {unknown} have no GPU decode step here; choose from {sorted(set(STEPS) & set(ARRAYS))}",
              file=sys.stderr)
        return 2
    info = machine()
    copy_gbs = copy_bandwidth_gbs()
    print(f"minilin bench --decode: {info['gpu']} (cc {info['compute_capability']}), {info['date']}, CuPy "
          f"{info['cupy']}; device copy {copy_gbs:.0f} GB/s (read + write)", flush=True)

    def log(row):
        state = f"{row['us']:.1f} us ({row['floor_ratio']:.2f}x floor)" if "us" in row else row.get("note", "")
        print(f"  {row['mixer']} N={row['N']} {row['implementation']}: {state}", file=sys.stderr, flush=True)

    rows = bench(mixers, SEQUENCES, args.repeats or REPEATS, copy_gbs, log)
    print(format_table(rows, copy_gbs))
    if args.json:
        write_json(args.json, {"device": "gpu", "bench": "decode", "machine": info, "copy_bandwidth_gbs": copy_gbs,
                               "problem": PROBLEM, "tolerance": TOLERANCE, "rows": rows})
    wrong = [r for r in rows if r["implementation"] == "minilin" and r.get("note")]
    return 1 if wrong else 0
