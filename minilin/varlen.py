"""Variable-length batches: N sequences of different lengths packed end to end along T, with B = 1.

    cu_seqlens = [0, T_0, T_0 + T_1, ..., T]          int32 or int64, [N + 1], strictly increasing
    sequence n = tokens cu_seqlens[n] : cu_seqlens[n + 1]
    initial_state, final state [N, H, K, V]           one per sequence

The layout of FLA's `cu_seqlens` (the cumulative sequence lengths): training on documents of different
lengths without padding them to one length. Nothing flows between sequences: each starts from its own
initial state (zeros when None) and ends in its own final state. That is the definition, and the NumPy
reference computes it literally, by a loop over the sequences that calls the same form on each slice
(`forward`, `backward`), so a packed call equals N separate calls by construction: the definition a
kernel for packed sequences, which cannot afford the loop, is to be checked against (`minilin.cuda`'s
versions marked `packed` take the offsets in the kernel; for the others, and for its backward, it runs the
same loop, one launch per sequence).
"""
from __future__ import annotations

import numpy as np

from .backend import array_module, is_cupy_array


def check_cu_seqlens(cu_seqlens, B: int, T: int) -> tuple:
    """The offsets as a tuple of Python ints, checked: a 1-D integer array (NumPy or CuPy) [N + 1] with
    0 = cu[0] < cu[1] < ... < cu[N] = T, and B = 1. Each message names cu_seqlens, what was expected and
    what was given."""
    if not (isinstance(cu_seqlens, np.ndarray) or is_cupy_array(cu_seqlens)):
        raise TypeError(f"cu_seqlens: expected a 1-D integer array (int32 or int64) [N + 1], got "
                        f"{type(cu_seqlens).__name__}")
    if cu_seqlens.dtype not in (np.int32, np.int64):  # FLA's and the kernels' offsets: no narrower or unsigned ones
        raise TypeError(f"cu_seqlens: expected an integer array (int32 or int64), got {cu_seqlens.dtype}")
    if cu_seqlens.ndim != 1 or cu_seqlens.shape[0] < 2:
        raise ValueError(f"cu_seqlens: expected a 1-D array [N + 1] with N >= 1 sequences, got shape "
                         f"{[int(s) for s in cu_seqlens.shape]}")
    if B != 1:
        raise ValueError(f"cu_seqlens: expected B = 1 (the sequences packed along T), got B = {B}")
    cu = tuple(int(c) for c in cu_seqlens.tolist())
    if cu[0] != 0:
        raise ValueError(f"cu_seqlens: expected cu_seqlens[0] = 0, got {cu[0]}")
    if cu[-1] != T:
        raise ValueError(f"cu_seqlens: expected cu_seqlens[-1] = T = {T} (every token in one sequence), "
                         f"got {cu[-1]}")
    for n in range(len(cu) - 1):
        if cu[n + 1] <= cu[n]:
            raise ValueError(f"cu_seqlens: expected strictly increasing offsets (every sequence at least one "
                             f"token), got cu_seqlens[{n}] = {cu[n]}, cu_seqlens[{n + 1}] = {cu[n + 1]}")
    return cu


def chunked(run, chunk_size):
    """`run(*arrays, chunk_size)` with the chunk clamped to the length of the arrays it is given, as a call
    on one sequence alone clamps it (`validation.check_chunk_size`): a chunked form or backward to pass to
    `forward` / `backward`. chunk_size None (a form without chunks): run(*arrays, None)."""
    if chunk_size is None:
        return lambda *arrays: run(*arrays, None)
    return lambda *arrays: run(*arrays, min(chunk_size, arrays[0].shape[1]))


def _tokens(arrays, tokens):
    """Each per-token array [1, T, ...] cut to one sequence's tokens (None kept: an absent gate)."""
    return tuple(None if x is None else x[:, tokens] for x in arrays)


def _state_of(state, n):
    """Sequence n's state [1, ...] out of [N, ...], or None."""
    return None if state is None else state[n:n + 1]


def _joined(parts, axis):
    """The per-sequence pieces joined along `axis` (None when every piece is None)."""
    if parts[0] is None:
        return None
    return array_module(*parts).concatenate(parts, axis=axis)


def forward(run, arrays, state, cu_seqlens):
    """(o, final_state) of `run(*arrays, state)` for each sequence alone.

    run: a form on checked arrays, e.g. `_gated_linear.recurrent`: (*arrays [1, T_n, ...], state [1, ...]
    or None) -> (o [1, T_n, ...], final_state [1, ...]). arrays: the per-token inputs [1, T, ...]; state:
    [N, ...] or None; cu_seqlens: the checked offsets, or None for one ordinary call. Returns o [1, T, ...]
    (the outputs in the packed order) and the final states [N, ...].
    """
    if cu_seqlens is None:
        return run(*arrays, state)
    outputs, states = [], []
    for n, (start, end) in enumerate(zip(cu_seqlens[:-1], cu_seqlens[1:])):
        o, S = run(*_tokens(arrays, slice(start, end)), _state_of(state, n))
        outputs.append(o)
        states.append(S)
    return _joined(outputs, 1), _joined(states, 0)


def backward(run, arrays, state, do, dstate, cu_seqlens):
    """The gradients of `run(*arrays, state, do, dstate)` for each sequence alone, joined.

    run: a backward on checked arrays, e.g. `_delta_rule.recurrent_backward`, returning one gradient per
    array (per token, [1, T_n, ...], or None) and last the initial state's ([1, ...] or None). do [1, T, ...];
    dstate [N, ...] or None. Returns the per-token gradients joined along T and dinitial_state [N, ...]:
    sequence n's loss <do_n, o_n> + <dstate_n, S_n> depends only on its own tokens and initial state, so
    each gradient is that sequence's own.
    """
    if cu_seqlens is None:
        return run(*arrays, state, do, dstate)
    pieces = []
    for n, (start, end) in enumerate(zip(cu_seqlens[:-1], cu_seqlens[1:])):
        tokens = slice(start, end)
        pieces.append(run(*_tokens(arrays, tokens), _state_of(state, n), do[:, tokens],
                          _state_of(dstate, n)))
    per_token = [_joined([p[i] for p in pieces], 1) for i in range(len(pieces[0]) - 1)]
    return (*per_token, _joined([p[-1] for p in pieces], 0))
