"""Cost: time against sequence length for the recurrent form, the chunked form and softmax attention.

    recurrent:  T steps, each a state update of O(K V): linear in T, but T small sequential operations
    chunked:    T / C chunks of dense C x C and C x K products, then T / C state steps: linear in T, in
                fewer and larger operations (what NumPy's BLAS, and a GPU, are good at)
    softmax:    every token attends to every earlier one: T^2 / 2 scores, quadratic in T
On this CPU the table gives the measured milliseconds and the growth exponent p (time ~ T^p) over the
three longest lengths. Every form at every length is timed in the same alternating rounds, on one BLAS thread
(the claim is about growth, which one thread's time follows; experiments/_timing.py), median per cell, and
the measured claims (linear forms p about 1, softmax p about 2, chunked faster than recurrent at the longer
lengths) are checked on each run's numbers: one a run does not reproduce is said under the table and on the
plot. Two mixers stand for the two families: simple GLA (scalar-gated linear attention,
the Mamba-2 family) and Gated DeltaNet (the delta rule, chunked through the WY representation).
Softmax is `attention.chunked`, FlashAttention-style tiling with an online softmax (NumPy's fastest
softmax here; `attention.parallel` builds the whole T x T matrix and is slower still).

The GPU part is optional: when CuPy, a GPU, the compiled extension (`minilin.cuda`) and the GPU benchmark
(`minilin.bench.gpu`) are all present, the CUDA benchmark's `minilin.bench.gpu.rows(lengths=..., repeats=...)`
is called (with --quick only T = 2048 and 5 runs) and its rows are shown as they come. Assumed of it, and
nothing more: it returns {"rows": [one flat dict per measurement, ...], "machine": ...}, or raises with the
reason it cannot run. Otherwise the GPU part is skipped and the reason is printed.
"""
from __future__ import annotations

import numpy as np

from .. import catalog
from . import _plot, _timing

CPU_PROBLEM = dict(B=1, H=4, K=64, V=64)
# (label, mixer, form); each linear mixer's chunked form is checked against its recurrence before timing.
FORMS = (
    ("simple GLA, recurrent", "simple_gla", "recurrent"),
    ("simple GLA, chunked", "simple_gla", "chunked"),
    ("Gated DeltaNet, recurrent", "gated_deltanet", "recurrent"),
    ("Gated DeltaNet, chunked", "gated_deltanet", "chunked"),
    ("softmax attention", "attention", "chunked"),
)
FLOAT32_TOLERANCE = 1e-4


def sizes(quick: bool) -> dict:
    return dict(Ts=[128, 256, 512, 1024] if quick else [256, 512, 1024, 2048, 4096],
                rounds=3, budget_s=0.01 if quick else 0.03)


def measure(Ts: list[int], rounds: int, budget_s: float, clock: str = "cpu") -> list[dict]:
    """Every form at every T, checked, then timed together in alternating rounds (in the timing process: one
    BLAS thread). Returns one row per T: {"T", "ms": {label: median ms, None if wrong}, "spread": {label: how
    far the rounds disagree}, "chunked_vs_recurrent": {mixer: relative error}}."""
    rows, fns = [], {}
    for T in Ts:
        row = {"T": T, "ms": {}, "spread": {}, "chunked_vs_recurrent": {}}
        outputs = {}
        for label, name, form in FORMS:
            mod = catalog.module(name)
            args, kwargs = mod.example_inputs(T=T, **CPU_PROBLEM, dtype=np.float32, seed=12)
            fn = getattr(mod, form)
            outputs[(name, form)] = fn(*args, **kwargs)[0]
            row["ms"][label] = None
            if form == "chunked" and (name, "recurrent") in outputs:
                error = catalog.relative_error(outputs[(name, form)], outputs[(name, "recurrent")])
                row["chunked_vs_recurrent"][name] = error
                if not error <= FLOAT32_TOLERANCE:  # a wrong form is reported, not timed (NaN fails too)
                    continue
            fns[T, label] = lambda fn=fn, args=args, kwargs=kwargs: fn(*args, **kwargs)
        rows.append(row)
    timed = _timing.alternating_ms(fns, rounds, budget_s, clock)
    for row in rows:
        for label, _, _ in FORMS:
            if (row["T"], label) in timed:
                t = timed[row["T"], label]
                row["ms"][label], row["spread"][label] = t["ms"], _timing.spread(t["rounds_ms"])
    return rows


