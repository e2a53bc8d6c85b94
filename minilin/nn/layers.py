"""The layers around the mixers, each with its forward and its hand-written backward.

Notation: x the input, y the output, dy = dL/dy the gradient arriving from above, dx = dL/dx the one
passed below; [N, d] means N rows (all batch and time positions flattened) of d features.

    Embedding   y = E[tokens]                          dE[tokens] += dy (rows of repeated tokens add up)
    Linear      y = x W + b                            dx = dy W^T,   dW = x^T dy,   db = sum(dy)
    RMSNorm     y = x / r * w,  r = sqrt(mean(x^2) + eps)
                                                       dw = sum(dy * x / r)
                                                       dx = (w dy) / r - x (x . (w dy)) / (d r^3)
    ShortConv   y_t = sum_{i < L} c_i * x_{t - L + 1 + i}  (depthwise, causal: x_{<0} = 0 or the carried past)
                                                       dc_i = sum_t dy_t * x_{t-L+1+i},  dx_s = sum_i c_i dy_{s+L-1-i}
    SwiGLU      y = (silu(x W_gate) * (x W_up)) W_down,   silu(a) = a sigmoid(a)
                                                       d silu(a) / da = s + a s (1 - s),  s = sigmoid(a)
"""
from __future__ import annotations

import numpy as np

from .module import Module


class Embedding(Module):
    """Token embeddings E [vocab, d]: tokens [B, T] (integers) -> [B, T, d]."""

    def __init__(self, vocab: int, d: int, rng, dtype=np.float32):
        super().__init__()
        self.weight = self.add_param("weight", (rng.standard_normal((vocab, d)) * d ** -0.5).astype(dtype))

    def forward(self, tokens):
        """tokens: integers in [0, vocab); a negative id would index from the end (-1 read as the last token) and one
        past vocab raise NumPy's IndexError, so both are refused, naming tokens."""
        tokens = np.asarray(tokens)
        vocab = self.weight.shape[0]
        if tokens.dtype.kind not in "iu":
            raise TypeError(f"tokens: expected integer token ids, got {tokens.dtype}")
        if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab):
            raise ValueError(f"tokens: expected ids in [0, {vocab}) (the vocabulary), got min {int(tokens.min())}, "
                             f"max {int(tokens.max())}")
        return self.weight[tokens], tokens

    def backward(self, tokens, dy):
        """dE[v] = sum of dy over the positions holding token v (np.add.at adds repeated rows up)."""
        np.add.at(self.grads["weight"], tokens.reshape(-1), dy.reshape(-1, dy.shape[-1]))


class Linear(Module):
    """y = x W (+ b), W [d_in, d_out] drawn N(0, scale^2 / d_in); the bias, where there is one, starts at `bias`."""

    def __init__(self, d_in: int, d_out: int, rng, dtype=np.float32, scale: float = 1.0, bias: float | None = None):
        super().__init__()
        self.weight = self.add_param("weight", (rng.standard_normal((d_in, d_out)) * scale * d_in ** -0.5).astype(dtype))
        self.bias = None if bias is None else self.add_param("bias", np.full(d_out, bias, dtype))

    def forward(self, x):
        y = x @ self.weight
        return (y if self.bias is None else y + self.bias), x

    def backward(self, x, dy):
        """dW = x^T dy summed over every leading position, db = sum of dy, dx = dy W^T."""
        flat_dy = dy.reshape(-1, dy.shape[-1])
        self.grads["weight"] += x.reshape(-1, x.shape[-1]).T @ flat_dy
        if self.bias is not None:
            self.grads["bias"] += flat_dy.sum(0)
        return dy @ self.weight.T


