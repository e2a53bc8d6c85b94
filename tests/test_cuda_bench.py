"""The GPU benchmark's bookkeeping (floors, derived columns, JSON rows), checked without a GPU."""
from __future__ import annotations

import argparse
import re

import pytest

from minilin import cuda as mcuda
from minilin.bench import gpu, gpu_timing


def test_io_floor_counts_q_k_v_read_and_o_written_once():
    # B=4, H=16, K=V=128: 4 tensors of 4 * 8192 * 16 * 128 elements, 2 bytes each in bf16
    assert gpu.io_floor_bytes(8192, "bfloat16") == 4 * (4 * 8192 * 16 * 128) * 2
    assert gpu.io_floor_bytes(8192, "float32") == 2 * gpu.io_floor_bytes(8192, "bfloat16")


def test_derived_columns_and_flat_rows():
    rows = [gpu.Row("simple_gla", 8192, "bfloat16", "cuda v1 recurrent", ms=4.0, runs=50, error=1e-3, state_error=1e-7),
            gpu.Row("simple_gla", 8192, "bfloat16", "cuda v3 chunked_mma", ms=0.5, runs=50, error=2e-3, state_error=1e-3),
            gpu.Row("simple_gla", 8192, "bfloat16", "cuda v2 chunked", note="WRONG (tolerance 0.01): not timed")]
    gpu.derive(rows, copy_gbs=4000.0)
    assert rows[1].extra["speedup_vs_recurrent"] == 8.0
    assert abs(rows[1].extra["io_floor_gbs"] - gpu.io_floor_bytes(8192, "bfloat16") / 0.5e-3 / 1e9) < 1e-9
    assert rows[1].extra["tokens_per_s"] == 4 * 8192 / 0.5e-3
    assert "speedup_vs_recurrent" not in rows[2].extra  # a wrong row is not timed and gets no derived columns
    flat = gpu.flat(rows[1])
    assert "extra" not in flat and flat["speedup_vs_recurrent"] == 8.0 and flat["ms"] == 0.5
    table = gpu.format_tables(rows, 4000.0)
    assert "| 8192 | cuda v3 chunked_mma | 0.500 |" in table and "8.0x" in table and "WRONG" in table


def test_without_a_gpu_the_benchmark_says_why():
    ok, _ = mcuda.available()
    if ok:
        pytest.skip("a GPU is available: the benchmark runs instead of refusing (tools/gpu_check.sh runs it)")
    args = argparse.Namespace(mixers=None, repeats=None, json=None)
    assert gpu.main(args) == 2


# ---- minilin bench --against fla --------------------------------------------------------------------------
def test_against_fla_table_marks_the_goal_and_untimed_rows():
    from minilin.bench import against_fla

    timed = {"mixer": "gated_deltanet", "T": 8192, "minilin_version": 6, "minilin_ms": 0.78, "fla_ms": 1.04,
             "ratio": 0.75, "minilin_error": 3.3e-3, "fla_error": 3.4e-3, "minilin_vs_fla_error": 1.3e-3}
    slow = dict(timed, T=32768, minilin_ms=1.8, fla_ms=1.8, ratio=1.0)
    wrong = {"mixer": "simple_gla", "T": 2048, "minilin_error": 0.5, "fla_error": 2e-3, "minilin_vs_fla_error": 0.5,
             "note": "WRONG (tolerance 0.01): not timed"}
    fla_failed = {"mixer": "deltanet", "T": 2048, "minilin_version": 6, "minilin_error": 4e-3,
                  "minilin_state_error": 4e-3, "note": "FLA failed: RuntimeError: triton"}
    table = against_fla.format_table([timed, slow, wrong, fla_failed], copy_gbs=4200.0)
    lines = table.splitlines()
    assert "| gated_deltanet | 8192 | 0.780 (v6) | 1.040 | 0.75 | met |" in lines[2]
    assert "| 1.00 | not met |" in lines[3]
    assert "WRONG" in lines[4] and "| - | - | - |" in lines[4]
    assert "FLA failed" in lines[5] and "| 4.0e-03 / - |" in lines[5]


@pytest.mark.parametrize("argv", [["bench", "--against", "fla", "--device", "cpu"], ["bench", "--against", "fla"]])
def test_against_fla_refuses_with_a_reason_where_it_cannot_run(argv, capsys):
    from minilin import cli

    if argv[-1] == "fla" and mcuda.available()[0]:
        pytest.skip("a GPU is available: the comparison runs instead of refusing")
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert "fla" in (captured.out + captured.err)


def _fake_comparison(monkeypatch, *, our_error=0.0, fla_error=0.0, fla_raises=None, ours_raises=None, **compare):
    """against_fla._compare with every GPU piece replaced by NumPy stand-ins: its control flow, on a CPU."""
    import sys
    import types

    import numpy as np

    from minilin.bench import against_fla, gpu_timing

    freed = []
    fake_cupy = types.SimpleNamespace(float64=np.float64, get_default_memory_pool=lambda: types.SimpleNamespace(
        free_all_blocks=lambda: freed.append(True)))
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    rng = np.random.default_rng(0)
    ref = (rng.standard_normal((1, 8, 1, 4)), rng.standard_normal((1, 1, 4, 4)))
    ours = (ref[0] * (1 + our_error), ref[1])
    theirs = (ref[0] * (1 + fla_error), ref[1])
    monkeypatch.setattr(gpu, "make_inputs", lambda mixer, T, seed, problem=None, with_state=False: {})
    monkeypatch.setattr(gpu, "reference", lambda mixer, inputs, dtype: ref)
    monkeypatch.setattr(mcuda, "default_version", lambda op, dtype_is_bf16=True, K=None, V=None: 6)

    def run_ours():
        if ours_raises:
            raise ours_raises
        return ours

    monkeypatch.setattr(gpu, "cuda_call", lambda mixer, inputs, dtype, version: run_ours)

    def fla_call(mixer, inputs, dtype):
        if fla_raises:
            raise fla_raises
        return (lambda: theirs), (lambda result: result)

    monkeypatch.setattr(gpu, "fla_call", fla_call)
    timings = iter([1.0, 2.0] * against_fla.ROUNDS)
    monkeypatch.setattr(gpu_timing, "median_ms", lambda fn, **kw: gpu_timing.Timing(next(timings), 50,
                                                                                      call_ms=4.0))
    return against_fla.compare("gated_deltanet", 64, repeats=50, **compare), freed


