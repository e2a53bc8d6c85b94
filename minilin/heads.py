"""Grouped value heads (GVA, as Qwen3-Next's Gated DeltaNet): fewer query/key heads than value heads.

    q, k [B, T, H, K]      v, g, beta [B, T, HV, ...]      state [B, HV, K, V]      o [B, T, HV, V]
    HV = G * H:  value head j reads query/key head j // G          (G = HV // H, the group size)

Each q/k head is shared by G consecutive value heads (FLA's convention), so the mixer is the ordinary one
run on HV heads whose q and k are the q/k heads repeated G times each:

    q_rep[:, :, j] = q[:, :, j // G]          (`expand`)

That is how the NumPy reference computes it, readably, at the cost of G copies of q and k. In the
backward, a q/k head's gradient is the sum over the value heads that read it (the chain rule through the
copy):

    dq[:, :, i] = sum_{j : j // G = i} dq_rep[:, :, j]          (`reduce`)

G = 1 (HV == H) is the plain layout: both functions return their argument unchanged. `Signature.check`
binds H from q and k and HV from the value-side arrays, and refuses an HV that is not a multiple of H.
"""
from __future__ import annotations

from .backend import array_module


def expand(x, group: int):
    """q or k [..., H, K] -> [..., H * group, K], each head repeated `group` times in a row (head j of the
    result is head j // group of x). The head axis is the second last, so [B, T, H, K] and step's
    [B, H, K] both work."""
    if group == 1:
        return x
    return array_module(x).repeat(x, group, axis=-2)


def reduce(dx, group: int):
    """The backward of `expand`: [..., H * group, K] -> [..., H, K], summing each run of `group` heads."""
    if group == 1:
        return dx
    *lead, HV, K = dx.shape
    return dx.reshape(*lead, HV // group, group, K).sum(axis=-2)
