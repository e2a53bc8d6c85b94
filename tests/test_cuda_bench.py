"""The GPU benchmark's bookkeeping (floors, derived columns, JSON rows), checked without a GPU."""
from __future__ import annotations

import argparse

import pytest

from minilin import cuda as mcuda
from minilin.bench import gpu


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
        pytest.skip("a GPU is available: the benchmark runs instead of refusing (csrc/gpu_check.sh runs it)")
    args = argparse.Namespace(mixers=None, repeats=None, json=None)
    assert gpu.main(args) == 2
