"""Exercise 02: the bracket move. Linear attention in its parallel and recurrent forms, and what each
order of the product costs.

Softmax attention cannot be reordered: the softmax acts on each row of Q K^T. Drop it (exercise 03 puts
a kernel phi back) and the product is associative (Katharopoulos et al. 2020):

    O = (Q K^T) V = Q (K^T V)

Causal linear attention, o_i = sum_{j <= i} (scale * q_i . k_j) v_j, has both forms:

    parallel   O = tril(scale * Q K^T) V                     the T x T matrix first, masked
    recurrent  S_t = S_{t-1} + k_t v_t^T                     S: [K, V], the state, S_0 = 0
               o_t = scale * S_t^T q_t

S_t = sum_{j <= t} k_j v_j^T is K^T V over the first t tokens: a memory of fixed size K x V, whatever
the length. Softmax attention's KV cache grows with T; this state does not.

What each order costs, for one head, n tokens, widths d_k (queries, keys) and d_v (values), counting a
multiply-add as 2 FLOPs (a product [a, b] @ [b, c] costs 2 a b c) and ignoring the causal mask:
    (Q K^T) V:  Q K^T is [n, n]: 2 n^2 d_k, then times V: 2 n^2 d_v
    Q (K^T V):  K^T V is [d_k, d_v]: 2 n d_k d_v, then Q times it: 2 n d_k d_v
The first grows with n^2, the second with n: past some length n* the bracket move wins.

Shapes: q, k [B, T, H, K]; v [B, T, H, V]; o [B, T, H, V]; state S [B, H, K, V]; scale defaults to
K ** -0.5. Check: `minilin check 2` (compares with minilin.mixers.linear_attention, and counts the lines
the parallel form runs: it may not loop over tokens).
"""
import numpy as np


def linear_attention_parallel(q, k, v, *, scale=None):
    """O = tril(scale * Q K^T) V for every batch and head.

    q, k: [B, T, H, K]; v: [B, T, H, V]. Returns o: [B, T, H, V].
    The mask keeps j <= i (np.tril); without the softmax there is no -inf: masked scores are 0.
    """
    raise NotImplementedError(
        "TODO: scores Q K^T per batch and head, keep the lower triangle, multiply by V (about 5 lines)")


def linear_attention_recurrent(q, k, v, *, scale=None):
    """The token loop: S_t = S_{t-1} + k_t v_t^T, o_t = scale * S_t^T q_t, from S_0 = 0.

    q, k: [B, T, H, K]; v: [B, T, H, V].
    Returns (o [B, T, H, V], S_T [B, H, K, V]): the outputs and the final state.
    Loop over t only; each step is one outer product per batch and head, vectorized over B and H.
    """
    raise NotImplementedError(
        "TODO: loop over t: add the outer product k_t v_t^T to S, read it with q_t (about 8 lines)")


def flops_quadratic(n, d_k, d_v):
    """FLOPs of (Q K^T) V for one head: Q, K [n, d_k], V [n, d_v]; an int (no mask, multiply-add = 2)."""
    raise NotImplementedError("TODO: the two products, counted as in the module docstring (about 1 line)")


def flops_linear(n, d_k, d_v):
    """FLOPs of Q (K^T V) for one head, counted the same way; an int."""
    raise NotImplementedError("TODO: the two products of the other order (about 1 line)")


def crossover(d_k, d_v):
    """The length n* > 0 at which both orders cost the same FLOPs (a float); longer sequences favour
    Q (K^T V). Solve flops_quadratic(n) = flops_linear(n) for n by hand: with d_k = d_v = d it is n* = d.
    """
    raise NotImplementedError("TODO: the n that makes the two counts equal (about 1 line)")
