"""A small causal language model: embeddings, residual blocks of a mixer layer and an MLP, a final norm
and the logits.

    x = E[tokens]                                          [B, T, d]
    for each block:  x = x + MixerLayer(x)                 (any causal minilin mixer, `mixer_layer`)
                     x = x + SwiGLU(RMSNorm(x))
    logits = RMSNorm(x) W_head                             [B, T, vocab]

`mixers` names one mixer per block, so a hybrid is a list such as ["gated_deltanet", "attention"] (one
softmax layer in two) or `hybrid_pattern("gated_deltanet", 4, every=4)`. `loss_and_grads` runs forward,
the cross-entropy and the whole backward by hand, leaving every parameter's gradient in `grads`.
`prefill` / `step` decode: the chunked forms over a prompt, then the step forms one token at a time, equal
to a full forward pass (tests/test_nn.py).
"""
from __future__ import annotations

import numpy as np

from ..hybrid import supported_mixers
from ..validation import check_count
from .layers import Embedding, Linear, RMSNorm, SwiGLU
from .loss import cross_entropy
from .mixer_layer import MixerLayer
from .module import Module


class Block(Module):
    """x + MixerLayer(x), then + SwiGLU(RMSNorm(x))."""

    def __init__(self, mixer: str, d_model: int, heads: int, rng, *, mlp_ratio: int, window, chunk_size, dtype):
        super().__init__()
        self.children = {"mixer": MixerLayer(mixer, d_model, heads, d_model // heads, rng, window=window,
                                             chunk_size=chunk_size, dtype=dtype),
                         "mlp_norm": RMSNorm(d_model, dtype), "mlp": SwiGLU(d_model, mlp_ratio * d_model, rng, dtype)}

    def forward(self, x):
        update, ctx_mixer = self.children["mixer"].forward(x)
        x = x + update
        h, ctx_norm = self.children["mlp_norm"].forward(x)
        update, ctx_mlp = self.children["mlp"].forward(h)
        return x + update, (ctx_mixer, ctx_norm, ctx_mlp)

    def backward(self, ctx, dy):
        """Residuals pass dy through unchanged and add each branch's gradient."""
        ctx_mixer, ctx_norm, ctx_mlp = ctx
        dx = dy + self.children["mlp_norm"].backward(ctx_norm, self.children["mlp"].backward(ctx_mlp, dy))
        return dx + self.children["mixer"].backward(ctx_mixer, dx)

    def _mlp(self, x):
        return x + self.children["mlp"].forward(self.children["mlp_norm"].forward(x)[0])[0]

    def prefill(self, x, state):
        update, state = self.children["mixer"].prefill(x, state)
        return self._mlp(x + update), state

    def step(self, x_t, state):
        update, state = self.children["mixer"].step(x_t, state)
        return self._mlp(x_t[:, None] + update[:, None])[:, 0], state


def hybrid_pattern(mixer: str, layers: int, every: int = 0, softmax: str = "attention") -> list[str]:
    """`layers` blocks of `mixer`, with every `every`-th one softmax attention (0: none), counted so that
    the last block is the softmax one, as Jamba-style hybrids place it."""
    return [softmax if every and (i + 1) % every == 0 else mixer for i in range(layers)]


class LanguageModel(Module):
    def __init__(self, mixers, *, vocab: int, d_model: int, heads: int, mlp_ratio: int = 2, window: int | None = None,
                 chunk_size: int = 64, seed: int = 0, dtype=np.float32):
        super().__init__()
        vocab, d_model, heads = check_count("vocab", vocab), check_count("d_model", d_model), check_count("heads", heads)
        if d_model % heads:  # the heads split d_model: 9 over 2 ran with an inner width of 8
            raise ValueError(f"d_model: expected a multiple of heads = {heads}, got {d_model}")
        known = supported_mixers()
        if isinstance(mixers, str) or not list(mixers) or any(m not in known for m in mixers):
            raise ValueError(f"mixers: expected a non-empty list of names from {known}, got {mixers!r}")
        rng = np.random.default_rng(seed)
        self.mixers, self.vocab, self.d_model, self.heads = list(mixers), vocab, d_model, heads
        self.children = {"embed": Embedding(vocab, d_model, rng, dtype)}
        for i, mixer in enumerate(self.mixers):
            self.children[f"blocks.{i}"] = Block(mixer, d_model, heads, rng, mlp_ratio=mlp_ratio, window=window,
                                                 chunk_size=chunk_size, dtype=dtype)
        self.children["final_norm"] = RMSNorm(d_model, dtype)
        self.children["head"] = Linear(d_model, vocab, rng, dtype)

    @property
    def blocks(self) -> list:
        return [self.children[f"blocks.{i}"] for i in range(len(self.mixers))]

    def forward(self, tokens):
        """tokens [B, T] -> (logits [B, T, vocab], ctx)."""
        x, ctx_embed = self.children["embed"].forward(tokens)
        ctx_blocks = []
        for block in self.blocks:
            x, ctx = block.forward(x)
            ctx_blocks.append(ctx)
        h, ctx_norm = self.children["final_norm"].forward(x)
        logits, ctx_head = self.children["head"].forward(h)
        return logits, (ctx_embed, ctx_blocks, ctx_norm, ctx_head)

    def backward(self, ctx, dlogits) -> None:
        ctx_embed, ctx_blocks, ctx_norm, ctx_head = ctx
        dx = self.children["final_norm"].backward(ctx_norm, self.children["head"].backward(ctx_head, dlogits))
        for block, ctx_block in zip(reversed(self.blocks), reversed(ctx_blocks)):
            dx = block.backward(ctx_block, dx)
        self.children["embed"].backward(ctx_embed, dx)

    def loss_and_grads(self, tokens, targets):
        """Forward, cross-entropy at the positions with a target, backward. Returns (loss, logits); the
        gradients are added into `grads` (call zero_grad first)."""
        logits, ctx = self.forward(tokens)
        loss, dlogits, _ = cross_entropy(logits, targets)
        self.backward(ctx, dlogits)
        return loss, logits

    # --- decoding ----------------------------------------------------------------------------------------
    def prefill(self, tokens, states=None):
        """tokens [B, T] -> (logits [B, T, vocab], per-block states), the chunked forms from `states`."""
        x = self.children["embed"].forward(tokens)[0]
        states = [None] * len(self.mixers) if states is None else list(states)
        for i, block in enumerate(self.blocks):
            x, states[i] = block.prefill(x, states[i])
        return self._logits(x), states

    def step(self, token, states):
        """One token per sequence, token [B] -> (logits [B, vocab], states), the step forms."""
        x = self.children["embed"].forward(token)[0]
        states = list(states)
        for i, block in enumerate(self.blocks):
            x, states[i] = block.step(x, states[i])
        return self._logits(x), states

    def _logits(self, x):
        return self.children["head"].forward(self.children["final_norm"].forward(x)[0])[0]
