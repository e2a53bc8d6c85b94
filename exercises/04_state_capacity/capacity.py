"""Exercise 04: state capacity. How many key/value pairs fit in a d x d_v memory?

A linear-attention state is a sum of outer products. Write n pairs (k_i, v_i) into it:

    S = sum_i k_i v_i^T = K^T V                      K: [n, d], V: [n, d_v], S: [d, d_v]

and read it back with one of the keys, r_i = S^T k_i. The read splits into what we want and the rest:

    r_i = (k_i . k_i) v_i  +  sum_{j != i} (k_i . k_j) v_j
          \\__ self term __/    \\______ interference ______/

With orthonormal keys (possible only while n <= d) every k_i . k_j is 0 for j != i and the memory is
exact. With more pairs than dimensions the keys cannot all be orthogonal and the interference grows:
for random unit keys, k_i . k_j has variance 1/d, so the interference of n - 1 others carries about
(n - 1) / d times the energy of the self term. The interference ratio

    rho = ||interference||_F^2 / ||self||_F^2        (sums over all n reads and all d_v channels)

reaches 1, noise as loud as the signal, at about n = d pairs: a d x d_v state holds about d items.
(Exercise 14 shows how the delta rule and softmax attention fare in the same test.)

Shapes: keys [n, d]; values [n, d_v]; queries [m, d]; S [d, d_v]; reads [m, d_v] or [n, d_v].
Check: `minilin check 4` (the memory written by minilin.mixers.linear_attention is the reference).
"""
import numpy as np


def write(keys, values):
    """S = sum_i k_i v_i^T: keys [n, d], values [n, d_v] -> S [d, d_v]."""
    raise NotImplementedError("TODO: the sum of outer products, as one matrix product (about 1 line)")


def read(S, queries):
    """r_i = S^T q_i for each query: S [d, d_v], queries [m, d] -> reads [m, d_v]."""
    raise NotImplementedError("TODO: one matrix product (about 1 line)")


def split_read(keys, values):
    """Read every written key back and split each read into (self_term, interference).

    keys [n, d], values [n, d_v] -> self_term [n, d_v] with rows (k_i . k_i) v_i, and interference
    [n, d_v] with rows sum_{j != i} (k_i . k_j) v_j. Their sum is read(write(keys, values), keys).
    """
    raise NotImplementedError(
        "TODO: the Gram matrix k_i . k_j; its diagonal gives the self term, the rest the interference (about 5 lines)")


def interference_ratio(keys, values):
    """rho = ||interference||_F^2 / ||self_term||_F^2 over all n reads (a float)."""
    raise NotImplementedError("TODO: split, then the ratio of the two squared norms (about 2 lines)")