def test_against_fla_times_both_sides_alternately_when_both_are_right(monkeypatch):
    row, freed = _fake_comparison(monkeypatch)
    assert row["minilin_ms"] == 1.0 and row["fla_ms"] == 2.0 and row["ratio"] == 0.5 and freed
    assert row["minilin_call_ms"] == 4.0 and row["call_ratio"] == 1.0


@pytest.mark.parametrize("case", ["ours wrong", "fla wrong", "fla raises"])
def test_against_fla_times_nothing_when_a_side_is_wrong_or_fails(monkeypatch, case):
    kwargs = {"ours wrong": dict(our_error=0.05), "fla wrong": dict(fla_error=0.05),
              "fla raises": dict(fla_raises=RuntimeError("triton compilation failed"))}[case]
    row, freed = _fake_comparison(monkeypatch, **kwargs)
    assert "ratio" not in row and freed
    assert ("FLA failed: RuntimeError" in row["note"]) if case == "fla raises" else row["note"].startswith("WRONG")


def test_against_fla_reports_a_size_minilin_does_not_take_and_times_nothing(monkeypatch):
    error = ValueError("minilin._cuda: linear_v8_split_sequence: K must be 64 or 128, got K=256")
    row, freed = _fake_comparison(monkeypatch, ours_raises=error, problem=dict(B=8, H=32, K=256, V=256),
                                  with_state=True)
    assert "ratio" not in row and freed and row["note"].startswith("minilin: not supported (")
    assert (row["B"], row["H"], row["K"], row["V"], row["initial_state"]) == (8, 32, 256, 256, True)


def test_grid_is_flas_shapes_and_all_adds_the_head_dims():
    from minilin.bench import against_fla

    assert against_fla.grid_shapes("fla") == list(against_fla.GRID) and len(against_fla.GRID) == 8
    every = against_fla.grid_shapes("all")
    assert len(every) == len(set(every)) and set(against_fla.GRID) <= set(every)
    assert {(1, 32768, 16, 64, 64), (1, 32768, 16, 128, 64), (1, 32768, 16, 128, 256)} <= set(every)


def test_grid_table_has_a_row_per_shape_and_a_column_per_mixer():
    from minilin.bench import against_fla

    shape = dict(B=1, T=32768, H=16, K=128, V=128, label="1, 32768, 16, 128, 128")
    rows = [dict(shape, mixer="simple_gla", minilin_version=8, minilin_ms=0.5, fla_ms=0.625, ratio=0.8),
            dict(shape, mixer="deltanet", minilin_version=10, minilin_ms=1.0, fla_ms=1.0, ratio=1.0),
            dict(shape, K=256, V=256, label="1, 32768, 16, 256, 256", mixer="simple_gla",
                 note="minilin: not supported (K must be 64 or 128)")]
    lines = against_fla.format_grid(rows, ["simple_gla", "deltanet"]).splitlines()
    assert lines[0] == "| B, T, H, K, V | simple_gla | deltanet |" and len(lines) == 4
    assert lines[2] == "| 1, 32768, 16, 128, 128 | 0.80 (v8, 0.500 / 0.625 ms) | **1.00** (v10, 1.000 / 1.000 ms) |"
    assert lines[3] == "| 1, 32768, 16, 256, 256 | minilin: not supported | - |"


def test_grid_runs_every_mixer_at_every_shape_with_an_initial_state(monkeypatch, capsys, tmp_path):
    import argparse
    import json

    from minilin.bench import against_fla

    calls = []

    def fake_compare(mixer, T, repeats, problem=None, with_state=False):
        calls.append((mixer, T, problem["B"], problem["K"], with_state))
        row = dict(problem, mixer=mixer, T=T, initial_state=with_state, minilin_version=8)
        if problem["K"] == 256:
            return dict(row, note="minilin: not supported (K must be 64 or 128)")
        return dict(row, minilin_ms=1.0, fla_ms=2.0, ratio=0.5)

    monkeypatch.setattr(against_fla, "compare", fake_compare)
    info = {"gpu": "a GPU", "date": "today", "fla": "0.6.0", "cupy": "14"}
    out = tmp_path / "grid.json"
    args = argparse.Namespace(grid="fla", json=str(out))
    assert against_fla.main_grid(args, ["simple_gla", "deltanet"], 20, info, 4000.0) == 0  # unsupported is no failure
    assert len(calls) == 2 * len(against_fla.GRID) and all(c[-1] for c in calls)
    captured = capsys.readouterr()
    assert "[16/16] deltanet 1, 2048, 16, 128, 128" in captured.err and "| 8, 2048, 32, 256, 256 | minilin: not supported |" in captured.out
    assert len(json.loads(out.read_text())["rows"]) == 16

    def wrong(*args, **kwargs):  # a checked-and-wrong row, as compare reports one: a note, nothing timed
        return {k: v for k, v in fake_compare(*args, **kwargs).items() if not k.endswith(("_ms", "ratio"))} | {
            "note": "WRONG (tolerance 0.01): not timed"}

    monkeypatch.setattr(against_fla, "compare", wrong)
    assert against_fla.main_grid(argparse.Namespace(grid="fla", json=None), ["deltanet"], 20, info, 4000.0) == 1


