"""Check for exercise 15 (you do not need to edit this file): the stack against minilin.hybrid.HybridStack
(same seeded weights, float64), and the cache bytes against minilin.cache and the caches the stack
actually returns."""
import numpy as np

from minilin import cache as accounting
from minilin import hybrid
from minilin.course.checks import assert_close, assert_equal, fail, unpack


def _plain_layers(stack):
    """The stack's weights as the dicts hybrid_prefill takes: W_<input> for each projection."""
    layers = []
    for layer in stack.layers:
        plain = {"mixer": layer.mixer, "norm": layer.norm.copy(), "W_o": layer.out.copy()}
        plain.update({f"W_{name}": W.copy() for name, W in layer.weights.items()})
        layers.append(plain)
    return layers


def test_hybrid_pattern(learner):
    for n, r in [(8, 4), (48, 8), (3, 1), (5, 7), (1, 1), (12, 3)]:
        assert_equal(f"hybrid_pattern({n}, {r})", learner.hybrid_pattern(n, r),
                     "".join("A" if (i + 1) % r == 0 else "L" for i in range(n)))


def test_layer_cache_bytes(learner):
    for heads, head_dim in [(1, 1), (4, 16), (32, 128)]:
        for tokens in (0, 1, 4096, 1 << 20):
            for b in (2, 4):
                kw = dict(heads=heads, head_dim=head_dim, bytes_per_element=b)
                where = f"(tokens={tokens}, heads={heads}, head_dim={head_dim}, bytes_per_element={b})"
                assert_equal(f'layer_cache_bytes("A", ...) {where}', learner.layer_cache_bytes("A", tokens, **kw),
                             accounting.MHA(heads, head_dim).bytes(tokens, bytes_per_element=b))
                assert_equal(f'layer_cache_bytes("L", ...) {where}', learner.layer_cache_bytes("L", tokens, **kw),
                             accounting.FixedState("gated_deltanet", heads, head_dim, head_dim).bytes(
                                 tokens, bytes_per_element=b))


def test_rms_norm(learner):
    rng = np.random.default_rng(15)
    x, w = 3 * rng.standard_normal((2, 5, 16)), 1 + 0.1 * rng.standard_normal(16)
    assert_close("rms_norm(x, weight), x [2, 5, 16]", learner.rms_norm(x, w), hybrid.rms_norm(x, w), dims="B T D")


def test_hybrid_prefill(learner):
    for seed, (pattern, B, T, C) in enumerate([("LLA", 2, 37, 16), ("A", 1, 1, 16), ("LLLALLLA", 1, 20, 8)]):
        stack = hybrid.HybridStack.from_pattern(pattern, d_model=16, heads=2, mixer="gated_deltanet", seed=seed)
        x = np.random.default_rng(seed + 150).standard_normal((B, T, 16))
        expected_y, expected_cache = stack.prefill(x, chunk_size=C)
        y, cache = unpack("hybrid_prefill(...)", learner.hybrid_prefill(x.copy(), _plain_layers(stack),
                                                                        stack.final_norm.copy(), heads=2,
                                                                        chunk_size=C), 2, "(y, cache)")
        where = f"[pattern {pattern!r}, B={B}, T={T}, d=16, H=2, chunk_size={C}]"
        assert_close(f"hybrid_prefill: y {where}", y, expected_y, dims="B T D")
        if not isinstance(cache, (list, tuple)) or len(cache) != len(pattern):
            fail(f"hybrid_prefill: expected a cache with one entry per layer ({len(pattern)}), got "
                 f"{type(cache).__name__}{f' of {len(cache)}' if isinstance(cache, (list, tuple)) else ''}")
        for i, (kind, got, expected) in enumerate(zip(pattern, cache, expected_cache)):
            if kind == "A":
                k, v = unpack(f"hybrid_prefill: cache[{i}] (softmax layer)", got, 2, "(k, v), the KV cache")
                assert_close(f"hybrid_prefill: cache[{i}].k {where}", k, expected.k, dims="B T H K")
                assert_close(f"hybrid_prefill: cache[{i}].v {where}", v, expected.v, dims="B T H V")
            else:
                assert_close(f"hybrid_prefill: cache[{i}], the Gated DeltaNet state {where}", got, expected,
                             dims="B H K V")
        if B == 1:  # the formula is what the arrays hold: float64 is 8 bytes
            measured = hybrid.cache_nbytes(expected_cache)
            formula = [learner.layer_cache_bytes(kind, T, heads=2, head_dim=8, bytes_per_element=8) for kind in pattern]
            assert_equal(f"layer_cache_bytes for each layer of {pattern!r} at T={T}, float64, vs the bytes the "
                         "stack's cache holds", formula, measured)
