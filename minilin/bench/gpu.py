"""`minilin bench` on a GPU: every CUDA kernel version against the reference, a softmax baseline and,
when it is importable, flash-linear-attention (FLA).

Problem: B=4, H=16, K=V=128, T in 2048, 8192, 32768, inputs in bfloat16 and float32 (CONVENTIONS.md layouts).
Default mixers: simple_gla (the scalar-gated linear kernels) and gated_deltanet (the delta-rule kernels);
--mixers also takes linear_attention, retnet, lightning, deltanet, and gla, hgrn2 and kda (the kernels with a decay
per key channel, ops "gla" and "kda").

Rows, per mixer, length and dtype:
- reference (CuPy): minilin's NumPy chunked form running unchanged on CuPy arrays, in float32;
- cuda vN: each kernel version that takes the dtype and runs on the GPU (v1 recurrent, v2 chunked on CUDA
  cores, v3 onwards bf16 tensor cores, up to each op's last rung (the wgmma ones on sm_90a builds):
  `minilin.cuda.versions`);
- softmax SDPA: torch's scaled_dot_product_attention (causal; its own [B, H, T, D] layout) when torch is
  importable, else minilin's flash-style attention on CuPy (T <= 8192); a different function, so no error;
- fla chunk, fla fused_recurrent: FLA's chunked kernel for the mixer and its token-by-token one, only if
  `fla` imports (optional, never a dependency). The chunked float32 path misses the float32 tolerance (4e-4
  to 8e-4 measured on an H200, FLA 0.6.0), so that row says so and is not timed; an FLA row never fails the
  run. `minilin bench --against fla` is the side-by-side (bench/against_fla.py).

Each implementation is checked first against the float64 reference (minilin's chunked form on CuPy in
float64, on the same inputs): output and final state within 1e-4 (float32) or 1e-2 (bfloat16) relative
error; a wrong one is reported and not timed. Inputs are drawn once per length, rounded to the bfloat16 grid,
so the float32 and bfloat16 rows read the same numbers. Timing: CUDA events (bench/gpu_timing.py); the
implementations of one mixer, length and dtype that passed their check are timed in 3 alternating rounds
(each round: 3 warm-up runs, 5 single calls from an idle stream, then --repeats runs queued back to back,
default 50, the L2 cache overwritten between them; fewer for a row whose runs would exceed 1 s in a round,
and the table gives a row's total runs when they are fewer than 50), and the median of the rounds is
reported; the softmax baseline is timed on its own, in one round. Alternating, a drift of the
machine falls on every column instead of on whichever was being timed (timed one after the other, linear v5
has measured 12% slower than v6 at T = 8192 in one run and within 1% of it in others).
Columns: ms, the device time (queued runs: the host's dispatch of run i + 1 hides behind run i's kernels);
call ms, one call from an idle stream (the ~50 us of Python checks and launch before the kernel starts are
inside it); tokens/s (B T / device time); GB/s
achieved on the I/O floor (q, k, v read and o written once), with its share of the measured device copy
bandwidth; relative error of o; speed-up over cuda v1 (recurrent), in device time.
"""
from __future__ import annotations

import datetime
import sys
from dataclasses import dataclass, field

import numpy as np

from .. import catalog
from . import write_json
from .gpu_timing import alternating_medians, copy_bandwidth_gbs, median_ms

PROBLEM = dict(B=4, H=16, K=128, V=128)
LENGTHS = (2048, 8192, 32768)
DTYPES = ("bfloat16", "float32")
TOLERANCE = {"float32": 1e-4, "bfloat16": 1e-2}
DEFAULT_MIXERS = ("simple_gla", "gated_deltanet")
# Mixers whose GPU wrapper takes q, k, v (+ g, beta) like the reference, and the tensors each one reads
# (from its SIGNATURE; Mamba-2's mapping has inputs of its own and is not benchmarked here).
TENSORS = {name: catalog.signature(name).names for name in catalog.names()
           if catalog.signature(name).gpu and set(catalog.signature(name).names) <= {"q", "k", "v", "g", "beta"}}
SEQUENCE = {"q", "k", "v"}


@dataclass
class Row:
    mixer: str
    T: int
    dtype: str
    implementation: str
    ms: float | None = None  # device time, runs queued (gpu_timing.py)
    runs: int = 0
    call_ms: float | None = None  # one call from an idle stream, the host's dispatch included
    error: float | None = None
    state_error: float | None = None
    note: str = ""
    extra: dict = field(default_factory=dict)


