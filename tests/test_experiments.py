"""The tour's experiments: each claim that holds is asserted on the data the experiment returns (quick sizes,
fixed seeds), so a regression in a mixer or an experiment fails here. Timing-based claims (the measured
crossover of `bracket`, the growth exponents of `cost`) depend on the machine and its load: each run checks
them itself and says which it did not reproduce, and here that saying is tested on made-up numbers; their
FLOP counts and correctness checks are asserted."""
from __future__ import annotations

import functools
import math
import json
import re

import numpy as np
import pytest

from minilin.experiments import EXPERIMENTS

CHAPTER_ORDER = ["forms", "memory", "bracket", "exactness", "capacity", "interference", "softmax_amplification",
               "fixed_decay", "write_rules", "fact_update", "recall", "state_tracking", "cost", "gradients",
               "trained_recall"]
BY_NAME = {e.name: e for e in EXPERIMENTS}


@functools.lru_cache(maxsize=None)
def quick(name: str):
    """Each experiment's quick data, computed once per test session."""
    return BY_NAME[name].run(True)


def test_registry_follows_the_chapter_order():
    assert [e.name for e in EXPERIMENTS] == CHAPTER_ORDER
    for e in EXPERIMENTS:
        assert e.claim.strip() and e.title.strip(), e.name


@pytest.mark.parametrize("name", CHAPTER_ORDER[2:])
def test_table_renders(name):
    text = BY_NAME[name].table(quick(name))
    assert isinstance(text, str) and len(text.splitlines()) >= 3
    assert not re.search(r"\bnan\b", text.lower()), text


def test_bracket_flops_cross_at_n_equals_d():
    data = quick("bracket")
    d = data["d"]
    for r in data["rows"]:
        assert r["flops_left"] == 4 * r["n"] ** 2 * d and r["flops_right"] == 4 * r["n"] * d ** 2
        assert r["flops_left"] / r["flops_right"] == pytest.approx(r["n"] / d)
        assert r["relative_difference"] < 1e-12
    at_d = next(r for r in data["rows"] if r["n"] == d)
    assert at_d["flops_left"] == at_d["flops_right"]
    assert all(r["ms_left"] > 0 and r["ms_right"] > 0 for r in data["rows"])


def test_exactness_both_bracket_orders_agree_to_rounding():
    for r in quick("exactness")["rows"]:
        assert r["chunked_float64"] < 1e-12 and r["parallel_float64"] < 1e-12, r
        if r["computed_in_float32"] == "float32":
            assert r["chunked_float32"] < 1e-5 and r["parallel_float32"] < 1e-5, r


def test_capacity():
    data = quick("capacity")
    d = data["d"]
    for r in data["rows"]:
        if r["n"] <= d:
            assert r["orthogonal_error"] < 1e-10, r       # exact up to n = d
        else:
            assert r["orthogonal_error"] > 0.5, r         # and failing past it
        # random unit keys: RMS error tracks sqrt((n - 1) / d)
        assert 0.85 < r["random_error"] / r["predicted_random_error"] < 1.15, r
        assert r["softmax_error"] < r["random_error"], r
    gaps = [r["softmax_log_weight_gap"] for r in data["rows"]]
    assert max(gaps) / min(gaps) < 1.05                    # softmax's weight gap is flat in n
    assert np.mean(gaps) == pytest.approx(data["softmax_scale"], rel=0.05)  # = s (1 - mean cos) ~ s


def test_interference_split():
    data = quick("interference")
    d = data["d"]
    for r in data["rows"]:
        assert r["own_error"] < 1e-12 and r["parts_sum_error"] < 1e-12 and r["terms_sum_error"] < 1e-12
        assert r["own_norm"] == pytest.approx(1.0, abs=1e-12)
        if r["n"] <= d:
            assert r["orthogonal_cross"] < 1e-12, r
        else:
            assert r["orthogonal_cross"] > 0.3, r
        if r["n"] >= d // 2:
            assert 0.75 < r["random_cross"] / r["predicted_cross"] < 1.25, r
        if r["n"] >= d:
            assert r["largest_term"] < 0.5 * r["random_cross"], r   # many small terms, none dominant


