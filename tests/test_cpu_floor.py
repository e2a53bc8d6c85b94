"""`minilin bench --device cpu --floor`: the products it times are the chunked forms' own, on a small problem."""
from __future__ import annotations

import json

import numpy as np
import pytest

from minilin.bench import cpu_floor
from minilin.cli import main
from minilin.mixers import gated_deltanet, linear_attention

SMALL = dict(B=1, T=96, H=2, K=16, V=8)


def test_linear_attention_floor_writes_what_the_chunked_form_writes():
    args, _ = linear_attention.example_inputs(**SMALL, dtype=np.float32)
    writes = cpu_floor.linear_attention_products(args, 32)()
    _, final_state = linear_attention.chunked(*args, chunk_size=32)
    np.testing.assert_allclose(writes.sum(axis=2), final_state, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("C, with_solve", [(16, False), (32, True)])
def test_gated_deltanet_floor_runs_the_real_state_pass(C, with_solve):
    """With every gate zero, the floor's state pass (the real T, no gates) is the whole recurrence."""
    (q, k, v, g, beta), _ = gated_deltanet.example_inputs(**SMALL, dtype=np.float32)
    g = np.zeros_like(g)
    state = cpu_floor.gated_deltanet_products((q, k, v, g, beta), C, with_solve=with_solve)()
    _, final_state = gated_deltanet.recurrent(q, k, v, g, beta)
    np.testing.assert_allclose(state, final_state, rtol=1e-4, atol=1e-4)


def test_floor_rows_and_table():
    rows = cpu_floor.floor_rows(rounds=1, chunk_sizes=(16, 32), problem=SMALL)
    assert [(r["mixer"], r["part"]) for r in rows] == [
        ("linear_attention", "products"), ("gated_deltanet", "products"), ("gated_deltanet", "products + solve")]
    for r in rows:
        assert r["loop_ms"] > 0 and all(ms > 0 for ms in r["floor_ms"].values())
    table = cpu_floor.format_floor(rows).splitlines()
    assert len(table) == 2 + len(rows) and "C = 32" in table[0] and table[4].endswith(f"| {cpu_floor.TARGETS['gated_deltanet']:.0f}x |")


def test_floor_is_a_cpu_measurement(capsys):
    assert main(["bench", "--device", "gpu", "--floor"]) == 2
    assert "--device cpu" in capsys.readouterr().err


def test_floor_options_are_checked(capsys):
    assert main(["bench", "--device", "cpu", "--floor", "--mixers", "kda"]) == 2
    assert "kda" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:  # argparse's own refusal of a value its type rejects
        main(["bench", "--device", "cpu", "--floor", "--chunk-sizes", "0"])
    assert refused.value.code == 2 and "--chunk-sizes: expected a positive integer, got '0'" in capsys.readouterr().err
    assert main(["bench", "--device", "cpu", "--chunk-sizes", "32"]) == 2
    assert "--floor" in capsys.readouterr().err


def test_gpu_only_lengths_are_refused_on_the_cpu_not_ignored(capsys):
    for extra in ([], ["--floor"]):
        assert main(["bench", "--device", "cpu", *extra, "--lengths", "2048"]) == 2
        assert "--lengths" in capsys.readouterr().err


def test_floor_json(monkeypatch, tmp_path):
    monkeypatch.setattr(cpu_floor, "PROBLEM", SMALL)
    destination = tmp_path / "floor.json"
    assert main(["bench", "--device", "cpu", "--floor", "--mixers", "linear_attention", "--chunk-sizes", "16",
                 "--repeats", "1", "--json", str(destination)]) == 0
    rows = json.loads(destination.read_text())["floor"]
    assert [r["mixer"] for r in rows] == ["linear_attention"] and list(rows[0]["floor_ms"]) == ["16"]