# ---- inputs ------------------------------------------------------------------------------------------------
def make_inputs(mixer: str, T: int, seed: int, problem: dict | None = None, with_state: bool = False) -> dict:
    """Fresh random float32 CuPy inputs on the bfloat16 grid, in each mixer's valid range (as minilin.examples),
    at `problem`'s B, H, K, V (default PROBLEM); with_state adds a float32 "initial_state" [B, H, K, V].

    `problem` may also give HV (value heads, a multiple of H: q and k keep H heads, v, g, beta and the state get
    HV) and cu_seqlens (offsets of sequences packed along T, B = 1: kept as "cu_seqlens", one state per sequence)."""
    import cupy

    from ..cuda import from_bf16, to_bf16
    from ..cuda.bf16 import UNIT_KEY_SCALE

    problem = problem or PROBLEM
    B, H, K, V = (problem[d] for d in "BHKV")
    HV = problem.get("HV", H)
    offsets = problem.get("cu_seqlens")
    rng = cupy.random.default_rng(seed)
    on_grid = lambda x: from_bf16(to_bf16(x))  # noqa: E731
    out = {"q": rng.standard_normal((B, T, H, K), dtype=cupy.float32),
           "k": rng.standard_normal((B, T, H, K), dtype=cupy.float32),
           "v": rng.standard_normal((B, T, HV, V), dtype=cupy.float32)}
    if "beta" in TENSORS[mixer]:  # the delta rule wants unit keys, short enough to round (bf16)
        out["k"] *= UNIT_KEY_SCALE / cupy.linalg.norm(out["k"], axis=-1, keepdims=True)
    if "g" in TENSORS[mixer]:  # [B, T, HV], or [B, T, HV, K] for a decay per key channel (H in the signatures)
        sizes = dict(B=B, T=T, H=HV, K=K)
        shape = tuple(sizes[d] for d in catalog.signature(mixer).tensor("g").dims.split())
        out["g"] = rng.uniform(-1.0, -0.01, shape, dtype=cupy.float32)
    if "beta" in TENSORS[mixer]:
        out["beta"] = rng.uniform(0.0, 1.0, (B, T, HV), dtype=cupy.float32)
    if with_state:
        N = B if offsets is None else len(offsets) - 1
        out["initial_state"] = 0.5 * rng.standard_normal((N, HV, K, V), dtype=cupy.float32)
    out = {name: on_grid(x) if name in SEQUENCE else x for name, x in out.items()}
    if offsets is not None:
        out["cu_seqlens"] = cupy.asarray(offsets, dtype=cupy.int32)
    return out


def io_floor_bytes(T: int, dtype: str, problem: dict | None = None) -> int:
    """q, k, v read once and o written once (`problem`'s HV value heads for v and o where it gives them)."""
    problem = problem or PROBLEM
    B, H, K, V = (problem[d] for d in "BHKV")
    HV = problem.get("HV", H)
    return B * T * (2 * H * K + 2 * HV * V) * (2 if dtype == "bfloat16" else 4)


# ---- implementations ---------------------------------------------------------------------------------------
def reference(mixer: str, inputs: dict, dtype):
    """minilin's chunked form (the NumPy reference) on CuPy arrays cast to `dtype`."""
    mod = catalog.module(mixer)
    state = inputs.get("initial_state")
    offsets = inputs.get("cu_seqlens")
    packed = {} if offsets is None else {"cu_seqlens": offsets.get()}  # RetNet, Lightning, HGRN2 take no cu_seqlens
    return mod.chunked(*(inputs[n].astype(dtype) for n in TENSORS[mixer]),
                       initial_state=None if state is None else state.astype(dtype), **packed)


def cuda_call(mixer: str, inputs: dict, dtype: str, version: int):
    """A closure running one kernel version on inputs in `dtype` (gates and beta stay float32)."""
    from .. import cuda

    fn = getattr(cuda, mixer)
    args = [cuda.to_bf16(inputs[n]) if dtype == "bfloat16" and n in SEQUENCE else inputs[n] for n in TENSORS[mixer]]
    state, offsets = inputs.get("initial_state"), inputs.get("cu_seqlens")
    packed = {} if offsets is None else {"cu_seqlens": offsets}  # as `reference`: only where the layout is packed
    return lambda: fn(*args, initial_state=state, version=version, check_values=False, **packed)


FLA_FORMS = ("chunk", "fused_recurrent")  # FLA's chunked kernel, and its recurrent one (token by token)


