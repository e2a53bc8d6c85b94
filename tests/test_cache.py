"""Cache accounting (minilin.cache) against numbers worked out by hand."""
from __future__ import annotations

import re

import pytest

from minilin import cache

KiB, MiB, GiB = 2 ** 10, 2 ** 20, 2 ** 30


def test_mha_kv_cache():
    # 2 (K and V) x 32 heads x 128 x 4096 tokens x 2 bytes = 64 MiB
    assert cache.MHA(32, 128).bytes(4096) == 2 * 32 * 128 * 4096 * 2 == 64 * MiB


def test_gqa_kv_cache():
    # 8 KV heads: a quarter of MHA's; 128K tokens -> 512 MiB
    assert cache.GQA(8, 128).bytes(131072) == 2 * 8 * 128 * 131072 * 2 == 512 * MiB


def test_mla_latent_cache_deepseek_v2():
    # DeepSeek-V2: d_c = 512 latent + d_h^R = 64 RoPE key = 576 numbers per token, "equal to GQA with
    # only 2.25 groups" of d_h = 128 (2 x 2.25 x 128 = 576).
    mla = cache.MLA(512, 64)
    assert mla.elements(1) == 576 == 2 * 2.25 * 128
    assert mla.bytes(1000) == 1_152_000
    assert mla.bytes(1000, bytes_per_element=4, batch=3) == 576 * 1000 * 4 * 3


def test_sliding_window_stops_growing_at_the_window():
    w = cache.SlidingWindow(4096, 8, 128)
    assert w.bytes(100) == 2 * 8 * 128 * 100 * 2
    assert w.bytes(4096) == w.bytes(1 << 20) == 16 * MiB
    assert w.grows()  # it does grow until it is full


@pytest.mark.parametrize("mixer, elements", [
    ("gated_deltanet", 4 * 16 * 8),        # [H, K, V]
    ("deltanet", 4 * 16 * 8),
    ("retnet", 4 * 16 * 8),
    ("gla", 4 * 16 * 8),
    ("mamba2", 4 * 16 * 8),                # [H, N, P] with N = key_dim, P = value_dim
])
def test_fixed_state_from_the_mixers_own_state(mixer, elements):
    state = cache.FixedState(mixer, heads=4, key_dim=16, value_dim=8)
    assert state.elements(0) == state.elements(10 ** 6) == elements
    assert state.bytes(10 ** 6, bytes_per_element=4) == 4 * elements
    assert not state.grows()


def test_fixed_state_at_model_width():
    # 32 heads x 128 x 128 x 2 bytes = 1 MiB per layer, whatever the context
    assert cache.FixedState("gated_deltanet", 32, 128, 128).bytes(1 << 20) == 1 * MiB


def test_stack_totals():
    layers = [cache.FixedState("gated_deltanet", 32, 128, 128)] * 7 + [cache.GQA(8, 128)]
    out = cache.stack_bytes(layers, 4096)
    assert out["per_layer"] == [1 * MiB] * 7 + [16 * MiB]
    assert out["total"] == 23 * MiB


def test_format_bytes():
    assert cache.format_bytes(512) == "512 B"
    assert cache.format_bytes(1536) == "1.5 KiB"
    assert cache.format_bytes(24 * GiB + 42 * MiB) == "24.0 GiB"


# --- bad input: one test per case ------------------------------------------------------------------------

def test_attention_is_not_a_fixed_state():
    with pytest.raises(ValueError, match=r"mixer: expected a mixer with a fixed-size state, got 'attention', "
                                         r"whose cache grows with the context; use MHA or GQA"):
        cache.FixedState("attention", 4, 16, 16)


def test_sliding_window_is_not_a_fixed_state():
    with pytest.raises(ValueError, match=r"got 'sliding_window', whose cache grows .*use SlidingWindow"):
        cache.FixedState("sliding_window", 4, 16, 16)


def test_noncausal_mixer_has_no_state():
    with pytest.raises(ValueError, match=r"mixer: expected a mixer with a step form .*got 'linformer' \(non-causal\)"):
        cache.FixedState("linformer", 4, 16, 16)


def test_unknown_mixer():
    with pytest.raises(ValueError, match=r"mixer: expected one of \[.*\], got 'gdn'"):
        cache.FixedState("gdn", 4, 16, 16)


def test_negative_tokens():
    with pytest.raises(ValueError, match=re.escape("tokens: expected a non-negative integer (context length), got -1")):
        cache.GQA(8, 128).bytes(-1)


def test_zero_heads():
    with pytest.raises(ValueError, match=r"kv_heads: expected a positive integer, got 0"):
        cache.GQA(0, 128)


def test_zero_bytes_per_element():
    with pytest.raises(ValueError, match=r"bytes_per_element: expected a positive integer, got 0"):
        cache.MHA(4, 16).bytes(10, bytes_per_element=0)
