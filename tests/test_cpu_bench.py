"""`minilin bench --device cpu`'s measurements and table, on a small problem; the command's default device,
--quick and progress lines."""
from __future__ import annotations

import mmap
import re

import numpy as np
import pytest

from minilin.bench import cpu, timing


@pytest.mark.skipif(timing.resource is None, reason="the OS gives no page-fault counts (no `resource` module)")
def test_minor_page_faults_counts_first_touches_of_fresh_memory():
    pages = 64

    def touch_fresh_pages():
        with mmap.mmap(-1, pages * mmap.PAGESIZE) as m:
            view = np.frombuffer(m, np.uint8)
            view[:: mmap.PAGESIZE] = 1  # one write per page: each page faults in once
            del view

    def touch_nothing_new():
        return sum(range(100))

    assert timing.minor_page_faults(touch_fresh_pages) >= pages
    assert timing.minor_page_faults(touch_nothing_new) < pages


def test_rows_and_table_carry_time_error_and_page_faults(monkeypatch):
    monkeypatch.setattr(cpu, "PROBLEM", dict(B=1, T=256, H=2, K=16, V=16))
    row = cpu.bench_mixer("linear_attention", repeats=1)
    assert row["baseline"] == "recurrent"
    assert row["chunked_ms"] > 0 and row["recurrent_ms"] > 0
    assert row["chunked_error"] <= cpu.FLOAT32_TOLERANCE
    assert row["speedup"] == pytest.approx(row["recurrent_ms"] / row["chunked_ms"])
    for form in ("recurrent", "chunked"):
        faults = row[f"{form}_page_faults"]
        assert faults is None if timing.resource is None else faults >= 0
    table = cpu.format_table([row])
    header, _, line = table.splitlines()
    assert "page faults per call (baseline / chunked)" in header
    assert line.startswith("| linear_attention | recurrent |") and line.count("|") == header.count("|")


def test_the_floor_and_the_target_stand_beside_the_speed_up(monkeypatch):
    """Gated DeltaNet's row: its chunk size, its products' time (the floor) from the same rounds, its target."""
    monkeypatch.setattr(cpu, "PROBLEM", dict(B=1, T=256, H=2, K=16, V=16))
    row = cpu.bench_mixer("gated_deltanet", repeats=1)
    assert row["chunk_size"] == cpu.CHUNK_SIZES["gated_deltanet"] and row["target"] == cpu.TARGETS["gated_deltanet"]
    assert set(row["floor_ms"]) == {"products", "products + solve"} and all(ms > 0 for ms in row["floor_ms"].values())
    line = cpu.format_table([row]).splitlines()[2]
    loop_over_floor = row["recurrent_ms"] / row["floor_ms"]["products + solve"]
    assert f"({loop_over_floor:.1f}x, products + solve)" in line
    assert f"| {row['chunked_ms'] / row['floor_ms']['products + solve']:.2f} |" in line
    assert f"| {cpu.TARGETS['gated_deltanet']:.0f}x |" in line


def test_elementwise_mixers_say_why_no_chunking_wins(monkeypatch):
    monkeypatch.setattr(cpu, "PROBLEM", dict(B=1, T=64, H=2, K=8, V=8))
    rows = [cpu.bench_mixer("hgrn", repeats=1), cpu.bench_mixer("simple_gla", repeats=1)]
    assert "elementwise" in rows[0]["note"] and "note" not in rows[1]
    assert "(see note)" in cpu.format_table(rows).splitlines()[2]
    assert cpu.format_notes(rows).startswith("- hgrn: one elementwise update per token")


def test_a_wrong_form_is_reported_not_timed():
    row = {"mixer": "x", "baseline": "recurrent", "recurrent_ms": 3.0, "chunked_ms": None, "chunked_error": 0.5,
           "recurrent_page_faults": 0, "chunked_page_faults": None}
    line = cpu.format_table([row]).splitlines()[2]
    assert "wrong, not timed" in line and "| 0 / - |" in line


