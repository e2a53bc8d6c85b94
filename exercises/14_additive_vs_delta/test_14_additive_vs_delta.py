"""Check for exercise 14 (you do not need to edit this file). The three memories are minilin's own mixers
run over the pairs as a sequence (B = H = 1): minilin.mixers.linear_attention (scale 1) and
minilin.mixers.deltanet (beta per token) give the final states, read with the queries;
minilin.mixers.attention reads the KV cache of all pairs. Compared in float64, also at a sharpness of 1000,
where exp of the scores overflows unless each row's max is subtracted first."""
import numpy as np

from minilin import examples
from minilin.course.checks import assert_close, unpack
from minilin.mixers import attention, deltanet, linear_attention


def overwrite(seed=0, d=16, n=12, d_v=8):
    """Experiment 1: key 2 is written again at t = 9 with a new value. Queries: that key, and key 5."""
    rng = examples.generator(seed)
    keys = examples.unit_vectors(rng, (n, d))
    keys[9] = keys[2]
    values = examples.normal(rng, (n, d_v))
    return keys, values, keys[[2, 5]], values[[9, 5]]


def far_key(seed=0, d=16, n=48, d_v=8):
    """Experiment 2: 48 pairs in 16 dimensions. Queries: the first key written, and the last."""
    rng = examples.generator(seed)
    keys = examples.unit_vectors(rng, (n, d))
    values = examples.normal(rng, (n, d_v))
    return keys, values, keys[[0, n - 1]], values[[0, n - 1]]


def single(seed=0, d=4, d_v=3):
    rng = examples.generator(seed)
    keys = examples.unit_vectors(rng, (1, d))
    values = examples.normal(rng, (1, d_v))
    return keys, values, examples.unit_vectors(rng, (2, d)), values[[0, 0]]


def reference_reads(keys, values, queries, beta, sharpness):
    seq = lambda x: x[None, :, None]                      # [n, .] -> [1, n, 1, .]: one sequence, one head
    _, S_add = linear_attention.recurrent(seq(keys), seq(keys), seq(values), scale=1.0)
    betas = np.full((1, len(keys), 1), beta)
    _, S_delta = deltanet.recurrent(seq(keys), seq(keys), seq(values), betas, scale=1.0)
    m, n = len(queries), len(keys)
    # Softmax: each query (one per batch row) reads the cache of all n pairs.
    cache = attention.KVCache(np.broadcast_to(seq(keys)[:, :n - 1], (m, n - 1, 1, keys.shape[1])),
                              np.broadcast_to(seq(values)[:, :n - 1], (m, n - 1, 1, values.shape[1])))
    last_k = np.broadcast_to(keys[-1], (m, 1, keys.shape[1]))
    last_v = np.broadcast_to(values[-1], (m, 1, values.shape[1]))
    soft, _ = attention.step(queries[:, None], last_k, last_v, state=cache if n > 1 else None, scale=sharpness)
    return queries @ S_add[0, 0], queries @ S_delta[0, 0], soft[:, 0]


SCENARIOS = [("overwrite", overwrite), ("far key", far_key), ("one pair", single)]


def test_memory_reads(learner):
    for seed, (name, make) in enumerate(SCENARIOS):
        keys, values, queries, _ = make(seed=seed + 220)
        for beta, sharpness in [(1.0, 8.0), (0.5, 3.0), (0.8, 1000.0)]:  # 1000: exp(scores) overflows
            expected = reference_reads(keys, values, queries, beta, sharpness)
            with np.errstate(over="ignore", invalid="ignore"):
                got = unpack("memory_reads(...)", learner.memory_reads(keys, values, queries, beta=beta,
                                                                       sharpness=sharpness), 3,
                             "(additive, delta, softmax)")
            for memory, g, e in zip(("additive", "delta", "softmax"), got, expected):
                assert_close(f"memory_reads: the {memory} read [{name}: n={len(keys)}, d={keys.shape[1]}, "
                             f"beta={beta}, sharpness={sharpness}]", g, e, dims="M V")


def test_recall_errors(learner):
    for seed, (name, make) in enumerate(SCENARIOS):
        keys, values, queries, targets = make(seed=seed + 230)
        for memory, reads in zip(("additive", "delta", "softmax"), reference_reads(keys, values, queries, 1.0, 8.0)):
            expected = np.linalg.norm(reads - targets, axis=1) / np.linalg.norm(targets, axis=1)
            assert_close(f"recall_errors of the {memory} reads [{name}]", learner.recall_errors(reads, targets),
                         expected, dims="M")
