"""Exercise 01: causal softmax attention, and one decoding step with a KV cache.

Softmax attention (Vaswani et al. 2017) mixes the values of earlier tokens, weighted by how well each
key matches the query:

    o_i = sum_{j <= i} softmax_j(s_ij) v_j,      s_ij = scale * q_i . k_j,      scale = K ** -0.5

Causal: token i sees the keys j <= i only; the future is masked by setting s_ij = -inf before the
softmax (exp(-inf) = 0). Computing every o_i at once builds the T x T score matrix S = scale Q K^T per
batch and head: O(T^2 K) time and O(T^2) memory.

A decoder generates one token at a time. It keeps every key and value seen so far, the KV cache
([B, P, H, K] and [B, P, H, V] after P tokens); a new token appends its k_t and v_t, and its query q_t
reads the whole cache. The cache grows by one entry per token: that growth is what linear attention
and state-space models replace with a fixed-size state, from exercise 02 on.

Shapes (sequence-first, as everywhere in minilin):
    q, k   [B, T, H, K]     B batch, T tokens, H heads, K the key (and query) width
    v      [B, T, H, V]     V the value width; K != V is allowed
    o      [B, T, H, V]

Check: `minilin check 1` compares with minilin.mixers.attention on random inputs (also scores in the
hundreds), and counts the lines of this file that causal_attention runs: every token at once, no loop over t.
"""
import numpy as np


def causal_attention(q, k, v, *, scale=None):
    """o_i = sum_{j <= i} softmax_j(scale * q_i . k_j) v_j, for every token i at once.

    q, k: [B, T, H, K]; v: [B, T, H, V]; scale: a float, default K ** -0.5.
    Returns o: [B, T, H, V].

    1. scores S_ij = scale * q_i . k_j for every batch and head: [B, H, T, T]
       (np.einsum("bihk,bjhk->bhij", q, k) names the axes for you);
    2. S_ij = -inf where j > i (np.triu(..., k=1) marks those);
    3. softmax over j: subtract each row's max before exp (exp of a large score overflows, and
       softmax does not change when a row is shifted by a constant), then divide by the row sum;
    4. o_i = sum_j P_ij v_j, back in the layout [B, T, H, V].
    """
    raise NotImplementedError(
        "TODO: scores, causal mask, a stable softmax over j, then the weighted sum of the values (about 8 lines)")


def decode_step(q_t, k_t, v_t, cache_k, cache_v, *, scale=None):
    """One decoding step with a KV cache.

    q_t, k_t: [B, H, K] and v_t: [B, H, V]: the new token.
    cache_k: [B, P, H, K] and cache_v: [B, P, H, V]: the P tokens before it (P may be 0).
    Returns (o_t [B, H, V], cache_k [B, P + 1, H, K], cache_v [B, P + 1, H, V]).

    Append k_t and v_t to the cache (on the token axis, 1), then read it:
        o_t = sum_{j <= P} softmax_j(scale * q_t . k_j) v_j     over all P + 1 cached tokens.
    No mask: everything in the cache is in the past (or is the token itself). Run from an empty cache
    for t = 0..T-1, decode_step gives causal_attention's o one token at a time.
    """
    raise NotImplementedError(
        "TODO: append the new key and value, then softmax-read the whole cache with q_t (about 9 lines)")