def test_grid_keeps_the_cells_measured_before_a_run_is_cut_short(monkeypatch, tmp_path):
    import argparse
    import json

    from minilin.bench import against_fla

    calls = []

    def cut_at_third(mixer, T, repeats, problem=None, with_state=False):
        calls.append(mixer)
        if len(calls) == 3:
            raise KeyboardInterrupt  # as a time limit's signal would stop the run
        return dict(problem, mixer=mixer, T=T, minilin_version=8, minilin_ms=1.0, fla_ms=2.0, ratio=0.5)

    monkeypatch.setattr(against_fla, "compare", cut_at_third)
    out = tmp_path / "grid.json"
    info = {"gpu": "a GPU", "date": "today", "fla": "0.6.0", "cupy": "14"}
    with pytest.raises(KeyboardInterrupt):
        against_fla.main_grid(argparse.Namespace(grid="fla", json=str(out)), ["simple_gla", "deltanet"], 20, info, 4000.0)
    rows = json.loads(out.read_text())["rows"]
    assert [r["mixer"] for r in rows] == ["simple_gla", "deltanet"] and rows[0]["label"] == "1, 8192, 96, 128, 128"


def test_grid_resume_times_only_the_cells_the_file_lacks(monkeypatch, tmp_path, capsys):
    import argparse
    import json

    from minilin.bench import against_fla

    calls = []

    def fake_compare(mixer, T, repeats, problem=None, with_state=False):
        calls.append((mixer, T, problem["B"], problem["K"]))
        return dict(problem, mixer=mixer, T=T, minilin_version=8, minilin_ms=1.0, fla_ms=2.0, ratio=0.5)

    monkeypatch.setattr(against_fla, "compare", fake_compare)
    info = {"gpu": "a GPU", "date": "today", "fla": "0.6.0", "cupy": "14"}
    labels = [label for label, _, _ in against_fla.grid_problems("fla")]
    kept = [dict(label=labels[0], mixer="simple_gla", minilin_ms=3.0, fla_ms=4.0, ratio=0.75, minilin_version=8),
            dict(label=labels[0], mixer="deltanet", note="WRONG (tolerance 0.01): not timed"),  # timed again
            dict(label=labels[1], mixer="deltanet", minilin_ms=5.0, fla_ms=6.0, ratio=0.83, minilin_version=10)]
    out = tmp_path / "grid.json"
    earlier_machine = {"gpu": "a GPU", "date": "yesterday", "fla": "0.6.0", "cupy": "14"}
    out.write_text(json.dumps({"against": "fla", "grid": "fla", "machine": earlier_machine, "rows": kept}))
    args = argparse.Namespace(grid="fla", json=str(out), resume=True)
    assert against_fla.main_grid(args, ["simple_gla", "deltanet"], 20, info, 4000.0) == 0
    assert len(calls) == 2 * len(labels) - 2  # the two timed cells are not timed again; the failed one is
    assert ("deltanet", 8192, 1, 128) in calls and ("simple_gla", 8192, 1, 128) not in calls
    rows = json.loads(out.read_text())["rows"]
    assert [(r["label"], r["mixer"]) for r in rows] == [(label, m) for label in labels for m in ("simple_gla", "deltanet")]
    assert rows[0]["ratio"] == 0.75 and rows[0]["date"] == "yesterday" and rows[1]["date"] == "today"
    assert "2 cells kept from" in capsys.readouterr().out

    out.write_text(json.dumps({"against": "fla", "grid": "all", "machine": earlier_machine, "rows": kept}))
    calls.clear()  # another grid: refused
    assert against_fla.main_grid(args, ["simple_gla"], 20, info, 4000.0) == 2 and not calls
    assert "holds grid 'all' timed on 'a GPU' against FLA 0.6.0 (torch None); this run is grid 'fla'" in \
        capsys.readouterr().err
    out.write_text(json.dumps({"against": "fla", "grid": "fla", "machine": dict(earlier_machine, fla="0.5.0"),
                               "rows": kept}))  # another FLA: its times are not this run's
    assert against_fla.main_grid(args, ["simple_gla"], 20, info, 4000.0) == 2 and not calls
    assert "against FLA 0.5.0" in capsys.readouterr().err
    out.write_text(json.dumps({"backward": True, "against": "fla", "grid": "fla", "machine": earlier_machine,
                               "rows": []}))  # a --backward grid's file
    assert against_fla.main_grid(args, ["simple_gla"], 20, info, 4000.0) == 2 and not calls
    assert "holds a --backward run, not a forward --against fla grid" in capsys.readouterr().err


def test_resume_needs_a_grid_and_a_json_file(capsys):
    from minilin.cli import main

    assert main(["bench", "--against", "fla", "--grid", "--resume"]) == 2
    assert "--resume finishes a grid that --json PATH holds" in capsys.readouterr().err
    assert main(["bench", "--backward", "--json", "x.json", "--resume"]) == 2  # no grid
    assert "it needs --grid with --against fla or --backward" in capsys.readouterr().err
    assert main(["bench", "--backward", "--grid", "--json", "-", "--resume"]) == 2  # not a file
    assert "--resume finishes a grid" in capsys.readouterr().err