class RMSNorm(Module):
    """y = x / sqrt(mean(x^2) + eps) * w over the last axis (Zhang & Sennrich 2019); w starts at 1."""

    def __init__(self, d: int, dtype=np.float32, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = self.add_param("weight", np.ones(d, dtype))

    def forward(self, x):
        inv_r = 1.0 / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps)   # 1 / r
        x_hat = x * inv_r
        return x_hat * self.weight, (x_hat, inv_r)

    def backward(self, ctx, dy):
        """With x_hat = x / r and g = w dy: dw = sum(dy x_hat); dx = (g - x_hat mean(g x_hat)) / r, since
        dr/dx = x / (d r) makes the second term of d(x / r) equal to -x (x . g) / (d r^3)."""
        x_hat, inv_r = ctx
        self.grads["weight"] += (dy * x_hat).reshape(-1, x_hat.shape[-1]).sum(0)
        g = dy * self.weight
        return (g - x_hat * (g * x_hat).mean(-1, keepdims=True)) * inv_r


class ShortConv(Module):
    """A depthwise causal convolution of width L over time (the short convolution that Mamba's block and
    FLA's layers put before their mixers): y_t = sum_{i < L} c_i * x_{t - L + 1 + i}, c [L, d].

    It gives every position a view of the few tokens before it (a key next to its value, say), which a
    mixer alone finds only slowly. Starts as the identity (c_{L-1} = 1, the rest 0). `past` [B, L - 1, d]
    holds the inputs before x (zeros at the start of a sequence), so decoding token by token equals one pass.
    """

    def __init__(self, d: int, width: int = 4, dtype=np.float32):
        super().__init__()
        self.width = width
        weight = np.zeros((width, d), dtype)
        weight[-1] = 1
        self.weight = self.add_param("weight", weight)

    def forward(self, x, past=None):
        """x [B, T, d] -> (y [B, T, d], ctx); the new past is ctx's padded input's last L - 1 rows."""
        B, T, d = x.shape
        L = self.width
        if past is None:
            past = np.zeros((B, L - 1, d), x.dtype)
        padded = np.concatenate([past, x], axis=1)                      # [B, T + L - 1, d]
        y = sum(padded[:, i:i + T] * self.weight[i] for i in range(L))
        return y, padded

    @staticmethod
    def carried(padded, width: int):
        """The inputs a next call needs before its own: the last width - 1 of `padded`."""
        return padded[:, padded.shape[1] - (width - 1):].copy()

    def backward(self, padded, dy):
        """dc_i = sum_{b, t} dy_t * padded_{t + i};  d padded_{s} = sum_i c_i dy_{s - i}; dx drops the past."""
        T, L = dy.shape[1], self.width
        d_padded = np.zeros_like(padded)
        for i in range(L):
            self.grads["weight"][i] += (dy * padded[:, i:i + T]).sum((0, 1))
            d_padded[:, i:i + T] += dy * self.weight[i]
        return d_padded[:, L - 1:]


def _sigmoid(a):
    """1 / (1 + e^-a) = (1 + tanh(a / 2)) / 2: no overflow for any a, and one tanh is cheaper than exp of a
    logaddexp on the MLP's [B, T, hidden] activations."""
    return 0.5 + 0.5 * np.tanh(0.5 * a)


class SwiGLU(Module):
    """The MLP of LLaMA-style blocks (Shazeer 2020): y = (silu(x W_gate) * (x W_up)) W_down."""

    def __init__(self, d: int, hidden: int, rng, dtype=np.float32):
        super().__init__()
        self.children = {"gate": Linear(d, hidden, rng, dtype), "up": Linear(d, hidden, rng, dtype),
                         "down": Linear(hidden, d, rng, dtype)}

    def forward(self, x):
        gate, up, down = (self.children[n] for n in ("gate", "up", "down"))
        a, ctx_gate = gate.forward(x)
        u, ctx_up = up.forward(x)
        s = _sigmoid(a)
        h = a * s * u                                                   # silu(a) * u
        y, ctx_down = down.forward(h)
        return y, (a, s, u, ctx_gate, ctx_up, ctx_down)

    def backward(self, ctx, dy):
        """dh = dy W_down^T; du = dh silu(a); da = dh u (s + a s (1 - s)); dx = da W_gate^T + du W_up^T."""
        a, s, u, ctx_gate, ctx_up, ctx_down = ctx
        dh = self.children["down"].backward(ctx_down, dy)
        du = dh * a * s
        da = dh * u * (s + a * s * (1 - s))
        return self.children["gate"].backward(ctx_gate, da) + self.children["up"].backward(ctx_up, du)