def fla_call(mixer: str, inputs: dict, dtype: str, form: str = "chunk"):
    """FLA's `form` kernel for the mixer on the same inputs (as torch tensors), or None where FLA has none.

    form: "chunk" (chunk_simple_gla, chunk_delta_rule, chunk_gated_delta_rule, chunk_gla, chunk_kda) or
    "fused_recurrent" (the fused_recurrent_* kernels: FLA's token-by-token form, the counterpart of minilin's v1)."""
    if form not in FLA_FORMS:
        raise ValueError(f"fla_call: form must be one of {FLA_FORMS}, got {form!r}")
    import cupy
    import torch

    def to_torch(x, name):
        if dtype == "bfloat16" and name in SEQUENCE:
            from ..cuda import to_bf16

            return torch.as_tensor(to_bf16(x, bits=True), device="cuda").view(torch.bfloat16)
        return torch.as_tensor(x, device="cuda")

    t = {n: to_torch(inputs[n], n) for n in TENSORS[mixer]}
    group = inputs["v"].shape[2] // inputs["q"].shape[2]
    if group > 1 and mixer != "gated_deltanet":  # FLA's other chunk kernels take one q/k head per value head
        t["q"], t["k"] = (x.repeat_interleave(group, dim=2).contiguous() for x in (t["q"], t["k"]))
    common = dict(scale=inputs["q"].shape[-1] ** -0.5, output_final_state=True)
    if "initial_state" in inputs:
        common["initial_state"] = to_torch(inputs["initial_state"], "initial_state")
    if "cu_seqlens" in inputs:
        common["cu_seqlens"] = torch.as_tensor(inputs["cu_seqlens"], device="cuda").long()
    if mixer == "simple_gla":
        from fla.ops import simple_gla as ops
        kernel = ops.chunk_simple_gla if form == "chunk" else ops.fused_recurrent_simple_gla
        run = lambda: kernel(t["q"], t["k"], t["v"], g=t["g"], **common)  # noqa: E731
    elif mixer == "gated_deltanet":
        from fla.ops import gated_delta_rule as ops
        kernel = ops.chunk_gated_delta_rule if form == "chunk" else ops.fused_recurrent_gated_delta_rule
        run = lambda: kernel(t["q"], t["k"], t["v"], g=t["g"], beta=t["beta"], **common)  # noqa: E731
    elif mixer == "deltanet":
        from fla.ops import delta_rule as ops
        kernel = ops.chunk_delta_rule if form == "chunk" else ops.fused_recurrent_delta_rule
        run = lambda: kernel(t["q"], t["k"], t["v"], beta=t["beta"], **common)  # noqa: E731
    elif mixer == "gla":  # a decay per key channel: FLA's fused_recurrent_gla names it gk
        from fla.ops import gla as ops
        if form == "chunk":
            run = lambda: ops.chunk_gla(t["q"], t["k"], t["v"], g=t["g"], **common)  # noqa: E731
        else:
            run = lambda: ops.fused_recurrent_gla(t["q"], t["k"], t["v"], gk=t["g"], **common)  # noqa: E731
    elif mixer == "kda":
        from fla.ops import kda as ops
        kernel = ops.chunk_kda if form == "chunk" else ops.fused_recurrent_kda
        run = lambda: kernel(t["q"], t["k"], t["v"], g=t["g"], beta=t["beta"], **common)  # noqa: E731
    else:
        return None

    def as_cupy(result):
        o, state = result
        return cupy.asarray(o.float()), cupy.asarray(state.float())

    return run, as_cupy


def softmax_baseline(T: int, dtype: str):
    """(name, run closure, timing events) for causal softmax attention at length T, or (name, None, note)."""
    B, H, K, V = (PROBLEM[d] for d in "BHKV")
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        torch = None
    if torch is not None and torch.cuda.is_available():
        tdtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
        gen = torch.Generator(device="cuda").manual_seed(T)
        q, k, v = (torch.randn(B, H, T, d, device="cuda", dtype=tdtype, generator=gen) for d in (K, K, V))
        return "softmax SDPA (torch)", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), "torch"
    if T > 8192:
        return "softmax (minilin on CuPy)", None, "skipped: no torch, and the CuPy form is too slow past T = 8192"
    import cupy

    from ..cuda import from_bf16, to_bf16
    from ..mixers import attention

    rng = cupy.random.default_rng(T)
    q, k, v = (rng.standard_normal((B, T, H, d), dtype=cupy.float32) for d in (K, K, V))
    if dtype == "bfloat16":  # minilin's reference computes in float32 on bf16-grid values
        q, k, v = (from_bf16(to_bf16(x)) for x in (q, k, v))
    return "softmax (minilin on CuPy, float32)", lambda: attention.chunked(q, k, v), "cupy"