def test_backward_grid_resume_times_only_the_rows_the_file_lacks(monkeypatch, tmp_path, capsys):
    """--backward --grid --resume: the rows an earlier run's --json holds are kept (with their date and their
    gradient checks) and not timed or checked again; the rest are, in the grid's order; a file from a run without
    FLA, or of another grid, is refused. No GPU needed (check and bench stand in)."""
    import argparse
    import json

    from minilin.bench import against_fla, gpu, gpu_backward

    checked, timed = [], []

    def fake_check(mixer, K=128, V=128):
        checked.append((mixer, K, V))
        return {"dq": 1e-3}

    def fake_bench(mixer, shape, repeats, against, with_state=False):
        timed.append((mixer, tuple(shape)))
        return dict(zip("BTHKV", shape), mixer=mixer, forward_ms=1.0, forward_backward_ms=3.0, ratio=3.0,
                    forward_version=10, backward_version=2, fla_forward_ms=1.5, fla_forward_backward_ms=4.0,
                    against_fla=0.75)

    monkeypatch.setattr(gpu_backward, "check", fake_check)
    monkeypatch.setattr(gpu_backward, "bench", fake_bench)
    monkeypatch.setattr(mcuda, "available", lambda: (True, ""))
    monkeypatch.setattr(gpu, "machine", lambda: {"gpu": "a GPU", "date": "today"})
    shapes = [tuple(s) for s in against_fla.grid_shapes("fla")]
    at_64 = [s for s in shapes if s[3] == 64]
    kept = [dict(zip("BTHKV", s), mixer="deltanet", forward_ms=2.0, forward_backward_ms=6.0, ratio=3.0,
                 forward_version=10, backward_version=2, fla_forward_ms=3.0, fla_forward_backward_ms=9.0, against_fla=0.67) for s in (shapes[1], *at_64)]
    out = tmp_path / "bwd.json"
    earlier = {"backward": True, "grid": "fla", "against": "fla", "machine": {"gpu": "a GPU", "date": "yesterday"},
               "checks": {"deltanet K=64, V=64": {"dq": 2e-3}}, "rows": kept}
    out.write_text(json.dumps(earlier))
    args = argparse.Namespace(grid="fla", mixers=["deltanet"], lengths=None, quick=False, repeats=5, against="fla",
                              json=str(out), resume=True)
    assert gpu_backward.main(args) == 0
    assert sorted(timed) == sorted(("deltanet", s) for s in shapes if s not in kept_shapes(kept))
    assert ("deltanet", 64, 64) not in checked  # every K = V = 64 shape was kept, and its check with it
    written = json.loads(out.read_text())
    assert [gpu_backward.shape_of(r) for r in written["rows"]] == shapes  # the grid's order, kept rows in place
    assert written["rows"][1]["date"] == "yesterday" and written["rows"][0]["date"] == "today"
    assert written["checks"]["deltanet K=64, V=64"] == {"dq": 2e-3} and written["against"] == "fla"
    assert f"{len(kept)} rows kept from" in capsys.readouterr().out

    timed.clear()
    out.write_text(json.dumps(dict(earlier, against=None)))  # timed without FLA: refused
    assert gpu_backward.main(args) == 2 and not timed
    assert "without FLA on 'a GPU'; this run is grid 'fla' with FLA" in capsys.readouterr().err


def kept_shapes(rows):
    return {tuple(r[d] for d in "BTHKV") for r in rows}


def test_grid_layouts_are_packed_sequences_and_grouped_heads():
    from minilin.bench import against_fla

    (packed_label, T, packed), *grouped = against_fla.grid_problems("layouts")
    assert packed["cu_seqlens"][0] == 0 and packed["cu_seqlens"][-1] == T == 32768 and len(packed["cu_seqlens"]) == 9
    assert any(n % 64 for n in against_fla.PACKED_LENGTHS)  # sequences that end inside a chunk
    assert all(problem["HV"] == 2 * problem["H"] == 32 for _, _, problem in grouped)
    assert against_fla.grid_problems("fla")[0] == ("1, 8192, 96, 128, 128", 8192, dict(B=1, H=96, K=128, V=128))


def test_grid_needs_against_fla(capsys):
    from minilin import cli

    assert cli.main(["bench", "--grid"]) == 2
    assert "--against fla or --backward" in capsys.readouterr().err
    assert cli.main(["bench", "--backward", "--grid", "--device", "cpu"]) == 2
    assert "it runs on the GPU" in capsys.readouterr().err
    assert cli.main(["bench", "--backward", "--grid", "layouts"]) == 2
    assert "--grid layouts times the forward only" in capsys.readouterr().err
    assert cli.main(["bench", "--backward", "--grid", "--lengths", "2048"]) == 2
    assert "--grid has its own shapes: drop --lengths" in capsys.readouterr().err


def test_fla_call_names_the_forms_it_knows():
    with pytest.raises(ValueError, match=r"form must be one of \('chunk', 'fused_recurrent'\), got 'parallel'"):
        gpu.fla_call("simple_gla", {}, "bfloat16", "parallel")


def test_implementations_are_timed_in_alternating_rounds(monkeypatch):
    calls, per_round_ms = [], {"a": iter([3.0, 3.1, 1.0, 1.1, 2.0, 2.1]), "b": iter([5.0, 5.1, 9.0, 9.1, 4.0, 4.1])}

    def fake_median_ms(fn, *, repeats, events, budget_ms):
        calls.append((fn(), events, repeats, budget_ms))
        return gpu_timing.Timing(next(per_round_ms[fn()]), 7, call_ms=next(per_round_ms[fn()]) * 10)

    monkeypatch.setattr(gpu_timing, "median_ms", fake_median_ms)
    a = gpu.Row("simple_gla", 2048, "bfloat16", "cuda v1 recurrent")
    b = gpu.Row("simple_gla", 2048, "bfloat16", "fla chunk")
    gpu.time_alternating([(a, lambda: "a", "cupy"), (b, lambda: "b", "torch")], repeats=50)
    assert [c[0] for c in calls] == ["a", "b"] * gpu.ROUNDS  # a, b, a, b, ...: a drift falls on both
    assert {c[1] for c in calls if c[0] == "b"} == {"torch"} and {c[2] for c in calls} == {50}
    assert {c[3] for c in calls} == {gpu.ROW_BUDGET_MS / gpu.ROUNDS}  # a slow row's budget is split, not tripled
    assert (a.ms, a.runs) == (2.0, 21) and (b.ms, b.runs) == (5.0, 21)  # median of the rounds' medians
    assert (a.call_ms, b.call_ms) == (21.0, 51.0)  # and of the rounds' single-call medians


