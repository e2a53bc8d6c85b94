"""Exercise 07: a parallel scan for h_t = a_t h_{t-1} + b_t, in log depth.

Every diagonal recurrence (Mamba's selective SSM, HGRN, one channel of GLA) is, element by element,

    h_t = a_t * h_{t-1} + b_t,        t = 0 .. T-1,      h_{-1} = 0

A loop takes T dependent steps. But step t is the affine map h -> a_t h + b_t, and two such maps
compose into one of the same kind: applying (a1, b1) first, then (a2, b2),

    h -> a2 (a1 h + b1) + b2 = (a2 a1) h + (a2 b1 + b2)
    combine((a1, b1), (a2, b2)) = (a2 a1, a2 b1 + b2)

The composition is associative (not commutative: order matters), so the prefix compositions
P_t = step_0 . step_1 . ... . step_t can be grouped in any order, and h_t is P_t's b-part
(P_t applied to h_{-1} = 0). A log-depth scan (Hillis & Steele 1986):

    round r = 0, 1, 2, ... with offset d = 2^r, while d < T:
        for every t >= d at once:  (a_t, b_t) <- combine((a_{t-d}, b_{t-d}), (a_t, b_t))
        (positions t < d stay as they are)

After round r, position t holds the composition of the steps max(0, t - 2^(r+1) + 1) .. t; after
ceil(log2 T) rounds, the whole prefix. Each round is one vectorized combine over all positions: the
depth is ceil(log2 T) rounds, not T steps (the work, T log T, is more than the loop's; Blelloch's
up-sweep / down-sweep scan gets it back to O(T) at twice the depth, see minilin/scan.py).

Shapes: a, b [B, T, D] (the scan runs along axis 1, T; every other axis is independent); h [B, T, D].
Check: `minilin check 7` (compares with minilin.scan, and counts your calls to combine).
"""
import numpy as np


def combine(first, second):
    """Compose two steps, `first` applied first: ((a1, b1), (a2, b2)) -> (a2 a1, a2 b1 + b2).

    first, second: (a, b) pairs of arrays of one shape. Returns the pair (a, b) of the composed step.
    """
    raise NotImplementedError("TODO: the composed step, elementwise (about 2 lines)")


def sequential_scan(a, b):
    """The loop (the definition): h_t = a_t h_{t-1} + b_t along axis 1 from h_{-1} = 0.
    a, b: [B, T, D] -> h: [B, T, D]."""
    raise NotImplementedError("TODO: one step per t (about 6 lines)")


def associative_scan(a, b):
    """The same h in ceil(log2 T) rounds (module docstring). a, b: [B, T, D] -> h: [B, T, D].

    Call combine(...) once per round, on all positions at once (slices such as a[:, :-d] and a[:, d:]);
    do not inline it: the check counts the calls and allows at most 2 ceil(log2 T) + 2.
    """
    raise NotImplementedError(
        "TODO: rounds with offsets 1, 2, 4, ...: combine position t - d with position t, for all t >= d at once (about 8 lines)")
