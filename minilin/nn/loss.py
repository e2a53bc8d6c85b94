"""Softmax cross-entropy over the positions that have a target.

    p = softmax(z),  L = -(1/n) sum_{counted positions} log p[target]
    dL/dz = (p - onehot(target)) / n   at counted positions, 0 elsewhere

z: logits [B, T, vocab]; targets [B, T] integers, IGNORE (-100) where nothing is predicted (in MQAR every
position but the queries); n = the number of counted positions. log p is computed as z - logsumexp(z),
shifted by the row max, so no exp overflows.
"""
from __future__ import annotations

import numpy as np

from ..validation import all_finite

IGNORE = -100


def cross_entropy(logits, targets):
    """Returns (mean loss, dL/dlogits [B, T, vocab], number of counted positions). targets: integers in [0, vocab) or
    IGNORE, of logits' leading shape (a negative target would pick from the end); logits finite."""
    targets = np.asarray(targets)
    vocab = logits.shape[-1]
    if targets.dtype.kind not in "iu":
        raise TypeError(f"targets: expected integer class ids, got {targets.dtype}")
    if targets.shape != logits.shape[:-1]:
        raise ValueError(f"targets: expected shape {list(logits.shape[:-1])} (the logits' without vocab), got "
                         f"{list(targets.shape)}")
    outside = (targets != IGNORE) & ((targets < 0) | (targets >= vocab))
    if outside.any():
        raise ValueError(f"targets: expected ids in [0, {vocab}) or IGNORE = {IGNORE}, got {int(targets[outside][0])}")
    if not all_finite(logits, np):  # one BLAS dot, no boolean array: this runs every training step
        raise ValueError("logits: expected finite values, got NaN or inf")
    counted = targets != IGNORE
    n = int(counted.sum())
    if n == 0:
        raise ValueError("targets: expected at least one position with a target (not IGNORE = -100), got none")
    shifted = logits - logits.max(-1, keepdims=True)
    log_z = np.log(np.exp(shifted).sum(-1, keepdims=True))
    log_p = shifted - log_z                                          # [B, T, vocab]
    safe = np.where(counted, targets, 0)
    picked = np.take_along_axis(log_p, safe[..., None], axis=-1)[..., 0]
    loss = -float(picked[counted].sum()) / n
    grad = np.exp(log_p)
    np.put_along_axis(grad, safe[..., None], np.take_along_axis(grad, safe[..., None], -1) - 1, axis=-1)
    grad *= counted[..., None] / n
    return loss, grad.astype(logits.dtype, copy=False), n


def accuracy(logits, targets) -> float:
    """The fraction of counted positions whose largest logit is the target."""
    counted = targets != IGNORE
    return float((logits.argmax(-1) == targets)[counted].mean())