# ---- the timer itself, on a scripted stream --------------------------------------------------------------
class ScriptedStream:
    """A stand-in for a CUDA stream and its events: each fn() puts `host_ms` on the host clock and `device_ms`
    of work on the stream; the stream starts work no earlier than it is enqueued, and an event's time is when
    the stream reaches it. Enough to tell a timer that waits between runs from one that queues them."""

    def __init__(self, host_ms: float, device_ms: float):
        self.host_ms, self.device_ms = host_ms, device_ms
        self.host = self.stream = 0.0
        self.log = []

    def fn(self):
        self.host += self.host_ms
        self.stream = max(self.stream, self.host) + self.device_ms
        self.log.append("fn")

    def timer(self):
        def record(event):
            self.stream = max(self.stream, self.host)
            event["t"] = self.stream
            self.log.append("record")

        def sync(event):
            self.host = max(self.host, event["t"])
            self.log.append("sync")

        def make_flush():
            return lambda: self.log.append("flush")

        return (dict, record, sync, lambda a, b: b["t"] - a["t"], make_flush)


def test_queued_runs_hide_the_host_dispatch_and_single_calls_include_it():
    stream = ScriptedStream(host_ms=0.05, device_ms=0.4)
    t = gpu_timing.median_ms(stream.fn, repeats=20, warmup=2, calls=3, timer=stream.timer())
    assert t.runs == 20
    assert t.median_ms == pytest.approx(0.4)  # the kernels alone: the host ran ahead of the stream
    assert t.call_ms == pytest.approx(0.45)  # a call from an idle stream waits for the host's 0.05 ms
    queued = stream.log[stream.log.index("flush"):]
    assert queued == ["flush", "record", "fn", "record"] * 20 + ["sync"]  # no wait between queued runs


def test_a_host_slower_than_its_kernels_shows_in_the_device_time_too():
    # The queued runs cannot hide a dispatch longer than the work (0.3 ms of host per 0.1 ms of kernels): the
    # stream idles between kernels, and the device time is the host's pace, never the kernels' 0.1 ms.
    stream = ScriptedStream(host_ms=0.3, device_ms=0.1)
    t = gpu_timing.median_ms(stream.fn, repeats=10, warmup=1, calls=1, timer=stream.timer())
    assert t.median_ms == pytest.approx(0.3) and t.call_ms == pytest.approx(0.4)


def test_a_slow_run_lowers_the_count_of_queued_runs_and_of_single_calls():
    stream = ScriptedStream(host_ms=0.0, device_ms=100.0)
    t = gpu_timing.median_ms(stream.fn, repeats=50, warmup=0, calls=1, budget_ms=1000.0, timer=stream.timer())
    assert t.runs == 10 and t.median_ms == pytest.approx(100.0)
    stream = ScriptedStream(host_ms=0.0, device_ms=300.0)
    t = gpu_timing.median_ms(stream.fn, repeats=50, warmup=0, calls=5, budget_ms=1000.0, timer=stream.timer())
    # one wait for the idle stream, two single calls (a third would pass half the budget), one for the queue
    assert stream.log.count("sync") == 1 + 2 + 1
    assert t.runs == 3 and t.call_ms == pytest.approx(300.0)


# ---- minilin bench --decode ---------------------------------------------------------------------------------
def test_decode_floor_is_the_state_read_and_written_once():
    from minilin.bench import decode

    assert decode.state_bytes(64) == 2 * 64 * 16 * 128 * 128 * 4
    assert round(decode.floor_us(64, 4270.0), 1) == 31.4 and round(decode.floor_us(256, 4270.0), 1) == 125.7


def test_decode_table_marks_the_targets_and_untimed_rows():
    from minilin.bench import decode

    rows = [dict(mixer="gated_deltanet", N=256, implementation="minilin", floor_us=125.7, us=150.0, call_us=170.0,
                 floor_ratio=150.0 / 125.7, error=3e-3, state_error=1e-3, vs_fla=0.78),
            dict(mixer="gated_deltanet", N=256, implementation="fla", floor_us=125.7, us=191.8, call_us=250.0,
                 floor_ratio=191.8 / 125.7, error=3e-3, state_error=1e-3),
            dict(mixer="kda", N=256, implementation="minilin", floor_us=125.7, us=180.0, call_us=190.0,
                 floor_ratio=180.0 / 125.7, error=3e-3, state_error=1e-3),
            dict(mixer="kda", N=1, implementation="minilin", floor_us=0.5, us=9.0, call_us=40.0, floor_ratio=18.0,
                 error=3e-3, state_error=1e-3),
            dict(mixer="simple_gla", N=1, implementation="minilin", floor_us=0.5, error=0.5, state_error=0.5,
                 note="WRONG (tolerance 0.01): not timed")]
    table = decode.format_table(rows, 4270.0)
    assert "| gated_deltanet | 256 | minilin | 150.0 | 170.0 | 125.7 | 1.19x | 0.78 | 3.0e-03 / 1.0e-03 |" in table
    assert "| gated_deltanet | 256 | fla fused_recurrent | 191.8 |" in table
    assert "target N=256 gated_deltanet: 1.19x the floor (<= 1.3x): met" in table
    assert "target N=256 kda: 1.43x the floor (<= 1.3x): NOT met" in table
    assert "target N=1 kda: 9.0 us (<= 15 us): met" in table
    assert "WRONG" in table and "target N=1 simple_gla" not in table  # an untimed row claims no target