def test_softmax_amplification():
    data = quick("softmax_amplification")
    rows = {r["kernel"]: r for r in data["rows"]}
    ns = data["ns"]
    kernels = [r for r in data["rows"] if r["kind"] == "kernel"]
    softmax = rows["softmax, scale 1/sqrt(d)"]
    for r in kernels:
        assert softmax["ratio"][ns[-1]] > 10 * r["ratio"][ns[-1]], r["kernel"]
        assert softmax["right_share"][ns[-1]] > 3 * r["right_share"][ns[-1]], r["kernel"]
    for name in ("identity", "elu+1", "relu"):               # a pairwise ratio: the same at every n
        ratios = [rows[name]["ratio"][n] for n in ns]
        assert max(ratios) / min(ratios) < 1.15, name
    assert rows["elu+1"]["right_share"][ns[-1]] < 0.05      # the wrong pairs take almost all the weight
    assert softmax["right_share"][ns[-1]] > 0.5
    scales = [rows[f"softmax, scale {s}/sqrt(d)"]["ratio"][ns[-1]] for s in ("0.5", "1", "2")]
    assert scales[0] < scales[1] < scales[2]                 # a sharper softmax amplifies more


def test_fixed_decay():
    data = quick("fixed_decay")
    d = data["d"]
    for h in data["heads"]:
        assert h["largest_deviation_from_gamma_t"] < 1e-12
        assert h["parts_sum_error"] < 1e-12
        if h["predicted_half_life"] < data["T"]:
            assert h["measured_half_life"] == math.ceil(h["predicted_half_life"])
        else:
            assert h["measured_half_life"] is None
        assert 0.8 < h["cross_talk_ratio"] < 1.25, h["head"]
        assert d // 4 <= h["signal_below_cross_talk_at"] <= 2 * d, h["head"]


def test_write_rules_trade():
    data = quick("write_rules")
    d = data["d"]
    rows = {(r["n"], r["rule"]): r for r in data["rows"]}
    n_max = data["ns"][-1]
    for n in data["ns"]:
        additive, delta = rows[(n, "additive")], rows[(n, "delta, beta = 1")]
        assert delta["newest_error"] < 1e-12                # beta = 1, unit key: the newest pair is exact
        assert delta["error"] < additive["error"]           # and the reconstruction error is lower
        assert additive["kept_oldest"] == pytest.approx(1.0, abs=0.1)  # own term at full strength
    additive, delta = rows[(n_max, "additive")], rows[(n_max, "delta, beta = 1")]
    half = rows[(n_max, "delta, beta = 0.5")]
    # the trade: past d, delta writes erase older pairs and recall them far worse than additive writes
    assert delta["kept_oldest"] < 0.2
    assert delta["recall_oldest"] < 0.1 and additive["recall_oldest"] > 0.3
    assert delta["recall"] < additive["recall"]
    assert delta["recall_newest"] > delta["recall_oldest"] + 0.5
    assert delta["recall_oldest"] < half["recall_oldest"] and delta["error"] > half["error"]
    assert all(rows[(n, rule)]["recall"] == 1.0 for n in data["ns"] if n < d // 2 + 1
               for rule in ("additive", "delta, beta = 0.5"))


def test_fact_update():
    data = quick("fact_update")
    rows = {r["rule"]: r for r in data["rows"]}
    for rule in ("delta, beta = 1", "gated delta, beta = 1"):
        assert rows[rule]["worst_error_at_update"] < 1e-12, rule   # the new value, to rounding
        assert abs(rows[rule]["old_part_at_update"]) < 0.2, rule
    additive = rows["additive"]
    assert additive["error_at_update"] == pytest.approx(data["predicted_additive_error"], rel=0.2)
    assert additive["old_part_at_update"] == pytest.approx(1.0, abs=0.15)   # v_old still in the read
    decayed = rows["additive + decay"]
    assert decayed["old_part_at_update"] == pytest.approx(data["alpha"] ** data["update"], abs=0.15)


def test_recall():
    data = quick("recall")
    for r in data["rows"]:
        acc, far = r["accuracy"], r["far_accuracy"]
        assert acc["softmax"] >= 0.99, r
        if r["n"] >= r["d"]:                                # the finding: erasing writes recall less
            assert acc["linear attention"] > acc["DeltaNet"] >= acc["Gated DeltaNet"] - 0.05, r
        if r["n"] >= 2 * r["d"]:
            assert far["DeltaNet"] < 0.25 and far["linear attention"] > 0.8, r
        if r["n"] < r["d"]:
            assert min(acc.values()) > 0.9, r


