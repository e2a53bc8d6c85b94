"""minilin.nn: every layer's hand-written backward against central finite differences in float64, the whole
model's too (at a tiny size, for several mixers and a hybrid), decoding equal to a full forward pass, and
checkpoints that restore a model exactly."""
from __future__ import annotations

import re

import numpy as np
import pytest

from minilin import nn
from minilin.nn import IGNORE
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


MODEL_MIXERS = [["attention", "attention"], ["linear_attention"], ["gated_deltanet", "attention"], ["mamba2"],
                ["rwkv7"], ["sliding_window"], ["kda"], ["s4"], ["rwkv6"], ["hgrn"]]


@pytest.mark.parametrize("mixers", MODEL_MIXERS, ids=lambda m: "+".join(m))
def test_whole_model_gradient_matches_finite_differences(mixers):
    """The loss of a tiny float64 model, through embedding, blocks (norms, convolution, projections,
    activations, the mixer's own backward, MLP), final norm and head: every parameter's gradient against
    central finite differences along a random direction."""
    model = nn.LanguageModel(mixers, vocab=11, d_model=8, heads=2, window=3, chunk_size=4, seed=3, dtype=np.float64)
    rng = np.random.default_rng(4)
    tokens = rng.integers(0, 11, (2, 7))
    targets = rng.integers(0, 11, (2, 7))
    targets[:, :2] = nn.IGNORE
    model.zero_grad()
    model.loss_and_grads(tokens, targets)
    params = list(model.named_params())
    directions = [rng.standard_normal(p.shape) for _, p, _ in params]
    got = sum(float((g * d).sum()) for (_, _, g), d in zip(params, directions))
    originals = [p.copy() for _, p, _ in params]

    def loss_at(sign):
        for (_, p, _), p0, d in zip(params, originals, directions):
            p[...] = p0 + sign * EPS * d
        return nn.cross_entropy(model.forward(tokens)[0], targets)[0]

    expected = (loss_at(+1) - loss_at(-1)) / (2 * EPS)
    for (_, p, _), p0 in zip(params, originals):
        p[...] = p0
    assert abs(got - expected) < 1e-6 * max(1.0, abs(expected)), f"{got!r} vs finite differences {expected!r}"
    # and each parameter alone, for the first block's mixer inputs (a wrong piece is named)
    for (name, p, g), d in zip(params, directions):
        if ".mixer." not in name:
            continue
        alone = directional_fd(lambda: nn.cross_entropy(model.forward(tokens)[0], targets)[0], p, d)
        assert abs(float((g * d).sum()) - alone) < 1e-6 * max(1.0, abs(alone)), f"d{name}"


@pytest.mark.parametrize("mixers", MODEL_MIXERS, ids=lambda m: "+".join(m))
def test_prefill_then_step_equals_a_full_forward(mixers):
    """Decode: the chunked forms over a prompt, then the step forms token by token, give the logits of one
    forward pass over the whole sequence (float64, 1e-10)."""
    model = nn.LanguageModel(mixers, vocab=13, d_model=8, heads=2, window=3, chunk_size=4, seed=5, dtype=np.float64)
    tokens = np.random.default_rng(6).integers(0, 13, (2, 11))
    full, _ = model.forward(tokens)
    logits, states = model.prefill(tokens[:, :6])
    steps = [logits]
    for t in range(6, 11):
        logits_t, states = model.step(tokens[:, t], states)
        steps.append(logits_t[:, None])
    decoded = np.concatenate(steps, axis=1)
    np.testing.assert_allclose(decoded, full, rtol=1e-10, atol=1e-10 * np.abs(full).max())


def test_checkpoint_state_dict_round_trip():
    a = nn.LanguageModel(["gated_deltanet"], vocab=9, d_model=8, heads=2, seed=1)
    b = nn.LanguageModel(["gated_deltanet"], vocab=9, d_model=8, heads=2, seed=2)
    b.load_state_dict(a.state_dict())
    tokens = np.arange(10).reshape(2, 5) % 9
    assert np.array_equal(a.forward(tokens)[0], b.forward(tokens)[0])
    with pytest.raises(ValueError, match="checkpoint: expected the parameters of this model"):
        nn.LanguageModel(["attention"], vocab=9, d_model=8, heads=2).load_state_dict(a.state_dict())


def test_signed_parameters_keep_their_sign_whatever_the_step():
    """Mamba's A <= 0 and S4's dt > 0 are trained through their logs: even huge AdamW steps stay valid."""
    for mixers in (["mamba2"], ["mamba"], ["s4"]):
        model = nn.LanguageModel(mixers, vocab=9, d_model=8, heads=2, seed=1)
        optimizer = nn.AdamW(model, lr=5.0)
        tokens = np.arange(12).reshape(2, 6) % 9
        for _ in range(3):
            model.zero_grad()
            model.loss_and_grads(tokens, tokens)
            optimizer.step()
        layer = model.blocks[0].children["mixer"]
        assert (layer._parameter("A") < 0).all()
        if mixers == ["s4"]:
            assert (layer._parameter("dt") > 0).all()


def test_token_ids_and_targets_outside_the_vocabulary_are_named():
    """-1 read the last token's row (and trained on the last class) without a word; past vocab NumPy's IndexError."""
    emb = nn.Embedding(9, 4, np.random.default_rng(0))
    with pytest.raises(ValueError, match=re.escape("tokens: expected ids in [0, 9) (the vocabulary), got min -1")):
        emb.forward(np.array([[-1, 2, 3]]))
    with pytest.raises(TypeError, match="tokens: expected integer token ids, got float64"):
        emb.forward(np.array([[1.0, 2.0]]))
    logits = np.random.default_rng(1).standard_normal((1, 3, 5))
    for targets, message in [(np.array([[-1, IGNORE, IGNORE]]), "targets: expected ids in [0, 5) or IGNORE = -100, "
                                                                 "got -1"),
                             (np.array([[5, 0, 1]]), "got 5"),
                             (np.array([[0, 1]]), "targets: expected shape [1, 3] (the logits' without vocab)")]:
        with pytest.raises(ValueError, match=re.escape(message)):
            nn.cross_entropy(logits, targets)
    logits[0, 1, 2] = np.nan
    with pytest.raises(ValueError, match="logits: expected finite values"):
        nn.cross_entropy(logits, np.array([[0, 1, 2]]))


def test_a_language_model_checks_its_sizes_and_mixers():
    for kwargs, error, message in [(dict(vocab=0), ValueError, "vocab: expected a positive integer, got 0"),
                                   (dict(heads=0), ValueError, "heads: expected a positive integer, got 0"),
                                   (dict(d_model=9), ValueError, "d_model: expected a multiple of heads = 2, got 9"),
                                   (dict(mixers=["nope"]), ValueError, "mixers: expected a non-empty list of names")]:
        options = dict(dict(mixers=["attention"], vocab=12, d_model=8, heads=2), **kwargs)
        with pytest.raises(error, match=re.escape(message)):
            nn.LanguageModel(options.pop("mixers"), **options)