@pytest.mark.parametrize("argv", [["bench", "--decode", "--device", "cpu"], ["bench", "--decode", "--lengths", "64"],
                                  ["bench", "--decode"]])
def test_decode_bench_refuses_with_a_reason_where_it_cannot_run(argv, capsys):
    from minilin import cli

    if argv == ["bench", "--decode"] and mcuda.available()[0]:
        pytest.skip("a GPU is available: the decode bench runs instead of refusing")
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert "decode" in (captured.out + captured.err)


def test_backward_table_gives_the_ratio_and_says_why_fla_did_not_run():
    from minilin.bench import gpu_backward

    shape = dict(B=4, T=8192, H=16, K=128, V=128)
    rows = [{"mixer": "gated_deltanet", **shape, "forward_ms": 0.5, "forward_backward_ms": 60.0, "ratio": 120.0,
             "forward_version": 10, "backward_version": 1, "fla_note": "FLA refused: Triton"},
            {"mixer": "deltanet", **shape, "forward_ms": 0.45, "forward_backward_ms": 50.0, "ratio": 111.1,
             "forward_version": 10, "backward_version": 1, "fla_forward_ms": 1.0, "fla_forward_backward_ms": 2.9,
             "against_fla": 17.24},
            {"mixer": "simple_gla", **dict(shape, K=256, V=256), "note": "not supported (K must be 64 or 128)"}]
    table = gpu_backward.format_table(rows, {"deltanet": {"dq": 3e-3}})
    assert ("| gated_deltanet | 4, 8192, 16, 128, 128 | 0.500 (v10) | 60.000 (v1) | 120.0x | - | FLA refused: Triton "
            "| - |") in table
    assert "| 1.000 | 2.900 | 17.24 |" in table and "deltanet: dq 3.0e-03" in table
    assert "| simple_gla | 4, 8192, 16, 256, 256 | - | not supported (K must be 64 or 128) |" in table


def test_backward_grid_checks_each_head_dim_then_times_every_shape(monkeypatch, capsys, tmp_path):
    """--backward --grid: a check per (mixer, K, V) of the grid, every shape timed with an initial state, a K, V whose
    gradients miss the tolerance not timed (and the exit code 1); no GPU needed (check and bench stand in)."""
    import argparse
    import json

    from minilin.bench import against_fla, gpu, gpu_backward

    checked, timed = [], []

    def fake_check(mixer, K=128, V=128):
        checked.append((mixer, K, V))
        return {"dq": 0.5 if (mixer, K) == ("deltanet", 64) else 1e-3}

    def fake_bench(mixer, shape, repeats, against, with_state=False):
        timed.append((mixer, shape, with_state))
        row = dict(zip("BTHKV", shape), mixer=mixer)
        if shape[3] == 256:
            return dict(row, note="not supported (K must be 64 or 128)")
        if mixer == "deltanet":  # FLA beside it
            return dict(row, forward_ms=1.0, forward_backward_ms=3.0, ratio=3.0, forward_version=8, backward_version=2,
                        fla_forward_ms=1.5, fla_forward_backward_ms=4.0, against_fla=0.75)
        return dict(row, forward_ms=1.0, forward_backward_ms=3.0, ratio=3.0, forward_version=8, backward_version=2,
                    fla_note="FLA refused: incorrect results on Hopper")

    monkeypatch.setattr(gpu_backward, "check", fake_check)
    monkeypatch.setattr(gpu_backward, "bench", fake_bench)
    monkeypatch.setattr(mcuda, "available", lambda: (True, ""))
    monkeypatch.setattr(gpu, "machine", lambda: {"gpu": "a GPU", "date": "today"})
    out = tmp_path / "bwd.json"
    args = argparse.Namespace(grid="fla", mixers=["simple_gla", "deltanet"], lengths=None, quick=False, repeats=5,
                              against=None, json=str(out))
    assert gpu_backward.main(args) == 1  # deltanet at K = V = 64 missed its tolerance
    dims = list(dict.fromkeys((K, V) for *_, K, V in against_fla.GRID))
    assert checked == [(m, K, V) for m in ("simple_gla", "deltanet") for K, V in dims]
    assert len(timed) == 2 * len(against_fla.GRID) - 1 and all(w for *_, w in timed)  # deltanet's (8, 1024, 8, 64)
    captured = capsys.readouterr()
    table = captured.out
    assert "| simple_gla | 8, 1024, 8, 64, 64 | 1.000 (v8) | 3.000 (v2) | 3.0x |" in table
    assert "- deltanet K=64, V=64: dq 5.0e-01" in table
    written = json.loads(out.read_text())
    assert len(written["rows"]) == len(timed) and written["finished"] is True
    assert written["complete"] is False  # deltanet's cell at K = V = 64 was not timed: the grid is not whole
    # each shape's line as it finishes carries FLA's times too, or why FLA did not run (a run cut short keeps them)
    assert ("deltanet B=1 T=8192 H=96 K=128 V=128: forward 1.000 ms, forward + backward 3.000 ms; FLA 1.500 / "
            "4.000 ms (minilin / FLA 0.75)") in captured.err
    assert "simple_gla B=1 T=8192 H=96 K=128 V=128: forward 1.000 ms, forward + backward 3.000 ms; FLA refused" in captured.err


def test_backward_bench_checks_every_gradient_of_each_mixer_on_the_gpu():
    ok, reason = mcuda.available()
    if not ok:
        pytest.skip(f"needs a GPU: {reason}")
    from minilin.bench import gpu_backward

    for mixer in gpu_backward.MIXERS:
        errors = gpu_backward.check(mixer)
        assert {"dq", "dk", "dv", "dinitial_state"} <= set(errors), mixer
        assert all(e <= gpu_backward.TOLERANCE[n] for n, e in errors.items()), (mixer, errors)


