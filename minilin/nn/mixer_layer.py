"""A causal minilin mixer between projections, with the whole layer's hand-written backward.

    h   = ShortConv(RMSNorm(x))                           [B, T, d]
    z_n = h W_n  for each per-token input n of the mixer (q, k, v, gates, beta, dt, ...)
    a_n = act_n(z_n) reshaped to the mixer's dims         (log-sigmoid gates, sigmoid beta, softplus dt)
    o, state = mixer.chunked(a_1, a_2, ..., params, options)
    y   = o W_o                                           [B, T, d]

Which inputs a mixer takes, their dims, and which are per-layer parameters (Mamba's A, RWKV-6's u, S4's
dt, A, B, C) come from its SIGNATURE through `minilin.hybrid.layer_inputs`, so every causal mixer fits. A
parameter that must keep its sign is trained through its log, as Mamba trains A = -exp(A_log) (`SIGNED`):
an optimizer step can then never leave the valid range. The
backward runs the same chain in reverse: the mixer's own `chunked_backward` gives d a_n for every input
(its named tuple, CONVENTIONS.md), then each activation's backward, each projection's, the convolution's
and the norm's, summed into dx.

Decoding: `prefill` runs the chunked form and returns the layer's state (the short convolution's last
inputs and the mixer's state); `step` runs the mixer's step form on one token from that state.
"""
from __future__ import annotations

import numpy as np

from .. import activations, catalog, hybrid
from .layers import Linear, RMSNorm, ShortConv
from .module import Module

# Where a projection's bias starts, by its activation: gates start remembering (log-sigmoid(4) = -0.018, a
# decay of 0.982 per token; RWKV-7's -e^{-1/2} sigmoid(-4) = -0.011), as trained gated models initialize them
# (Mamba's dt and A, FLA's gate normalizers) rather than at decay 0.5. Projections with other activations
# have no bias.
GATE_BIAS = {activations.log_sigmoid: 4.0, activations.rwkv7_decay: -4.0, activations.sigmoid: 0.0,
             activations.step_size: 0.0}

# Parameters that must keep a sign are trained through an unconstrained value, as Mamba trains A = -exp(A_log):
# the layer stores the log, and LOG_MAPS holds (value -> log, log -> value); d value / d log is the value itself.
SIGNED = {
    ("mamba2", "A"): "negative", ("mamba", "A"): "negative", ("s4", "A"): "negative", ("s4", "dt"): "positive",
}
LOG_MAPS = {
    "negative": (lambda value: np.log(-value), lambda raw: -np.exp(raw)),   # A = -exp(raw) < 0, dA/draw = A
    "positive": (lambda value: np.log(value), lambda raw: np.exp(raw)),     # dt = exp(raw) > 0, d dt/draw = dt
}

# RWKV-7 derives a = -kappa and b = kappa * alpha from two hidden projections (minilin.hybrid.DERIVED); their
# backward: d kappa = -da + db * alpha, d alpha = db * kappa.
DERIVED_BACKWARD = {
    "rwkv7": lambda values, grads: {"kappa": -grads["a"] + grads["b"] * values["alpha"],
                                    "alpha": grads["b"] * values["kappa"]},
}


