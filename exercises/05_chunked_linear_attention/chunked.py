"""Exercise 05: chunked linear attention, the form that trains fast.

The parallel form (exercise 02) does O(T^2) work; the recurrent form does O(T) work but in T tiny
sequential steps. The chunked form takes the best of both: cut the sequence into chunks of C tokens,

    for chunk n (rows i of Q_n, K_n, V_n are the chunk's tokens; S_n is the state before the chunk):
        O_n     = tril(Q_n K_n^T) V_n    +    Q_n S_n           (scale folded into Q)
                  \\_ inside the chunk _/     \\_ everything before it: one read of the state _/
        S_{n+1} = S_n + K_n^T V_n                                (the chunk's write, all at once)

Inside a chunk the work is dense matrix products (fast on any hardware); only N = T / C steps are
sequential. C = 1 is the recurrence, C = T the parallel form. The last chunk may be shorter than C
when T % C != 0: slice it as it is (or zero-pad: a zero key writes nothing, a padded query's output is
dropped).

Shapes: q, k [B, T, H, K]; v [B, T, H, V]; o [B, T, H, V]; S [B, H, K, V]; scale defaults to K ** -0.5.
Check: `minilin check 5` (compares with minilin.mixers.linear_attention's recurrence, several T and C, and
counts the lines of this file that run: they must follow the number of chunks, not of tokens).
"""
import numpy as np


def chunked_linear_attention(q, k, v, *, scale=None, chunk_size=64):
    """Linear attention, chunk by chunk (see the module docstring).

    q, k: [B, T, H, K]; v: [B, T, H, V]; chunk_size: C >= 1, any T (the last chunk may be short).
    Returns (o [B, T, H, V], S [B, H, K, V]): the outputs and the state after the last token.
    """
    raise NotImplementedError(
        "TODO: loop over chunks: intra-chunk masked product, plus the read of the state, then update the state (about 10 lines)")