def test_against_fla_compares_the_channel_mixers_by_name(monkeypatch, capsys):
    """--mixers gla kda: GLA and KDA against FLA's chunk_gla and chunk_kda, asked for by name (not in the default
    three); a name FLA is not compared for is refused with the list. No GPU needed (the comparison stands in)."""
    import argparse

    from minilin.bench import against_fla, gpu

    calls = []

    def fake_compare(mixer, T, repeats, problem=None, with_state=False):
        calls.append((mixer, T))
        return {"mixer": mixer, "T": T, "minilin_ms": 1.0, "fla_ms": 2.0, "ratio": 0.5, "minilin_call_ms": 1.1,
                "fla_call_ms": 2.2, "minilin_error": 2e-3, "fla_error": 2e-3, "minilin_state_error": 1e-3,
                "fla_state_error": 1e-3, "minilin_vs_fla_error": 1e-3, "minilin_version": 4}

    monkeypatch.setattr(mcuda, "available", lambda: (True, ""))
    monkeypatch.setattr(against_fla, "fla_version", lambda: "0.6.0")
    monkeypatch.setattr(against_fla, "copy_bandwidth_gbs", lambda: 4000.0)
    monkeypatch.setattr(against_fla, "compare", fake_compare)
    monkeypatch.setattr(gpu, "machine", lambda: {"gpu": "a GPU", "date": "today", "cupy": "14"})
    args = argparse.Namespace(mixers=["gla", "kda"], lengths=[8192], repeats=5, grid=None, json=None)
    assert against_fla.main(args) == 0
    assert calls == [("gla", 8192), ("kda", 8192)]
    assert against_fla.main(argparse.Namespace(mixers=["rwkv7"], lengths=[8192], repeats=5, grid=None, json=None)) == 2
    assert "FLA is compared for ['simple_gla', 'deltanet', 'gated_deltanet', 'gla', 'kda'], got ['rwkv7']" in \
        capsys.readouterr().err


def test_shape_sets_the_problem_over_the_default_and_names_a_bad_item():
    from minilin.bench import parse_shape

    assert parse_shape([]) == dict(B=4, H=16, K=128, V=128)
    assert parse_shape(["B=1", "K=64", "V=64"]) == dict(B=1, H=16, K=64, V=64)
    assert parse_shape(["B=1", "HV=32"]) == dict(B=1, H=16, K=128, V=128, HV=32)
    assert parse_shape(["HV=16"]) == dict(B=4, H=16, K=128, V=128)  # one value head per q/k head: the plain layout
    for items, message in [(["T=100"], "NAME one of B, H, K, V, HV, got 'T=100'"), (["B"], "got 'B'"),
                           (["K=x"], "K must be a positive integer, got 'x'"), (["V=0"], "got '0'"),
                           (["K=6.5"], "got '6.5'"), (["HV=24"], "multiple of H (q/k heads), got HV=24 with H=16")]:
        with pytest.raises(ValueError, match=re.escape(message)):
            parse_shape(items)


def test_shape_is_refused_outside_a_comparison_at_lengths(capsys):
    from minilin.cli import main

    for argv in (["bench", "--shape", "B=1"], ["bench", "--against", "fla", "--grid", "--shape", "B=1"],
                 ["bench", "--backward", "--shape", "B=1"]):
        assert main(argv) == 2
        assert "--shape sets the problem of --against fla" in capsys.readouterr().err
    assert main(["bench", "--against", "fla", "--shape", "B=1", "Q=2"]) == 2
    assert "--shape: expected items NAME=N" in capsys.readouterr().err


def test_against_fla_runs_each_mixer_and_length_at_the_shape_given(monkeypatch, capsys):
    """--shape's problem reaches every comparison, the header and the JSON; its I/O floor counts v and o at HV heads.
    No GPU needed: availability, FLA, the machine and the comparison stand in."""
    import argparse

    import minilin.cuda
    from minilin.bench import against_fla, gpu

    calls = []

    def fake_compare(mixer, T, repeats, problem=None, with_state=False):
        calls.append((mixer, T, dict(problem)))
        return {"mixer": mixer, "T": T, **{d: problem[d] for d in "BHKV"}, "HV": problem["HV"], "minilin_ms": 1.0,
                "fla_ms": 2.0, "ratio": 0.5, "minilin_call_ms": 1.1, "fla_call_ms": 2.2, "call_ratio": 0.5,
                "minilin_version": 9, "minilin_error": 3e-3, "fla_error": 3e-3, "minilin_vs_fla_error": 4e-3}

    written = {}
    monkeypatch.setattr(minilin.cuda, "available", lambda: (True, ""))
    monkeypatch.setattr(against_fla, "fla_version", lambda: "0.6.0")
    monkeypatch.setattr(gpu, "machine", lambda: {"gpu": "stand-in", "date": "2026-12-07", "cupy": "14.2"})
    monkeypatch.setattr(against_fla, "copy_bandwidth_gbs", lambda: 1000.0)
    monkeypatch.setattr(against_fla, "compare", fake_compare)
    monkeypatch.setattr(against_fla, "write_json", lambda path, data: written.update(data))
    args = argparse.Namespace(mixers=["kda", "gated_deltanet"], repeats=5, lengths=[4096, 8192], grid=None,
                              shape=["B=1", "K=64", "V=64", "HV=32"], json="out.json")
    assert against_fla.main(args) == 0
    problem = dict(B=1, H=16, K=64, V=64, HV=32)
    assert calls == [(m, T, problem) for m in ("kda", "gated_deltanet") for T in (4096, 8192)]
    out = capsys.readouterr().out
    assert "B=1 H=16 K=64 V=64 HV=32, bfloat16" in out and written["problem"] == problem
    floor_ms = 1 * 4096 * (2 * 16 * 64 + 2 * 32 * 64) * 2 / 1e12 * 1e3  # q, k at 16 heads; v, o at 32
    assert gpu.io_floor_bytes(4096, "bfloat16", problem) == 1 * 4096 * (2 * 16 * 64 + 2 * 32 * 64) * 2
    assert f"| {floor_ms:.3f} |" in out.splitlines()[3]