def run(quick: bool = False) -> dict:
    p = sizes(quick)
    load_before = _timing.machine_load()
    timing = "CPU time of one BLAS thread"
    try:
        cpu = _timing.single_threaded(measure, Ts=p["Ts"], rounds=p["rounds"], budget_s=p["budget_s"])
    except (RuntimeError, OSError) as error:  # timed here instead; the table says so
        cpu = measure(p["Ts"], p["rounds"], p["budget_s"], clock="wall")
        timing = (f"wall-clock time with this process's BLAS threads (the one-thread process failed: "
                  f"{str(error).splitlines()[0]})")
    load = _timing.busiest(load_before, _timing.machine_load())
    data = {"problem": CPU_PROBLEM, "rounds": p["rounds"], "timing": timing, "load": load, "cpu": cpu,
            "exponents": exponents(cpu)}
    data["checks"] = checks(data)
    data["gpu"] = gpu_results(quick)
    return data


def exponents(rows: list[dict], points: int = 3) -> dict:
    """p in time ~ T^p, per form: the least-squares slope of log(ms) against log(T) over the longest
    `points` lengths (short ones measure call overheads, not the algorithm)."""
    out = {}
    for label, _, _ in FORMS:
        measured = [(r["T"], r["ms"][label]) for r in rows[-points:] if r["ms"].get(label)]
        if len(measured) >= 2:
            logs = np.log(np.array(measured, dtype=float))
            out[label] = float(np.polyfit(logs[:, 0], logs[:, 1], 1)[0])
    return out


LINEAR_GROWTH = (0.7, 1.3)   # p in time ~ T^p that counts as "about linearly"
QUADRATIC_GROWTH = (1.6, 2.4)


def checks(data: dict) -> list[dict]:
    """The measured claims, each {"claim", "reproduced", "measured"}: the recurrent and chunked forms grow about
    linearly, softmax attention about quadratically, and each mixer's chunked form is faster than its
    recurrent form at the two longest lengths."""
    p = data["exponents"]
    linear = [label for label, _, form in FORMS if form in ("recurrent", "chunked") and "softmax" not in label]
    softmax = "softmax attention"

    def within(label, bounds):
        return label in p and bounds[0] <= p[label] <= bounds[1]

    def growth(label):
        return f"{label} T^{p[label]:.2f}" if label in p else f"{label} not timed"

    faster = []
    for mixer in dict.fromkeys(label.rsplit(", ", 1)[0] for label in linear):
        for row in data["cpu"][-2:]:
            chunked, recurrent = row["ms"].get(f"{mixer}, chunked"), row["ms"].get(f"{mixer}, recurrent")
            faster.append((mixer, row["T"], chunked is not None and recurrent is not None and chunked < recurrent,
                           recurrent / chunked if chunked and recurrent else None))
    return [
        {"claim": "the recurrent and chunked forms grow about linearly (p within "
                  f"{LINEAR_GROWTH[0]}..{LINEAR_GROWTH[1]})",
         "reproduced": all(within(label, LINEAR_GROWTH) for label in linear),
         "measured": ", ".join(growth(label) for label in linear)},
        {"claim": f"softmax attention grows about quadratically (p within {QUADRATIC_GROWTH[0]}..{QUADRATIC_GROWTH[1]})",
         "reproduced": within(softmax, QUADRATIC_GROWTH), "measured": growth(softmax)},
        {"claim": "the chunked form is faster than the recurrent one at the two longest T",
         "reproduced": all(ok for _, _, ok, _ in faster),
         "measured": ", ".join(f"{mixer} {ratio:.1f}x at T = {T}" if ratio else f"{mixer} not timed at T = {T}"
                               for mixer, T, _, ratio in faster)},
    ]


# ---- the optional GPU part ------------------------------------------------------------------------

def gpu_missing() -> str | None:
    """Why the CUDA benchmark cannot run here, or None when everything it needs is present."""
    try:
        import cupy
    except ImportError:
        return "CuPy is not installed (pip install -e \".[cuda]\")"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "no GPU is visible"
    except Exception as error:  # CUDA driver missing or broken: CuPy raises its own runtime errors
        return f"no usable GPU ({type(error).__name__}: {error})"
    # Importing the extension can fail in more ways than ImportError (a missing CUDA library, a driver
    # mismatch): any failure means no GPU part, said with its reason, never a crashed tour.
    try:
        import minilin.cuda  # noqa: F401
    except Exception as error:
        return f"the CUDA extension is not importable (minilin.cuda: {type(error).__name__}: {error})"
    try:
        import minilin.bench.gpu  # noqa: F401
    except Exception as error:
        return f"the GPU benchmark is not there (minilin.bench.gpu: {type(error).__name__}: {error})"
    return None


GPU_QUICK = dict(lengths=(2048,), repeats=5)


