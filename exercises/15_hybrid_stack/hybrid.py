"""Exercise 15: a hybrid stack (one softmax layer every r) and what it keeps in memory per layer.

Linear layers forget in a fixed-size state; softmax layers recall exactly but keep a KV cache that
grows with the context (exercise 14). Production models mix them: Jamba (1 attention : 7 Mamba),
MiniMax-01 (1 softmax : 7 Lightning), Kimi Linear (1 MLA : 3 KDA). Here: one softmax attention layer
("A") every r layers, Gated DeltaNet ("L", exercise 13) in the others:

    r = 4, 8 layers:   L L L A L L L A          layer i (from 0) is "A" when (i + 1) % r == 0

Every layer is pre-norm with a residual connection (no MLP here: the mixers are what is compared):

    h = RMSNorm(x) = x / sqrt(mean(x^2) + eps) * w,       eps = 1e-6, mean over the model width d
    q, k, v = (h W_q), (h W_k), (h W_v), each reshaped from [B, T, H * K] to [B, T, H, K] (K = V = d / H)
    "A":  o, cache = attention.chunked(q, k, v, chunk_size=C)              cache: KVCache(k, v), grows with T
    "L":  q, k <- q / sqrt(|q|^2 + 1e-6), k / ...                          unit vectors, over K
          g = log sigmoid(h W_g) = -logaddexp(0, -(h W_g))  [B, T, H]      log-space decay, <= 0
          beta = sigmoid(h W_beta)                          [B, T, H]      write strength, in (0, 1)
          o, cache = gated_deltanet.chunked(q, k, v, g, beta, chunk_size=C)  cache: the state [B, H, K, V]
    x = x + o W_o       (o reshaped to [B, T, H * V]; W_o: [H * V, d])

and the stack ends with a final RMSNorm. Default scales (K ** -0.5) everywhere.

What each layer keeps while decoding, at n tokens of context, with b bytes per number (2 for bf16):
    "A": K and V of every head and token:      2 * H * K * n * b         grows with n
    "L": the state [H, K, V]:                  H * K * V * b             the same at any n
For 48 layers of 32 heads x 128, bf16: all softmax holds 3 GiB at 4K tokens, 96 GiB at 128K and
768 GiB at 1M; with r = 8 (6 softmax layers) 0.42, 12.04 and 96.04 GiB: 7.2x, 7.97x, 8.0x less.
A softmax layer holds more than a linear one as soon as 2 n > V, past n = 64 tokens here.

Shapes: x [B, T, d]; weights W_q, W_k, W_v [d, H * K], W_g, W_beta [d, H], W_o [H * V, d], norm [d].
Check: `minilin check 15` (compares with minilin.hybrid.HybridStack and minilin.cache).
"""
import numpy as np

from minilin.mixers import attention, gated_deltanet

EPS = 1e-6


def hybrid_pattern(n_layers, r):
    """The layer kinds of an n_layers stack with one softmax layer every r: a str of "L" and "A", layer i
    (from 0) "A" when (i + 1) % r == 0. r = 1: all softmax; r > n_layers: no softmax layer."""
    raise NotImplementedError("TODO: one letter per layer (about 1 line)")


def layer_cache_bytes(kind, tokens, *, heads, head_dim, bytes_per_element=2):
    """Bytes one layer keeps at `tokens` tokens of context (batch 1; K = V = head_dim):
    kind "A": 2 * heads * head_dim * tokens * bytes_per_element; kind "L": heads * head_dim^2 * bytes_per_element."""
    raise NotImplementedError("TODO: the two formulas of the module docstring (about 3 lines)")


def rms_norm(x, weight):
    """RMSNorm over the last axis: x / sqrt(mean(x^2) + 1e-6) * weight. x: [..., d]; weight: [d]."""
    raise NotImplementedError("TODO: the mean of squares over the last axis, then scale (about 1 line)")


def hybrid_prefill(x, layers, final_norm, *, heads, chunk_size=64):
    """Run a prompt x [B, T, d] through the stack of the module docstring.

    layers: one dict per layer, in order: {"mixer": "attention" or "gated_deltanet", "norm": [d],
    "W_q", "W_k", "W_v": [d, H * K], "W_o": [H * V, d]} and, for "gated_deltanet", "W_g", "W_beta": [d, H].
    final_norm: [d]. heads: H. Returns (y [B, T, d], cache): cache holds one entry per layer, what its
    mixer's chunked form returned as state (the KV cache, or the state [B, H, K, V]).
    """
    raise NotImplementedError(
        "TODO: per layer: norm, projections, the mixer's chunked form, residual; then the final norm (about 15 lines)")
