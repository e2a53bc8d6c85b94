"""tools/emulate_bf16_backward.py: its float64 runs of linear_bwd v2's and delta_bwd v2's algorithms, and of a
chunked GLA backward's, are the NumPy backwards, and with every bf16 rounding point on they show what the tool's docstring reports."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import load_tool


@pytest.fixture(scope="module")
def tool():
    return load_tool("emulate_bf16_backward")


def test_bf16_rounds_to_nearest_even(tool):
    x = np.array([1.0, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 1.0 + 2.0**-9, -3.14159265])
    np.testing.assert_array_equal(tool.bf16(x), [1.0, 1.0, 1.0 + 2.0**-6, 1.0, -3.140625])


@pytest.mark.parametrize("T, K, V", [(63, 64, 128), (130, 32, 16)])
def test_unrounded_it_is_the_float64_backward(tool, T, K, V):
    x = tool.inputs(2, T, 2, K, V, seed=3)
    for name, error in tool.errors(x, ()).items():
        assert error < 1e-12, name


def test_rounded_the_chunk_local_gate_gradient_holds_where_the_sequence_wide_one_does_not(tool):
    """Every rounding point on, T = 1000: dg the kernel's way stays at the other gradients' ~2e-3, the one reverse
    sum over the sequence misses FLA's 0.02 (its rounded terms cancel only inside a chunk)."""
    errors = tool.errors(tool.inputs(2, 1000, 2, 64, 64, seed=0), tool.POINTS)
    assert all(errors[n] < 3e-3 for n in ("dq", "dk", "dv", "dinitial_state", "dg")), errors
    assert errors["dg_sequence"] > 0.02, errors


@pytest.mark.parametrize("T, K, V", [(63, 64, 128), (150, 32, 16)])
def test_unrounded_the_delta_split_is_the_float64_backward(tool, T, K, V):
    x = tool.inputs(2, T, 2, K, V, seed=5)
    for name, error in tool.errors(x, (), "gated_deltanet").items():
        assert error < 1e-12, name


def test_rounded_the_delta_split_stays_inside_flas_tolerances(tool):
    """Every intermediate delta_bwd v2 stores or shares in bf16 (T, S, D+, X, Delta, dDelta, R, the scores and the
    passes' weighted operands), T = 63, K = V = 128."""
    errors = tool.errors(tool.inputs(2, 63, 2, 128, 128, seed=0), tool.DELTA_POINTS, "gated_deltanet")
    assert all(e < 4e-3 for e in errors.values()), errors


@pytest.mark.parametrize("T, K, V", [(63, 64, 128), (130, 32, 16)])
def test_unrounded_the_chunked_gla_backward_is_the_float64_backward(tool, T, K, V):
    x = tool.inputs(2, T, 2, K, V, seed=3)
    for name, error in tool.errors(x, (), "gla").items():
        assert error < 1e-12, name


def test_rounded_glas_chunk_local_gate_gradient_holds_channel_by_channel(tool):
    """Every rounding point on, T = 1000, a decay per key channel: dg formed chunk by chunk stays at the other
    gradients' ~2e-3, the sequence-wide sum is many times worse (2.1e-2 here: above FLA's 0.02)."""
    errors = tool.errors(tool.inputs(2, 1000, 2, 64, 64, seed=0), tool.POINTS, "gla")
    assert all(errors[n] < 3e-3 for n in ("dq", "dk", "dv", "dinitial_state", "dg")), errors
    assert errors["dg_sequence"] > 5 * errors["dg"], errors


def test_gla_bwd_v2s_route_keeps_every_gradient_inside_flas_tolerances(tool):
    """gla_bwd v2's intra-chunk route with its bf16 sub-chunk references (point R) and every other point rounded,
    T = 1000: the references cost dg a little (2.9e-3 here against 1.7e-3 without them), nothing else, and every
    gradient stays far inside FLA's tolerances (0.008; dg 0.02)."""
    x = tool.inputs(2, 1000, 2, 64, 64, seed=0)
    references = tool.errors(x, ("R",), "gla")
    assert references["dg"] > 1e-4 and references["dv"] < 1e-12, references  # R rounds the references alone
    errors = tool.errors(x, tool.GLA_POINTS, "gla")
    assert all(errors[n] < 3e-3 for n in ("dq", "dk", "dv", "dinitial_state")), errors
    assert errors["dg"] < 5e-3, errors
