"""What each kind of layer keeps in memory while it decodes, in bytes, at a given context length.

A softmax layer must keep every past key and value (the KV cache): its memory grows linearly with the
context. A linear mixer keeps a fixed-size state instead, the same at 4K tokens as at 1M. Per layer and
per sequence (batch 1), with b = bytes per element and n = tokens of context:

    MHA            2 * heads * head_dim * n * b             every head keeps its own K and V
    GQA            2 * kv_heads * head_dim * n * b          query heads share kv_heads K/V heads (Ainslie et al. 2023)
    MLA            (latent_dim + rope_dim) * n * b          DeepSeek-V2 (2024): one compressed latent c_KV
                                                            (d_c) and one decoupled RoPE key (d_h^R) per token,
                                                            shared by all heads; K and V are re-expanded from it
    sliding window 2 * kv_heads * head_dim * min(n, W) * b  the ring buffer of the last W tokens
    fixed state    (elements of the mixer's state) * b      independent of n

The fixed states are not written down here but measured: `FixedState` runs the mixer's own `step` once
and counts the elements of the state it returns ([H, K, V] for most, [H, K, V + 1] for normalized linear
attention, a vector for HGRN, ...), so the accounting follows the code. Each mixer's (heads, key_dim,
value_dim) mean what its `example_inputs(H, K, V)` makes of them (Mamba-2: N = key_dim, P = value_dim).
Not counted: the short convolutions' few-token caches of real Mamba / GDN layers, the window's position
counter, and activations.
"""
from __future__ import annotations

import functools
import numbers
from dataclasses import dataclass

import numpy as np

from . import catalog
from .validation import check_count


def _tokens(tokens) -> int:
    if isinstance(tokens, bool) or not isinstance(tokens, numbers.Integral) or tokens < 0:
        raise ValueError(f"tokens: expected a non-negative integer (context length), got {tokens!r}")
    return int(tokens)


class LayerCache:
    """One layer's decoding memory: `elements(tokens)` numbers, `bytes(tokens, ...)` bytes."""

    label = "layer"

    def elements(self, tokens: int) -> int:
        raise NotImplementedError

    def bytes(self, tokens: int, *, bytes_per_element: int = 2, batch: int = 1) -> int:
        """Bytes held after `tokens` tokens of context, for `batch` sequences (2 bytes: bf16)."""
        return (self.elements(_tokens(tokens)) * check_count("bytes_per_element", bytes_per_element)
                * check_count("batch", batch))

    def grows(self) -> bool:
        """True when the memory keeps growing with the context (a KV cache)."""
        return self.elements(2) > self.elements(1)


@dataclass(frozen=True)
class MHA(LayerCache):
    """Multi-head attention's KV cache: K and V for every head, every token."""

    heads: int
    head_dim: int

    def __post_init__(self):
        check_count("heads", self.heads), check_count("head_dim", self.head_dim)

    @property
    def label(self) -> str:
        return f"MHA KV cache ({self.heads} heads x {self.head_dim})"

    def elements(self, tokens: int) -> int:
        return 2 * self.heads * self.head_dim * tokens


@dataclass(frozen=True)
class GQA(LayerCache):
    """Grouped-query attention's KV cache: K and V for the kv_heads shared heads only."""

    kv_heads: int
    head_dim: int

    def __post_init__(self):
        check_count("kv_heads", self.kv_heads), check_count("head_dim", self.head_dim)

    @property
    def label(self) -> str:
        return f"GQA KV cache ({self.kv_heads} KV heads x {self.head_dim})"

    def elements(self, tokens: int) -> int:
        return 2 * self.kv_heads * self.head_dim * tokens


@dataclass(frozen=True)
class MLA(LayerCache):
    """Multi-head latent attention's cache (DeepSeek-V2): the latent c_KV [latent_dim] and the decoupled
    RoPE key k^R [rope_dim] per token (DeepSeek-V2: d_c = 512, d_h^R = 64)."""

    latent_dim: int = 512
    rope_dim: int = 64

    def __post_init__(self):
        check_count("latent_dim", self.latent_dim), check_count("rope_dim", self.rope_dim)

    @property
    def label(self) -> str:
        return f"MLA latent cache ({self.latent_dim} + {self.rope_dim} RoPE)"

    def elements(self, tokens: int) -> int:
        return (self.latent_dim + self.rope_dim) * tokens