def test_interleaved_timing_alternates_the_forms_round_by_round(monkeypatch):
    calls = []
    fns = {"slow": lambda: calls.append("slow"), "fast": lambda: calls.append("fast")}
    clock = iter(range(1000))
    monkeypatch.setattr(timing.time, "perf_counter", lambda: float(next(clock)))  # every run takes 1 s
    times = timing.interleaved_median_ms(fns, {"slow": 1, "fast": 2}, rounds=3, warmup=1)
    assert calls == ["slow", "slow", "fast", "fast", "fast"] * 3  # an untimed run first in every round
    assert times == {"slow": 1000.0, "fast": 1000.0}


def test_json_goes_to_a_file_or_to_standard_output(tmp_path, capsys):
    import json

    from minilin.bench import write_json

    results = {"device": "cpu", "rows": [{"mixer": "x", "recurrent_ms": 1.5}]}
    write_json(str(tmp_path / "out.json"), results)
    assert json.loads((tmp_path / "out.json").read_text()) == results
    write_json("-", results)
    assert json.loads(capsys.readouterr().out) == results


def test_json_to_standard_output_is_the_json_alone(monkeypatch, capsys, tmp_path):
    """With --json - the header, table and notes go to stderr, so that stdout parses as JSON."""
    import json

    from minilin import cli
    import minilin.bench

    monkeypatch.setattr(minilin.bench, "is_one_thread", lambda: True)
    monkeypatch.setattr(cpu, "QUICK_PROBLEM", dict(B=1, T=32, H=1, K=4, V=4))
    assert cli.main(["bench", "--device", "cpu", "--quick", "--mixers", "retnet", "--json", "-"]) == 0
    out, err = capsys.readouterr()
    assert [row["mixer"] for row in json.loads(out)["rows"]] == ["retnet"] and "| retnet |" in err


def test_a_json_file_is_replaced_whole_and_a_broken_one_is_named(tmp_path):
    from minilin.bench import read_earlier_json, write_json

    path = tmp_path / "grid.json"
    write_json(str(path), {"rows": [1]})
    write_json(str(path), {"rows": [1, 2]})
    assert json_rows(path) == [1, 2] and [p.name for p in tmp_path.iterdir()] == ["grid.json"]
    path.write_text('{"rows": [1')  # a file cut off mid-write by something else
    with pytest.raises(ValueError, match=re.escape(f"--resume: {path} is not a JSON file of an earlier run")):
        read_earlier_json(str(path))


def json_rows(path):
    import json

    return json.loads(path.read_text())["rows"]


@pytest.mark.parametrize("argv, message", [
    (["--device", "cpu", "--repeats", "0"], "argument --repeats: expected a positive integer, got '0'"),
    (["--lengths", "2048", "-5"], "argument --lengths: expected a positive integer, got '-5'"),
])
def test_counts_must_be_positive(capsys, argv, message):
    from minilin import cli

    with pytest.raises(SystemExit) as refused:
        cli.main(["bench", *argv])
    assert refused.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--device", "cpu", "--json", "/no/such/folder/x.json"], "--json: expected a file in an existing folder"),
    (["--device", "cpu", "--floor", "--backward"], "--floor times the chunked forwards' products: drop --backward"),
    (["--decode", "--quick"], "--decode times the GPU's decode step on its own sizes"),
])
def test_flags_that_would_be_lost_are_refused_before_anything_runs(capsys, argv, message):
    from minilin import cli

    assert cli.main(["bench", *argv]) == 2
    assert message in capsys.readouterr().err


