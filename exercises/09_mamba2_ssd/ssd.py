"""Exercise 09: Mamba-2's state-space duality (SSD), chunked (Dao & Gu 2024, "Transformers are SSMs").

Mamba-2 ties the decay to one scalar per head and token, a_t = exp(dt_t A) with A <= 0 a scalar per head:

    h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t^T        h: [N, P] per head
    y_t = h_t^T C_t + D x_t

This is exercise 06's retention with the fixed gamma replaced by a decay per token, exp(g_t): linear
attention with a scalar gate, under the mapping q = C, k = B, v = dt x, g_t = dt_t A (log space), scale 1. Unrolled, y = (L * C B^T)(dt x) + D x with the 1-semiseparable
mask L_ij = exp(g_{j+1} + ... + g_i) for j <= i, else 0: an attention-like [T, T] matrix (the "dual").

Building L needs segment sums of g. With the cumulative sum G_i = g_0 + ... + g_i,

    segsum(g)_ij = g_{j+1} + ... + g_i = G_i - G_j   for j <= i,   -inf for j > i,    L = exp(segsum(g))

Only differences G_i - G_j <= 0 are exponentiated, never exp(G_i) / exp(G_j) (exp(-G_j) overflows
for long sequences or strong decays: G reaches -1000 and exp(1000) = inf).

The SSD algorithm, for chunks of C tokens (positions i, j inside the chunk; G chunk-local; h the state
entering the chunk):
    1. intra-chunk:   Y_diag = (L * C B^T) (dt x)                        L = exp(segsum(g)) of the chunk
    2. state read:    Y_off_i = exp(G_i) C_i^T h                          the state, decayed to token i
    3. state update:  h <- exp(G_last) h + sum_j exp(G_last - G_j) B_j (dt_j x_j)^T
and y = Y_diag + Y_off + D x. (The paper computes step 3 for all chunks first and then passes the
states in one short scan; a loop over chunks is the same arithmetic.)

Paper symbols -> code: x input (P channels per head), dt = Delta >= 0, A scalar per head (<= 0), B, C
(N per head and token), D skip, h the state. Shapes: x [B, T, H, P]; dt [B, T, H]; A [H];
B, C [B, T, H, N]; D [H] or None; y [B, T, H, P]; h [B, H, N, P].
Check: `minilin check 9` (compares with minilin.mixers.mamba2 and minilin.chunking.decay_matrix, and counts
the lines that run: a loop over chunks, not tokens).
"""
import numpy as np


def segsum(g):
    """Segment sums of log-decays: g [..., T] -> [..., T, T], out[..., i, j] = g_{j+1} + ... + g_i for
    j <= i (0 on the diagonal), -inf above it. Use differences of one cumulative sum."""
    raise NotImplementedError(
        "TODO: cumulative sum, all differences G_i - G_j, -inf where j > i (about 5 lines)")


def ssd_chunked(x, dt, A, B, C, D=None, *, chunk_size=64):
    """The SSD algorithm of the module docstring; any T, chunk_size >= 1 (the last chunk may be short).

    x: [B, T, H, P]; dt: [B, T, H]; A: [H]; B, C: [B, T, H, N]; D: [H] or None.
    Returns (y [B, T, H, P], h [B, H, N, P]): the outputs and the state after the last token.
    """
    raise NotImplementedError(
        "TODO: per chunk: L from segsum, Y_diag, Y_off from the carried state, then the state update (about 15 lines)")