@dataclass(frozen=True)
class SlidingWindow(LayerCache):
    """Sliding-window attention's ring buffer: K and V of the last `window` tokens (`sliding_window`)."""

    window: int
    kv_heads: int
    head_dim: int

    def __post_init__(self):
        check_count("window", self.window), check_count("kv_heads", self.kv_heads), check_count("head_dim", self.head_dim)

    @property
    def label(self) -> str:
        return f"sliding window W={self.window} ({self.kv_heads} KV heads x {self.head_dim})"

    def elements(self, tokens: int) -> int:
        return 2 * self.kv_heads * self.head_dim * min(tokens, self.window)


@dataclass(frozen=True)
class FixedState(LayerCache):
    """A linear mixer's state, counted from the state its own `step` returns (see the module docstring)."""

    mixer: str
    heads: int
    key_dim: int
    value_dim: int

    def __post_init__(self):
        if self.mixer not in catalog.names():
            raise ValueError(f"mixer: expected one of {catalog.names()}, got {self.mixer!r}")
        check_count("heads", self.heads), check_count("key_dim", self.key_dim), check_count("value_dim", self.value_dim)
        _state_elements(self.mixer, self.heads, self.key_dim, self.value_dim)  # raises if not a fixed state

    @property
    def label(self) -> str:
        return f"{self.mixer} state"

    def elements(self, tokens: int) -> int:
        return _state_elements(self.mixer, self.heads, self.key_dim, self.value_dim)


def count_elements(state) -> int:
    """Numbers held by a state: an array, or a tuple / list of arrays (non-array entries such as a
    position counter are not counted)."""
    if state is None:
        return 0
    if isinstance(state, (tuple, list)):
        return sum(count_elements(s) for s in state)
    return int(state.size) if getattr(state, "ndim", 0) >= 1 else 0


# Mixers whose memory grows with the context, and the spec that accounts for them.
GROWING = {"attention": "MHA or GQA", "sliding_window": "SlidingWindow (it grows until it holds W tokens)"}


@functools.lru_cache(maxsize=None)
def _state_elements(mixer: str, heads: int, key_dim: int, value_dim: int) -> int:
    """Run the mixer's `step` twice (batch 1) and count its state; refuse a state that grows."""
    if mixer in GROWING:
        raise ValueError(f"mixer: expected a mixer with a fixed-size state, got {mixer!r}, whose cache grows "
                         f"with the context; use {GROWING[mixer]}")
    mod = catalog.module(mixer)
    if not callable(getattr(mod, "step", None)):
        raise ValueError(f"mixer: expected a mixer with a step form (a recurrent state), got {mixer!r} (non-causal)")
    args, kwargs = mod.example_inputs(1, 2, heads, key_dim, value_dim, dtype=np.float32, seed=0)
    sizes, state = [], None
    for t in range(2):
        _, state = mod.step(*(a[:, t] if getattr(a, "ndim", 0) >= 3 else a for a in args), state=state, **kwargs)
        sizes.append(count_elements(state))
    if sizes[1] != sizes[0]:
        raise ValueError(f"mixer: expected a mixer with a fixed-size state, got {mixer!r}, whose cache grows "
                         f"({sizes[0]} -> {sizes[1]} elements from token 1 to 2); use MHA / GQA / SlidingWindow")
    return sizes[0]


def stack_bytes(layers, tokens: int, *, bytes_per_element: int = 2, batch: int = 1) -> dict:
    """Per-layer and total bytes of a stack of LayerCache specs at `tokens` tokens of context:
    {"per_layer": [bytes, ...], "total": bytes}."""
    per_layer = [layer.bytes(tokens, bytes_per_element=bytes_per_element, batch=batch) for layer in layers]
    return {"per_layer": per_layer, "total": sum(per_layer)}


def format_bytes(n: float) -> str:
    """1536 -> '1.5 KiB' (binary units)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