def test_state_tracking_parity():
    data = quick("state_tracking")
    assert data["all_positions_exact"] and data["flip_values"] == [-1.0, 1.0]
    assert data["chunked_difference"] < 1e-12
    rows = data["rows"]
    assert all(r["negative_eigenvalues"] == 1.0 for r in rows)
    assert rows[0]["L"] == 1 and rows[0]["best_held_out"] == 1.0    # one bit: no swap needed
    assert abs(rows[-1]["best_held_out"] - 0.5) < 0.1               # long strings: chance


def test_cost_cpu_checks_and_gpu_skip_reason(monkeypatch):
    data = quick("cost")
    for row in data["cpu"]:
        assert all(e < 1e-4 for e in row["chunked_vs_recurrent"].values())
        assert all(ms is not None and ms > 0 for ms in row["ms"].values())
    try:
        import cupy  # noqa: F401
    except ImportError:
        assert "CuPy" in data["gpu"]["skipped"]
        assert "GPU: skipped" in BY_NAME["cost"].table(data)


def test_cost_takes_the_gpu_benchmarks_rows_directly(monkeypatch):
    """The GPU part's only assumptions: `minilin.bench.gpu.rows(...)` returns {"rows": [...], "machine": ...} or
    raises with its reason. A stand-in benchmark checks that side of the interface without a GPU."""
    import sys
    import types

    from minilin.experiments import cost

    fake = types.ModuleType("minilin.bench.gpu")
    calls = []

    def rows(**kwargs):
        calls.append(kwargs)
        return {"device": "gpu", "machine": {"gpu": "test GPU"},
                "rows": [{"mixer": "gla", "T": 2048, "recurrent_ms": 2.5, "chunked_ms": 0.25}]}

    fake.rows = rows
    import minilin.bench

    # Both places an import can find it: where a GPU is present the real module may already be imported,
    # and `from ..bench import gpu` then reads the package attribute, not sys.modules.
    monkeypatch.setitem(sys.modules, "minilin.bench.gpu", fake)
    monkeypatch.setattr(minilin.bench, "gpu", fake, raising=False)
    monkeypatch.setattr(cost, "gpu_missing", lambda: None)
    gpu = cost.gpu_results(quick=True)
    assert calls == [{"lengths": (2048,), "repeats": 5}]
    assert gpu["rows"] == [{"mixer": "gla", "T": 2048, "recurrent_ms": 2.5, "chunked_ms": 0.25}]
    text = "\n".join(cost._gpu_table(gpu))
    assert "gpu test GPU" in text and "chunked_ms" in text and "0.25" in text and "2048" in text

    def refuses(**kwargs):
        raise RuntimeError("the CUDA extension is not built")

    fake.rows = refuses
    assert "the CUDA extension is not built" in cost.gpu_results(quick=True)["skipped"]
    fake.rows = lambda **kwargs: {"rows": "not a list"}
    assert "no list of rows" in cost.gpu_results(quick=False)["skipped"]