def test_bench_without_a_gpu_runs_the_cpu_bench_and_says_so(monkeypatch, capsys):
    from minilin import cli
    from minilin import cuda as mcuda

    monkeypatch.setattr(mcuda, "available", lambda: (False, "CuPy sees no GPU"))
    monkeypatch.setattr(cpu, "QUICK_PROBLEM", dict(B=1, T=64, H=1, K=8, V=8))
    assert cli.main(["bench", "--quick", "--mixers", "linear_attention", "retnet", "--repeats", "1"]) == 0
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert lines[0].startswith("minilin bench: no GPU bench here (CuPy sees no GPU); timing the NumPy reference")
    # progress on stderr: a count and what is being timed, then the seconds it took
    assert re.fullmatch(r"\[1/2\] linear_attention: checking, then timing recurrent, chunked, parallel \.\.\. "
                        r"\d+\.\d s", lines[1]), lines[1]
    assert lines[2].startswith("[2/2] retnet: checking, then timing ") and len(lines) == 3
    # stdout: the header, the table and its notes (one for linear attention), at the quick size
    assert out.splitlines()[0].startswith("minilin bench --device cpu --quick: B=1 H=1 T=64 K=8 V=8")
    assert [line.split(" | ")[0] for line in out.splitlines()[3:5]] == ["| linear_attention", "| retnet"]
    assert [line[:20] for line in out.splitlines()[5:]] == ["- linear_attention: "]
    assert "[1/2]" not in out


def test_bench_picks_the_gpu_where_it_can_run(monkeypatch, capsys):
    from minilin import bench, cli
    from minilin import cuda as mcuda
    import minilin.bench.gpu as gpu

    seen = []
    monkeypatch.setattr(mcuda, "available", lambda: (True, ""))
    monkeypatch.setattr(gpu, "main", lambda args: seen.append((args.lengths, args.repeats)) or 0)
    assert cli.main(["bench", "--quick"]) == 0
    assert seen == [([2048], 5)]                                  # --quick on the GPU: one length, 5 runs
    assert "timing the CUDA kernels on the GPU" in capsys.readouterr().err
    assert cli.main(["bench", "--quick", "--repeats", "9", "--lengths", "4096"]) == 0
    assert seen[-1] == ([4096], 9)                                # given values win
    assert bench.QUICK_GPU == dict(lengths=[2048], repeats=5)


def test_quick_is_refused_with_the_floor(capsys):
    from minilin import cli

    assert cli.main(["bench", "--device", "cpu", "--floor", "--quick"]) == 2
    assert "--quick" in capsys.readouterr().err


def test_gpu_rows_refuses_with_the_reason_where_it_cannot_run(monkeypatch):
    import minilin.bench.gpu as gpu
    from minilin import cuda as mcuda

    monkeypatch.setattr(mcuda, "available", lambda: (False, "CuPy sees no GPU"))
    with pytest.raises(RuntimeError, match="CuPy sees no GPU"):
        gpu.rows()


def test_the_cpu_bench_reruns_itself_with_one_blas_thread(monkeypatch):
    import subprocess

    import minilin.bench
    from minilin import cli
    from minilin.threads import THREAD_VARIABLES

    calls = []
    monkeypatch.setattr(minilin.bench, "is_one_thread", lambda: False)
    monkeypatch.setattr(subprocess, "run", lambda cmd, env: calls.append((cmd, env)) or subprocess.CompletedProcess(cmd, 0))
    assert cli.main(["bench", "--quick", "--device", "cpu", "--backward"]) == 0
    (cmd, env), = calls
    assert cmd[1:] == ["-m", "minilin", "bench", "--quick", "--device", "cpu", "--backward"]
    assert all(env[name] == "1" for name in THREAD_VARIABLES) and "glibc.malloc" in env["GLIBC_TUNABLES"]


def test_one_thread_means_the_malloc_thresholds_too():
    """A process started with the thread variables at 1 but glibc's default thresholds re-runs: the CPU benches
    time with both (minilin.threads)."""
    from minilin.threads import THREAD_VARIABLES, compute_environment, is_one_thread

    assert is_one_thread(compute_environment({}))
    assert not is_one_thread({name: "1" for name in THREAD_VARIABLES})
