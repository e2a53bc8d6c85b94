"""Multi-query associative recall (MQAR: Arora et al. 2023, "Zoology: Measuring and Improving Recall in
Efficient Language Models"), the task on which the recall of a fixed-size state is measured.

An example of length L with D key-value pairs:

    k_1 v_1 k_2 v_2 ... k_D v_D   0 0 k_3 0 k_1 0 0 0 k_D ...   0
    |------ the context: 2D tokens ------|--- queries: each key once, at random positions ---|

Keys are drawn without repetition from [1, vocab / 2), values (with repetition) from [vocab / 2, vocab);
token 0 is a blank. At each query position the target is the value that followed that key in the context;
every other position has no target (IGNORE), so the loss and the accuracy count the D queries alone. A model
must store all D pairs while reading the context and look each one up later: softmax attention keeps every
token and can; a recurrent state of fixed size holds only so many pairs. (Zoology places the queries with
power-law gaps; here they are uniform over the query section, and the blanks are 0.)

Batches are a pure function of (seed, batch index): `batch(config, index, size, seed)` always returns the
same examples, so a resumed run sees exactly the data it would have seen, and the held-out set (a stream
of its own) never meets the training stream.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..nn.loss import IGNORE
from ..validation import check_count

HELD_OUT_STREAM = 2**31 - 1  # the batch index stream of the held-out examples, apart from any training index


@dataclass(frozen=True)
class MQAR:
    """vocab: token ids 0 .. vocab - 1 (0 a blank, keys below vocab / 2, values from vocab / 2);
    seq_len: L tokens per example; num_kv_pairs: D pairs in the context, each queried once."""

    vocab: int = 64
    seq_len: int = 64
    num_kv_pairs: int = 8

    def __post_init__(self):
        vocab, L, D = (check_count(name, getattr(self, name)) for name in ("vocab", "seq_len", "num_kv_pairs"))
        if D > vocab // 2 - 1:
            raise ValueError(f"num_kv_pairs: expected at most vocab / 2 - 1 = {vocab // 2 - 1} (distinct keys are "
                             f"drawn from 1 .. vocab / 2 - 1), got {D} with vocab = {vocab}")
        if L < 3 * D:
            raise ValueError(f"seq_len: expected at least 3 * num_kv_pairs = {3 * D} (2 D context tokens and D "
                             f"query positions), got {L}")


def batch(task: MQAR, index: int, size: int, seed: int = 0):
    """Examples number `index` of the stream `seed`: (tokens [size, L] int64, targets [size, L] int64)."""
    rng = np.random.default_rng([seed, index])
    L, D, half = task.seq_len, task.num_kv_pairs, task.vocab // 2
    rows = np.arange(size)[:, None]
    keys = np.argsort(rng.random((size, half - 1)), axis=1)[:, :D] + 1           # distinct, from 1 .. half - 1
    values = rng.integers(half, task.vocab, (size, D))
    tokens = np.zeros((size, L), np.int64)
    targets = np.full((size, L), IGNORE, np.int64)
    tokens[:, 0:2 * D:2], tokens[:, 1:2 * D:2] = keys, values
    positions = np.sort(np.argsort(rng.random((size, L - 2 * D)), axis=1)[:, :D], axis=1) + 2 * D
    order = np.argsort(rng.random((size, D)), axis=1)                             # which pair each query asks
    tokens[rows, positions] = keys[rows, order]
    targets[rows, positions] = values[rows, order]
    return tokens, targets


def held_out(task: MQAR, size: int, seed: int = 0):
    """The evaluation examples: a stream the training batches never draw from."""
    return batch(task, HELD_OUT_STREAM, size, seed)
