"""Exercise 14: additive vs delta writes. What each memory returns after a key's value changes, and
how well each recalls a key written long ago, next to softmax attention.

Three memories see the same sequence of pairs (k_t, v_t), t = 0 .. n-1 (unit keys), and are then read
with queries q (a query is one of the keys, asking for its value):

    additive (linear attention)   S = sum_t k_t v_t^T                                      read S^T q
    delta rule (DeltaNet)         S_t = S_{t-1} + beta k_t (v_t - S_{t-1}^T k_t)^T, S_{-1} = 0   read S_n^T q
    softmax attention             r = sum_t softmax_t(sharpness * q . k_t) v_t  over all n cached pairs

and each read r_i is scored against the value that key should now return, target_i:

    recall error  e_i = ||r_i - target_i|| / ||target_i||        (0 is perfect; 1 is as bad as reading 0)

Two experiments (the check runs both, with d = 16; the errors quoted are medians over 200 random draws):
1. Overwrite: key k_a is written with v_old at t = 2 and again with v_new at t = 9 (12 pairs in all);
   the target is v_new. The additive memory returns v_old + v_new plus interference: error about 1.25.
   The delta rule, beta = 1, reads its prediction v_old and replaces it: error about 0.35 (what is
   left is the interference of the other keys). Softmax attention matches both copies equally well
   and returns their average: error about 0.7. Only the delta rule overwrites.
2. Far key: 48 pairs into d = 16 (three times the capacity of exercise 04); query the first key. The
   interference of 47 others swamps the additive memory (error about 1.7); the delta rule has written
   over it with later, overlapping keys (error about 1.3), though it recalls the last key exactly
   (error 0); softmax attention keeps every pair and recalls the first about as well as the last
   (error about 0.09). Its price: a cache that grows with n, where the other two stay d x d_v.

Shapes: keys [n, d] (unit rows); values [n, d_v]; queries [m, d]; reads [m, d_v]; targets [m, d_v];
errors [m]. Check: `minilin check 14` (the references are minilin.mixers.linear_attention,
minilin.mixers.deltanet and minilin.mixers.attention, run over the same pairs).
"""
import numpy as np


def memory_reads(keys, values, queries, *, beta=1.0, sharpness=8.0):
    """Write all n pairs into the three memories of the module docstring; read each with every query.

    keys: [n, d]; values: [n, d_v]; queries: [m, d]; beta: the delta rule's writing strength in [0, 1];
    sharpness: softmax attention's scale on q . k.
    Returns (additive, delta, softmax): three [m, d_v] arrays of reads.
    """
    raise NotImplementedError(
        "TODO: the additive state K^T V; the delta rule's loop over the pairs; one softmax over all n keys per query (about 9 lines)")


def recall_errors(reads, targets):
    """e_i = ||r_i - target_i|| / ||target_i|| for each row: reads, targets [m, d_v] -> errors [m]."""
    raise NotImplementedError(
        "TODO: row norms of the difference over row norms of the targets (about 1 line)")