class MixerLayer(Module):
    """x [B, T, d] -> x's update [B, T, d]: norm, short convolution, projections, the mixer, output projection."""

    def __init__(self, mixer: str, d_model: int, heads: int, head_dim: int, rng, *, window: int | None = None,
                 chunk_size: int = 64, conv_width: int = 4, dtype=np.float32):
        super().__init__()
        self.mixer, self.heads, self.head_dim = mixer, heads, head_dim
        self.window, self.chunk_size = window, chunk_size
        self.sizes = {"H": heads, "K": head_dim, "V": head_dim, "D": heads * head_dim}
        self.sources = hybrid.layer_inputs(mixer)
        self.children = {"norm": RMSNorm(d_model, dtype), "conv": ShortConv(d_model, conv_width, dtype)}
        for name, kind, dims, source in self.sources:
            shape = tuple(self.sizes[letter] for letter in dims.split()) if dims else ()
            if kind == "projected":
                self.children[f"W_{name}"] = Linear(d_model, int(np.prod(shape)), rng, dtype, bias=GATE_BIAS.get(source))
            elif kind == "parameter":
                value = np.asarray(source(rng, shape), dtype=dtype)
                if (mixer, name) in SIGNED:  # stored as its log: name + "_log"
                    value = LOG_MAPS[SIGNED[mixer, name]][0](value).astype(dtype)
                    name = f"{name}_log"
                self.add_param(name, value)
        # The output projection starts small, so that each residual layer begins close to the identity.
        self.children["W_o"] = Linear(heads * head_dim, d_model, rng, dtype, scale=0.5)

    @property
    def module(self):
        """The mixer's module (minilin.mixers.<name>), looked up by name rather than kept, so that a layer, and
        a model, can be copied with copy.deepcopy (a module object cannot be)."""
        return catalog.module(self.mixer)

    def _parameter(self, name: str):
        """A parameter's value, mapped from its stored log where it must keep a sign (SIGNED)."""
        if (self.mixer, name) in SIGNED:
            return LOG_MAPS[SIGNED[self.mixer, name]][1](self.params[f"{name}_log"])
        return self.params[name]

    def options(self) -> dict:
        return hybrid.OPTIONS.get(self.mixer, lambda layer: {})(self)

    # --- the forward chain, shared by forward and prefill -------------------------------------------------
    def _inputs(self, x, conv_past=None):
        B, T = x.shape[:2]
        h, ctx_norm = self.children["norm"].forward(x)
        h, ctx_conv = self.children["conv"].forward(h, conv_past)
        values, pre, ctx_proj = {}, {}, {}
        for name, kind, dims, source in self.sources:
            if kind == "parameter":
                values[name] = self._parameter(name)
            elif kind == "derived":
                values[name] = source(values)
            else:
                z, ctx_proj[name] = self.children[f"W_{name}"].forward(h)
                pre[name] = z.reshape(B, T, *(self.sizes[letter] for letter in dims.split()))
                values[name] = source(pre[name])
        args = [values[t.name] for t in catalog.signature(self.mixer).inputs]
        return args, values, pre, (ctx_norm, ctx_conv, ctx_proj)

    def forward(self, x):
        args, values, pre, ctxs = self._inputs(x)
        o, _ = self.module.chunked(*args, chunk_size=self.chunk_size, **self.options())
        y, ctx_out = self.children["W_o"].forward(o.reshape(*x.shape[:2], -1))
        return y, (args, values, pre, ctxs, ctx_out, o.shape)

    def backward(self, ctx, dy):
        args, values, pre, (ctx_norm, ctx_conv, ctx_proj), ctx_out, o_shape = ctx
        do = self.children["W_o"].backward(ctx_out, dy).reshape(o_shape)
        grads = self.module.chunked_backward(*args, do=do, chunk_size=self.chunk_size, **self.options())
        d_values = {t.name: getattr(grads, f"d{t.name}") for t in catalog.signature(self.mixer).inputs}
        if self.mixer in DERIVED_BACKWARD:
            d_values.update(DERIVED_BACKWARD[self.mixer](values, d_values))
        dh = 0
        for name, kind, dims, source in self.sources:
            if kind == "parameter" and (self.mixer, name) in SIGNED:
                self.grads[f"{name}_log"] += d_values[name] * values[name]   # d value / d log = value itself
            elif kind == "parameter":
                self.grads[name] += d_values[name]
            elif kind == "projected":
                dz = source.backward(pre[name], d_values[name])
                dh = dh + self.children[f"W_{name}"].backward(ctx_proj[name], dz.reshape(*dz.shape[:2], -1))
        dh = self.children["conv"].backward(ctx_conv, dh)
        return self.children["norm"].backward(ctx_norm, dh)

    # --- decoding --------------------------------------------------------------------------------------------
    def prefill(self, x, state=None):
        """x [B, T, d] -> (y [B, T, d], state): the chunked form, continuing from `state` (None: empty)."""
        conv_past, mixer_state = (None, None) if state is None else state
        args, _, _, (_, padded, _) = self._inputs(x, conv_past)
        o, mixer_state = self.module.chunked(*args, initial_state=mixer_state, chunk_size=self.chunk_size,
                                             **self.options())
        y, _ = self.children["W_o"].forward(o.reshape(*x.shape[:2], -1))
        return y, (ShortConv.carried(padded, self.children["conv"].width), mixer_state)

    def step(self, x_t, state):
        """One token x_t [B, d] -> (y_t [B, d], state): the step form, from the state `prefill` returned."""
        conv_past, mixer_state = (None, None) if state is None else state
        args, _, _, (_, padded, _) = self._inputs(x_t[:, None], conv_past)
        token_args = [a[:, 0] if t.per_token else a
                      for a, t in zip(args, catalog.signature(self.mixer).inputs)]
        o_t, mixer_state = self.module.step(*token_args, state=mixer_state, **self.options())
        y_t, _ = self.children["W_o"].forward(o_t.reshape(x_t.shape[0], -1))
        return y_t, (ShortConv.carried(padded, self.children["conv"].width), mixer_state)