def gpu_results(quick: bool) -> dict:
    """{"rows": [...], "machine": ...} from `minilin.bench.gpu.rows`, or {"skipped": reason}."""
    reason = gpu_missing()
    if reason:
        return {"skipped": reason}
    from ..bench import gpu

    try:
        payload = gpu.rows(**GPU_QUICK) if quick else gpu.rows()
    except Exception as error:  # noqa: BLE001 - the tour reports any failure of the optional part and goes on
        return {"skipped": f"the GPU benchmark failed ({type(error).__name__}: {error})"}
    rows = payload.get("rows") if isinstance(payload, dict) else None
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        return {"skipped": "the GPU benchmark returned no list of rows"}
    machine = payload.get("machine") or payload.get("device")
    if isinstance(machine, dict):
        machine = ", ".join(f"{key} {value}" for key, value in machine.items())
    return {"rows": rows, "machine": machine}


def _gpu_table(gpu: dict) -> list[str]:
    """The benchmark's rows as they come: one column per scalar field (nested fields are left out)."""
    if "skipped" in gpu:
        return [f"GPU: skipped, {gpu['skipped']}."]
    lines = [f"GPU, from `minilin bench --device gpu`{' (' + str(gpu['machine']) + ')' if gpu.get('machine') else ''}:"]
    columns = [key for key in dict.fromkeys(k for row in gpu["rows"] for k in row)
               if all(_scalar(row.get(key)) for row in gpu["rows"])
               and any(row.get(key) not in (None, "") for row in gpu["rows"])]
    cells = [[_cell(row.get(key)) for key in columns] for row in gpu["rows"]]
    widths = [max([len(key)] + [len(r[i]) for r in cells]) for i, key in enumerate(columns)]
    lines.append("  " + "  ".join(f"{key:>{w}s}" for key, w in zip(columns, widths)))
    lines.extend("  " + "  ".join(f"{c:>{w}s}" for c, w in zip(r, widths)) for r in cells)
    return lines


def _scalar(value) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def _cell(value) -> str:
    if value is None or value == "":
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


# ---- presentation ---------------------------------------------------------------------------------

def table(data: dict) -> str:
    labels = [label for label, _, _ in FORMS]
    lines = [f"{'T':>6s} | " + " ".join(f"{label:>26s}" for label in labels)]
    for row in data["cpu"]:
        cells = ("wrong, not timed" if row["ms"][label] is None else f"{row['ms'][label]:.1f} ms" for label in labels)
        lines.append(f"{row['T']:6d} | " + " ".join(f"{c:>26s}" for c in cells))
    growth = " ".join(f"{'T^' + format(data['exponents'][label], '.2f') if label in data['exponents'] else '-':>26s}"
                      for label in labels)
    lines.append(f"{'growth':>6s} | {growth}")
    worst = max(max(r["chunked_vs_recurrent"].values(), default=0.0) for r in data["cpu"])
    noisiest = max(max(r["spread"].values(), default=0.0) for r in data["cpu"])
    p = data["problem"]
    lines.append(f"(this CPU, NumPy, float32, B={p['B']} H={p['H']} K={p['K']} V={p['V']}; {data['timing']}, median of "
                 f"{data['rounds']} alternating rounds, which disagree by up to {noisiest:.0%}; growth: p in time ~ "
                 f"T^p, fitted over the three longest T; chunked vs recurrent agree to {worst:.0e})")
    lines += _timing.not_reproduced(data["checks"])
    note = _timing.load_note(data["load"])
    lines.extend([note] if note else [])
    lines.extend(_gpu_table(data["gpu"]))
    return "\n".join(lines)


def plot(data: dict, path: str) -> None:
    fig, (ax,) = _plot.subplots(1, width=7.5, height=4.8)
    T = [r["T"] for r in data["cpu"]]
    for label, _, form in FORMS:
        ms = [r["ms"][label] for r in data["cpu"]]
        p = data["exponents"].get(label)
        style = "^-" if "softmax" in label else "o-" if form == "chunked" else "s--"
        ax.plot(T, [np.nan if m is None else m for m in ms], style,
                label=f"{label}" + (f" (T^{p:.2f})" if p is not None else ""))
    p = data["problem"]
    ax.set(xscale="log", yscale="log", xlabel="sequence length T (tokens)",
           ylabel="CPU time per call (ms, one thread)",
           title=f"This CPU, NumPy, float32, B={p['B']} H={p['H']} K={p['K']} V={p['V']} "
                 f"(median of {data['rounds']} rounds)")
    _plot.plain_ticks(ax, T)
    ax.legend(fontsize=8)
    _plot.save(fig, path, "cost", _timing.not_reproduced(data["checks"]))