@pytest.mark.parametrize("name", ["forms"] + CHAPTER_ORDER[2:])  # memory's plot: tests/test_memory_experiment.py
def test_plot_writes_a_png(name, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / f"{name}.png"
    BY_NAME[name].plot(quick(name), str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_memory_helpers_match_the_formulas():
    """The experiments' write/read helpers (mixers continued from a state, query tokens that write nothing,
    softmax's extra query slot divided out) against the formulas written directly, float64."""
    from minilin.experiments import _associative as mem

    rng = np.random.default_rng(0)
    keys = mem.unit_vectors(rng, 2, 7, 5)
    values, queries = rng.standard_normal((2, 7, 1, 3)), rng.standard_normal((2, 4, 1, 5))
    k, v, q = keys[:, :, 0], values[:, :, 0], queries[:, :, 0]
    S = np.einsum("bnk,bnv->bkv", k, v)
    assert np.abs(mem.read(mem.write_additive(keys, values), queries)[:, :, 0] - q @ S).max() < 1e-12
    scores = 1.7 * q @ k.swapaxes(1, 2)
    w = np.exp(scores - scores.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    assert np.abs(mem.softmax_read(keys, values, queries, 1.7)[:, :, 0] - w @ v).max() < 1e-12
    S = np.zeros((2, 5, 3))
    for t in range(7):                                   # the delta rule, one write at a time, decayed first
        S = 0.9 * S
        S = S + 0.6 * k[:, t, :, None] * (v[:, t] - np.einsum("bk,bkv->bv", k[:, t], S))[:, None, :]
    out = mem.read(mem.write_delta(keys, values, 0.6, log_decay=np.log(0.9)), queries)[:, :, 0]
    assert np.abs(out - q @ S).max() < 1e-12
    assert np.allclose(np.linalg.norm(keys, axis=-1), 1.0)
    blocks = mem.orthogonal_keys(rng, 2, 12, 5)[:, :, 0]
    assert np.abs(blocks[:, :5] @ blocks[:, :5].swapaxes(1, 2) - np.eye(5)).max() < 1e-12


def test_timing_tables_say_when_the_machine_was_busy():
    from minilin.experiments import _timing

    assert "busy" in _timing.load_note({"cores": 2, "load": 7.5})
    assert _timing.load_note({"cores": 2, "load": 1.5}) == "" and _timing.load_note({"cores": 2, "load": None}) == ""
    assert _timing.busiest({"cores": 2, "load": 1.0}, {"cores": 2, "load": 3.0})["load"] == 3.0


def test_the_timing_process_runs_one_blas_thread_with_fixed_malloc_thresholds():
    from minilin.experiments import _timing

    seen = _timing.single_threaded(_timing.child_environment)
    assert all(seen[name] == "1" for name in _timing.THREAD_VARIABLES), seen
    assert seen["GLIBC_TUNABLES"].startswith(_timing.MALLOC_TUNABLES)
    with pytest.raises(RuntimeError, match="the timing process for .* failed"):
        _timing.single_threaded(_timing.busiest)          # busiest() needs an argument: the child fails
    for name in ("bracket", "cost"):                      # the experiments took their times there
        assert quick(name)["timing"] == "CPU time of one BLAS thread"


def test_alternating_rounds_time_every_function_in_turn(monkeypatch):
    from minilin.experiments import _timing

    calls = []
    clock = iter(range(0, 10 ** 6, 2))                    # every clock reading 2 ms after the last
    monkeypatch.setitem(_timing.CLOCKS, "fake", lambda: next(clock) / 1e3)
    fns = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    timed = _timing.alternating_ms(fns, rounds=3, budget_s=0.004, clock="fake")
    calibration, rounds = calls[:4], calls[4:]
    assert calibration == ["a", "a", "b", "b"]
    # each round: a warm-up call and two 1-call samples of a, then the same of b
    assert rounds == ["a", "a", "a", "b", "b", "b"] * 3
    assert timed["a"]["ms"] == pytest.approx(2.0) and timed["b"]["ms"] == pytest.approx(2.0) and timed["a"]["samples"] == 6
    assert _timing.spread([1.0, 1.5, 2.0]) == pytest.approx(2 / 3) and _timing.spread([3.0]) == 0.0


def _bracket_data(left_ms, right_ms, d=64):
    from minilin.experiments import bracket

    ns = [16, 64, 256, 1024, 4096]
    rows = [{"n": n, "ms_left": a, "ms_right": b, "spread_left": 0.1, "spread_right": 0.1, "relative_difference": 1e-16,
             "flops_left": bracket.flops_left(n, d), "flops_right": bracket.flops_right(n, d)}
            for n, a, b in zip(ns, left_ms, right_ms)]
    data = {"d": d, "rows": rows, "rounds": 3, "timing": "CPU time of one BLAS thread",
            "measured_crossover": bracket.measured_crossover(rows), "load": {"cores": 2, "load": 0.5}}
    data["checks"] = bracket.checks(data)
    return data


def test_bracket_says_when_a_run_does_not_reproduce_its_claims():
    from minilin.experiments import bracket

    good = _bracket_data([0.01, 0.04, 0.6, 9.6, 154.0], [0.02, 0.04, 0.15, 0.6, 2.4])
    assert all(c["reproduced"] for c in good["checks"]), good["checks"]
    assert "not reproduced" not in bracket.table(good)
    # a disturbed run: the lead falls at the largest n
    bad = _bracket_data([0.01, 0.04, 0.6, 9.6, 154.0], [0.02, 0.04, 0.15, 0.6, 24.0])
    assert [c["reproduced"] for c in bad["checks"]] == [True, False]
    lines = bracket.table(bad).splitlines()
    assert any(line.startswith("not reproduced in this run: past the crossing the state-first order wins") and
               "6.4x at n = 4096 (n/d = 64)" in line for line in lines), lines
    never = _bracket_data([0.01, 0.02, 0.1, 0.5, 2.0], [0.02, 0.04, 0.2, 1.0, 4.0])
    assert never["measured_crossover"] is None and not any(c["reproduced"] for c in never["checks"])
    assert "still slower at n = 4096 (0.50x)" in bracket.table(never)


def test_cost_says_when_a_run_does_not_reproduce_its_claims():
    from minilin.experiments import cost

    def data(scale):
        rows = []
        for T in (256, 512, 1024, 2048):
            ms = {label: (0.01 if form == "recurrent" else 0.002) * T for label, _, form in cost.FORMS}
            ms["softmax attention"] = 1e-5 * T ** scale
            rows.append({"T": T, "ms": ms, "spread": {k: 0.1 for k in ms}, "chunked_vs_recurrent": {"x": 1e-7}})
        d = {"problem": cost.CPU_PROBLEM, "rounds": 3, "timing": "CPU time of one BLAS thread",
             "load": {"cores": 2, "load": 0.5}, "cpu": rows, "exponents": cost.exponents(rows), "gpu": {"skipped": "x"}}
        d["checks"] = cost.checks(d)
        return d

    good = data(2.0)
    assert all(c["reproduced"] for c in good["checks"]), good["checks"]
    assert "not reproduced" not in cost.table(good)
    linear_softmax = data(1.0)
    assert [c["reproduced"] for c in linear_softmax["checks"]] == [True, False, True]
    assert "not reproduced in this run: softmax attention grows about quadratically (p within 1.6..2.4) " \
           "(measured: softmax attention T^1.00)" in cost.table(linear_softmax).splitlines()
    slow_chunked = data(2.0)
    slow_chunked["cpu"][-1]["ms"]["Gated DeltaNet, chunked"] = 100.0
    assert not cost.checks(slow_chunked)[2]["reproduced"]


def test_every_plot_carries_its_claim_and_what_was_not_reproduced(monkeypatch, tmp_path):
    pytest.importorskip("matplotlib")
    from minilin.experiments import _plot

    saved = {}
    real_save = _plot.save

    def capture(fig, path, name, not_reproduced=()):
        saved[name] = (real_save(fig, path, name, not_reproduced), list(not_reproduced))

    monkeypatch.setattr(_plot, "save", capture)
    for e in EXPERIMENTS:
        e.plot(quick(e.name), str(tmp_path / f"{e.name}.png"))
        header, _ = saved[e.name]
        assert " ".join(header).startswith(e.claim), e.name   # the sentence it shows, above the axes
    bad = _bracket_data([0.01, 0.04, 0.6, 9.6, 154.0], [0.02, 0.04, 0.15, 0.6, 24.0])
    BY_NAME["bracket"].plot(bad, str(tmp_path / "bad.png"))
    header, notes = saved["bracket"]
    assert notes and " ".join(header).endswith(" ".join(notes)) and notes[0].startswith("not reproduced in this run")


def test_gradients_forms_agree_and_match_finite_differences():
    data = quick("gradients")
    by_claim = {c["claim"]: c for c in data["checks"]}
    for row in data["rows"]:
        assert row["forms_difference"] < 1e-10, row
        assert row["fd_error"] < 1e-6, row
    assert by_claim["the recurrent and chunked backward forms agree to float64 rounding"]["reproduced"]
    assert by_claim["the hand-written gradients agree with finite differences"]["reproduced"]


def test_trained_recall_quick_sweep_learns_what_the_literature_says():
    """The quick sweep is trained by minilin's own gradients, from a fixed seed: the claims hold."""
    data = quick("trained_recall")
    assert data["source"] == "trained in this run"
    assert all(c["reproduced"] for c in data["checks"]), data["checks"]


def test_trained_recall_reads_a_cached_sweep_back(monkeypatch, tmp_path):
    from minilin.experiments import trained_recall

    monkeypatch.setenv("MINILIN_CACHE", str(tmp_path))
    runs = trained_recall._runs(False)
    path = trained_recall.cache_path(runs)
    assert path.startswith(str(tmp_path))
    records = [{"mixer": r.name, "d_model": r.d_model, "num_kv_pairs": 8, "seq_len": 48, "vocab": 32, "state_bytes": 1,
                "steps": 600, "seconds": 1.0, "accuracy": a} for r, a in zip(runs, (1.0, 0.2, 0.95, 0.97, 1.0))]
    with open(path, "w") as f:
        json.dump({"runs": records}, f)
    data = trained_recall.run(False)
    assert data["source"].startswith("read back from") and all(c["reproduced"] for c in data["checks"])
