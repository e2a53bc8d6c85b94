"""The tour's memory experiment: its claims, asserted on the data it returns."""
from __future__ import annotations

import pytest

from minilin.experiments import EXPERIMENTS, memory

MiB, GiB = 2 ** 20, 2 ** 30
K4, K128, M1 = memory.CONTEXTS


@pytest.fixture(scope="module")
def data():
    return memory.run(quick=True)


def rows(data):
    return {row["layer"]: row for row in data["per_layer"]}


def test_the_config_is_the_stated_one(data):
    c = data["config"]
    assert (c["layers"], c["d_model"], c["heads"], c["head_dim"], c["kv_heads"], c["bytes_per_element"]) == \
        (48, 4096, 32, 128, 8, 2)
    assert data["contexts"] == (4096, 131072, 1048576)


def test_kv_caches_grow_linearly_with_the_context(data):
    for name in ("MHA", "GQA", "MLA"):
        b = rows(data)[name]["bytes"]
        assert rows(data)[name]["grows"]
        assert b[K128] == 32 * b[K4] and b[M1] == 256 * b[K4], name
    assert rows(data)["GQA"]["bytes"][K4] == 16 * MiB      # 2 x 8 x 128 x 4096 x 2 bytes
    curve = data["growth"]["GQA"]
    assert all(b == 2 * a for a, b in zip(curve, curve[1:]))  # doubles with every doubling of the context


def test_linear_states_stay_one_size_and_small(data):
    fixed = [row for row in data["per_layer"] if not row["grows"]]
    assert len(fixed) >= 8  # every linear mixer in minilin.mixers
    gqa_4k = rows(data)["GQA"]["bytes"][K4]
    for row in fixed:
        assert row["bytes"][K4] == row["bytes"][K128] == row["bytes"][M1], row["layer"]
        assert row["bytes"][K4] < gqa_4k / 8, row["layer"]   # already at 4K, 16x+ below one GQA layer
    assert rows(data)["gated_deltanet"]["bytes"][M1] == 1 * MiB   # 32 x 128 x 128 x 2 bytes
    assert len(set(data["growth"]["gated_deltanet"])) == 1


def test_sliding_window_is_flat_past_its_window(data):
    b = rows(data)["sliding window 4096"]["bytes"]
    assert b[K4] == b[K128] == b[M1] == 16 * MiB


def test_one_in_eight_hybrid_against_all_softmax(data):
    stacks = data["stacks"]
    softmax, hybrid = stacks["all softmax, GQA"], stacks["1:7 GQA + gated_deltanet"]
    assert softmax[K4] == 768 * MiB and softmax[K128] == 24 * GiB and softmax[M1] == 192 * GiB
    for n in memory.CONTEXTS:
        assert hybrid[n] == 6 * softmax[n] // 48 + 42 * MiB     # 6 GQA layers + 42 fixed 1 MiB states
    ratios = [softmax[n] / hybrid[n] for n in memory.CONTEXTS]
    assert ratios[0] == pytest.approx(768 / 138)                # 5.6x at 4K: the states still matter
    assert all(b > a for a, b in zip(ratios, ratios[1:]))       # the gap widens with the context ...
    assert 7.9 < ratios[-1] < 8                                 # ... toward 8x, never past it


def test_mla_is_the_per_token_saving_mha_cannot_make(data):
    stacks = data["stacks"]
    assert stacks["all softmax, MHA"][M1] == 4 * stacks["all softmax, GQA"][M1]
    assert stacks["all softmax, GQA"][M1] / stacks["all softmax, MLA"][M1] == pytest.approx(2 * 8 * 128 / 576)


def test_accounting_equals_the_arrays_a_real_stack_holds(data):
    assert data["measured"], "no measurement"
    assert {r["after"] for r in data["measured"]} == {"prefill", "decode"}
    for r in data["measured"]:
        assert r["measured"] == r["accounted"], r


def test_table_shows_the_hybrid_and_the_check(data):
    text = memory.table(data)
    assert "1:7 GQA + gated_deltanet" in text and "all softmax, GQA" in text
    checked = len(data["measured"])
    assert f"{checked} of {checked} layer caches equal to the byte" in text


def test_plot_writes_a_png(data, tmp_path):
    pytest.importorskip("matplotlib", reason="plots need the `plot` extra (matplotlib)")
    path = tmp_path / "memory.png"
    memory.plot(data, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_registered_right_after_forms():
    names = [e.name for e in EXPERIMENTS]
    assert names[names.index("forms") + 1] == "memory"