def test_head_dims_keep_the_grid_shapes_of_those_widths():
    from minilin.bench import against_fla, parse_head_dims

    assert parse_head_dims(["64x64", "128X256", "64x64"]) == [(64, 64), (128, 256)]
    for bad in ("64", "64x", "x64", "0x64", "64x-1", "ax64"):
        with pytest.raises(ValueError, match=f"--head-dims: expected items KxV .* got {bad!r}"):
            parse_head_dims([bad])
    only = against_fla.grid_shapes("all", [(128, 256)])
    assert only == [(B, T, H, 128, 256) for B, T, H, _, _ in against_fla.GRID]
    both = against_fla.grid_shapes("all", [(128, 256), (64, 64)])
    assert both == [s for s in against_fla.grid_shapes("all") if s[3:] in {(128, 256), (64, 64)}]  # the grid's order
    assert [s[3:] for s in against_fla.grid_shapes("fla", [(256, 256)])] == [(256, 256)]
    with pytest.raises(ValueError, match=r"grid 'fla' has K x V 128x128, 64x64, 256x256; got 128x64"):
        against_fla.grid_shapes("fla", [(128, 64)])


def test_head_dims_need_a_grid_of_shapes(capsys):
    from minilin.cli import main

    assert main(["bench", "--against", "fla", "--head-dims", "64x64"]) == 2
    assert "--head-dims picks shapes of --grid or --grid all, got no --grid" in capsys.readouterr().err
    assert main(["bench", "--against", "fla", "--grid", "layouts", "--head-dims", "64x64"]) == 2
    assert "got --grid layouts" in capsys.readouterr().err
    assert main(["bench", "--against", "fla", "--grid", "--head-dims", "128x64"]) == 2
    assert "grid 'fla' has K x V" in capsys.readouterr().err
    assert main(["bench", "--against", "fla", "--grid", "all", "--head-dims", "128by64"]) == 2
    assert "expected items KxV" in capsys.readouterr().err


def test_a_grid_timed_a_slice_at_a_time_keeps_every_slice(monkeypatch, tmp_path, capsys):
    """--grid all --head-dims A --resume, then --head-dims B --resume into the same file: the second run times
    only B's cells and the file and table hold both slices, in the grid's order."""
    import argparse
    import json

    from minilin.bench import against_fla

    calls = []

    def fake_compare(mixer, T, repeats, problem=None, with_state=False):
        calls.append((problem["K"], problem["V"]))
        return dict(problem, mixer=mixer, T=T, minilin_version=10, minilin_ms=1.0, fla_ms=2.0, ratio=0.5)

    monkeypatch.setattr(against_fla, "compare", fake_compare)
    info = {"gpu": "a GPU", "date": "today", "fla": "0.6.0", "cupy": "14"}
    out = tmp_path / "all.json"
    for dims in ([(128, 256)], [(64, 64)]):
        calls.clear()
        args = argparse.Namespace(grid="all", json=str(out), resume=True, head_dims=dims)
        assert against_fla.main_grid(args, ["deltanet"], 20, info, 4000.0) == 0
        assert set(calls) == set(dims) and len(calls) == len(against_fla.grid_shapes("all", dims))
    captured = capsys.readouterr()
    assert "K x V 64x64 only" in captured.out and f"[{len(calls)}/{len(calls)}] deltanet" in captured.err
    rows = json.loads(out.read_text())["rows"]
    expected = [s for s in against_fla.grid_shapes("all") if s[3:] in {(128, 256), (64, 64)}]
    assert [r["label"] for r in rows] == [", ".join(map(str, s)) for s in expected]


def test_backward_grid_head_dims_time_only_those_shapes(monkeypatch, tmp_path):
    """--backward --grid all --head-dims 64x64: only the grid's K = V = 64 shapes are checked and timed; the file
    lists the whole grid's shapes, so that a later slice resumes into it."""
    import argparse
    import json

    from minilin.bench import against_fla, gpu, gpu_backward

    checked, timed = [], []
    monkeypatch.setattr(gpu_backward, "check", lambda mixer, K=128, V=128: checked.append((K, V)) or {"dq": 1e-3})
    monkeypatch.setattr(gpu_backward, "bench", lambda mixer, shape, repeats, against, with_state=False: (
        timed.append(tuple(shape)) or dict(zip("BTHKV", shape), mixer=mixer, forward_ms=1.0, forward_backward_ms=3.0,
                                           ratio=3.0, forward_version=10, backward_version=2)))
    monkeypatch.setattr(mcuda, "available", lambda: (True, ""))
    monkeypatch.setattr(gpu, "machine", lambda: {"gpu": "a GPU", "date": "today"})
    out = tmp_path / "bwd.json"
    args = argparse.Namespace(grid="all", head_dims=[(64, 64)], mixers=["simple_gla"], lengths=None, quick=False,
                              repeats=5, against=None, json=str(out), resume=True)
    assert gpu_backward.main(args) == 0
    assert timed == against_fla.grid_shapes("all", [(64, 64)]) and checked == [(64, 64)]
    written = json.loads(out.read_text())
    assert [tuple(s) for s in written["shapes"]] == against_fla.grid_shapes("all")