def check_softmax_baseline() -> str:
    """Check torch's SDPA (causal) against minilin's float64 attention at a small size; '' when correct."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return ""
    if not torch.cuda.is_available():
        return ""
    from ..mixers import attention

    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((2, 256, 4, 64)) for _ in range(3))
    ref, _ = attention.parallel(q, k, v)
    t = [torch.as_tensor(x, device="cuda", dtype=torch.float32).transpose(1, 2) for x in (q, k, v)]
    out = F.scaled_dot_product_attention(*t, is_causal=True).transpose(1, 2).double().cpu().numpy()
    error = catalog.relative_error(out, ref)
    return "" if error <= 1e-3 else f"torch SDPA differs from minilin's attention by {error:.1e}"


# ---- measuring ---------------------------------------------------------------------------------------------
def _errors(out, ref_o, ref_state):
    o, state = out
    return catalog.relative_error(o, ref_o), catalog.relative_error(state, ref_state)


ROW_BUDGET_MS = 3000.0  # a row whose runs would take longer gets fewer runs (the table says how many)
ROUNDS = 3


def _timed(row: Row, run, repeats: int, events: str = "cupy") -> Row:
    t = median_ms(run, repeats=repeats, events=events, budget_ms=ROW_BUDGET_MS)
    row.ms, row.runs, row.call_ms = t.median_ms, t.runs, t.call_ms
    return row


def time_alternating(candidates: list, repeats: int, rounds: int = ROUNDS) -> None:
    """Time each (row, run, events) of `candidates` in `rounds` alternating rounds; fill row.ms, row.runs and
    row.call_ms.

    A row's run budget is split over the rounds; row.ms is the median of its rounds' medians, row.call_ms
    the median of its rounds' single-call medians.
    """
    timed = alternating_medians([(run, events) for _, run, events in candidates], repeats=repeats, rounds=rounds,
                                budget_ms=ROW_BUDGET_MS / rounds)
    for (row, _, _), (ms, _, runs, call_ms) in zip(candidates, timed):
        row.ms, row.runs, row.call_ms = ms, row.runs + runs, call_ms


def bench_mixer_length(mixer: str, T: int, repeats: int, softmax_cache: dict, log) -> list[Row]:
    import cupy

    from .. import cuda

    inputs = make_inputs(mixer, T, seed=T)
    ref_o, ref_state = reference(mixer, inputs, cupy.float64)
    rows = []
    for dtype in DTYPES:
        tol = TOLERANCE[dtype]
        ours, fla_rows = [], []
        candidates = []  # (row, run, events) that passed their check, timed together below

        def checked(row, out):
            row.error, row.state_error = _errors(out, ref_o, ref_state)
            ok = row.error <= tol and row.state_error <= tol  # NaN fails
            if not ok:
                row.note = f"WRONG (tolerance {tol:g}): not timed"
            return ok

        if dtype == "float32":
            row = Row(mixer, T, dtype, "reference (CuPy, chunked)")
            run = lambda: reference(mixer, inputs, cupy.float32)  # noqa: E731
            if checked(row, run()):
                candidates.append((row, run, "cupy"))
            ours.append(row)
        K, V = PROBLEM["K"], PROBLEM["V"]  # make_inputs's default problem, as above
        for info in cuda.versions(cuda.OPS[mixer]):
            if not info[dtype]:
                continue
            row = Row(mixer, T, dtype, f"cuda v{info['version']} {info['name']}")
            if not cuda.front.takes_shape(info, K, V):  # e.g. linear v9: K = 256 only
                row.note = f"not run: takes K in {info['keys']}, V a multiple of {info['value_multiple']}"
                ours.append(row)
                continue
            try:
                run = cuda_call(mixer, inputs, dtype, info["version"])
                if checked(row, cuda_out_as_float(run())):
                    candidates.append((row, run, "cupy"))
            except (ValueError, TypeError, RuntimeError) as error:
                row.note = f"failed: {error}"
            ours.append(row)
        key = (T, dtype)
        if key not in softmax_cache:
            name, run, events = softmax_baseline(T, dtype)
            row = Row("softmax", T, dtype, name)
            if run is None:
                row.note = events
            else:
                _timed(row, run, repeats, events)
                row.note = "different function: no error column"
            softmax_cache[key] = row
        cached = softmax_cache[key]
        softmax_row = Row(mixer, T, dtype, cached.implementation, cached.ms, cached.runs, cached.call_ms,
                          note=cached.note)
        for form in FLA_FORMS:
            try:
                fla = fla_call(mixer, inputs, dtype, form)
            except ImportError:
                fla = None
            if fla is None:
                continue
            run, as_cupy = fla
            row = Row(mixer, T, dtype, f"fla {form}")
            try:
                if checked(row, as_cupy(run())):
                    candidates.append((row, run, "torch"))
                else:  # FLA's own precision (float32 inputs are not computed in float32 throughout)
                    row.note = f"outside the {dtype} tolerance {tol:g}: not timed"
            except Exception as error:  # noqa: BLE001 - an optional baseline may fail in its own ways
                row.note = f"failed: {error}"
            fla_rows.append(row)
        time_alternating(candidates, repeats)
        for row in [*ours, softmax_row, *fla_rows]:
            rows.append(row)
            log(row)
    # Release this length's arrays (the closures above are done with them) before emptying the pool.
    inputs = ref_o = ref_state = None
    cupy.get_default_memory_pool().free_all_blocks()
    return rows


def cuda_out_as_float(out):
    """(o, state) with o widened to float32 when it is bfloat16, for the error."""
    from ..cuda import bf16

    o, state = out
    return (bf16.from_bf16(o) if bf16.is_bf16(o.dtype) else o), state


def derive(rows: list[Row], copy_gbs: float) -> None:
    """Fill tokens/s, GB/s on the I/O floor, its share of copy bandwidth, and the speed-up over v1."""
    B = PROBLEM["B"]
    recurrent = {(r.mixer, r.T, r.dtype): r.ms for r in rows if r.implementation.startswith("cuda v1 ") and r.ms}
    for r in rows:
        if not r.ms:
            continue
        floor_bytes = io_floor_bytes(r.T, r.dtype)
        r.extra["tokens_per_s"] = B * r.T / (r.ms * 1e-3)
        r.extra["io_floor_gbs"] = floor_bytes / (r.ms * 1e-3) / 1e9
        r.extra["copy_share"] = r.extra["io_floor_gbs"] / copy_gbs
        base = recurrent.get((r.mixer, r.T, r.dtype))
        if base:
            r.extra["speedup_vs_recurrent"] = base / r.ms


def format_tables(rows: list[Row], copy_gbs: float) -> str:
    out = []
    for mixer in dict.fromkeys(r.mixer for r in rows):
        for dtype in DTYPES:
            sel = [r for r in rows if r.mixer == mixer and r.dtype == dtype]
            if not sel:
                continue
            out.append(f"\n{mixer}, {dtype} (B={PROBLEM['B']} H={PROBLEM['H']} K={PROBLEM['K']} V={PROBLEM['V']})")
            out.append("| T | implementation | ms | call ms | tokens/s | GB/s on I/O floor (of copy BW) | rel. error "
                       "| vs recurrent |")
            out.append("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
            for r in sel:
                ms = f"{r.ms:.3f}" + (f" ({r.runs} runs)" if r.runs and r.runs < 50 else "") if r.ms else "-"
                call = f"{r.call_ms:.3f}" if r.call_ms else "-"
                tok = f"{r.extra['tokens_per_s'] / 1e6:.1f} M" if "tokens_per_s" in r.extra else "-"
                gbs = f"{r.extra['io_floor_gbs']:.0f} ({100 * r.extra['copy_share']:.0f}%)" if "io_floor_gbs" in r.extra else "-"
                err = f"{r.error:.1e}" if r.error is not None else "-"
                sp = f"{r.extra['speedup_vs_recurrent']:.1f}x" if "speedup_vs_recurrent" in r.extra else "-"
                name = r.implementation + (f" [{r.note}]" if r.note else "")
                out.append(f"| {r.T} | {name} | {ms} | {call} | {tok} | {gbs} | {err} | {sp} |")
            floors = ", ".join(f"T={T}: {io_floor_bytes(T, dtype) / (copy_gbs * 1e9) * 1e3:.3f} ms" for T in
                               sorted({r.T for r in sel}))
            out.append(f"I/O floor at the copy bandwidth: {floors}")
    return "\n".join(out)


def flat(row: Row) -> dict:
    """One JSON row: the measured fields and the derived ones side by side (no nesting)."""
    out = {k: v for k, v in row.__dict__.items() if k != "extra"}
    out.update(row.extra)
    return out


def machine() -> dict:
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    info = {"gpu": name, "compute_capability": f"{props['major']}.{props['minor']}", "cupy": cupy.__version__,
            "date": datetime.date.today().isoformat()}
    try:
        from .. import _cuda
        info["extension_arch"] = _cuda.cuda_arch
    except ImportError:
        pass
    try:
        import torch
        info["torch"] = torch.__version__
    except ImportError:
        pass
    return info


def rows(mixers=DEFAULT_MIXERS, lengths=LENGTHS, repeats: int = 50, log=None) -> dict:
    """The GPU bench as data, without printing: what `minilin bench --device gpu --json` writes.

    Returns {"device": "gpu", "machine": machine(), "copy_bandwidth_gbs", "problem", "tolerance",
    "rows": [one flat dict per measurement (flat(row))]}. log(row), if given, is called as each row is
    measured. Raises RuntimeError (the reason) where the GPU bench cannot run, ValueError for a mixer it does
    not bench. For other code (the tour's `cost` experiment) to call directly.
    """
    from ..cuda import available

    ok, reason = available()
    if not ok:
        raise RuntimeError(reason)
    unknown = [m for m in mixers if m not in TENSORS]
    if unknown:
        raise ValueError(f"mixers: {unknown} not benchmarked on the GPU; choose from {sorted(TENSORS)}")
    copy_gbs = copy_bandwidth_gbs()
    measured: list[Row] = []
    softmax_cache: dict = {}
    for mixer in mixers:
        for T in lengths:
            measured += bench_mixer_length(mixer, T, repeats, softmax_cache, log or (lambda row: None))
    derive(measured, copy_gbs)
    return {"device": "gpu", "machine": machine(), "copy_bandwidth_gbs": copy_gbs, "problem": PROBLEM,
            "tolerance": TOLERANCE, "rows": [flat(r) for r in measured]}


def main(args) -> int:
    from ..cuda import OPS, available

    ok, reason = available()
    if not ok:
        print(f"minilin bench --device gpu: {reason}. `minilin doctor` says what is missing; "
              f"`minilin bench --device cpu` runs the NumPy reference.", file=sys.stderr)
        return 2
    mixers = args.mixers or list(DEFAULT_MIXERS)
    unknown = [m for m in mixers if m not in TENSORS]
    if unknown:
        print(f"--mixers: {unknown} not benchmarked on the GPU; choose from {sorted(TENSORS)} "
              f"(mamba2 runs as simple_gla under its mapping)", file=sys.stderr)
        return 2
    repeats = args.repeats or 50
    lengths = getattr(args, "lengths", None) or LENGTHS
    info = machine()
    copy_gbs = copy_bandwidth_gbs()
    problem = ", ".join(f"{k}={v}" for k, v in PROBLEM.items())
    print(f"minilin bench --device gpu: {info['gpu']} (cc {info['compute_capability']}), {info['date']}, "
          f"CuPy {info['cupy']}; {problem}; device copy {copy_gbs:.0f} GB/s (read + write)", flush=True)
    sdpa_problem = check_softmax_baseline()
    if sdpa_problem:
        print(f"softmax baseline check failed: {sdpa_problem}", file=sys.stderr)

    def log(row):
        state = f"{row.ms:.3f} ms" if row.ms else row.note
        print(f"  {row.mixer} T={row.T} {row.dtype} {row.implementation}: {state}", file=sys.stderr, flush=True)

    rows: list[Row] = []
    softmax_cache: dict = {}
    for mixer in mixers:
        assert mixer in OPS
        for T in lengths:
            rows += bench_mixer_length(mixer, T, repeats, softmax_cache, log)
    derive(rows, copy_gbs)
    print(format_tables(rows, copy_gbs))
    if args.json:
        write_json(args.json, {"device": "gpu", "machine": info, "copy_bandwidth_gbs": copy_gbs, "problem": PROBLEM,
                               "tolerance": TOLERANCE, "rows": [flat(r) for r in rows]})
    # minilin's own rows decide the exit status; an optional baseline outside tolerance is reported only
    wrong = [r for r in rows if r.note.startswith(("WRONG", "failed")) and not r.implementation.startswith("fla")]
    return 1 if wrong else 0
