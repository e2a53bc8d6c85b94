"""Hybrid stacks: layers of different mixers in one model, e.g. one softmax layer every r layers, as Jamba
(1 attention : 7 Mamba), MiniMax-01 (1 softmax : 7 Lightning) and Kimi Linear (1 MLA : 3 KDA) do.

    from minilin.hybrid import HybridStack
    stack = HybridStack.from_pattern("LLLLLLLA", d_model=256, heads=4, mixer="gated_deltanet", seed=0)
    y, cache = stack.prefill(x)                 # x [B, T, d_model]: the prompt, chunked forms
    y_t, cache = stack.decode(x_t, cache)       # x_t [B, d_model]: one token, step forms

Each layer is pre-norm with a residual connection (no MLP: the mixers are what is compared):

    h = RMSNorm(x) = x / sqrt(mean(x^2) + eps) * w_norm          [B, T, d]
    inputs = projections of h: q, k, v, gates, ... (`layer_inputs`) e.g. q = (h W_q) as [B, T, H, K]
    o, state = mixer(inputs, initial_state=state)                  [B, T, H, V] (or [B, T, D])
    x = x + o W_o                                                  W_o: [H V, d]

and the stack ends with a final RMSNorm. `prefill` runs each mixer's `chunked` form over a block of
tokens, `decode` its `step` form on one token; both read and return the cache, a list with one state per
layer (a KV cache for softmax layers, a ring buffer for sliding windows, the fixed state for the
others). Prefilling [0, t) and then decoding token by token from the returned cache gives the same
outputs and the same cache as prefilling [0, T) (tests/test_hybrid.py, float64, 1e-10).

Pattern letters: "A" softmax attention (MHA), "W" sliding-window attention (`window` tokens), "L" the
linear `mixer`. `from_mixers` takes any list of causal mixer names instead.

Where each positional argument of a mixer comes from is read off its SIGNATURE (`layer_inputs`): a
per-token input is a projection of h, passed through the activation that puts it in its valid range
(`ACTIVATIONS`: log-sigmoid gates <= 0, sigmoid beta, softplus dt), a parameter (no B, T axes, e.g.
Mamba's A) is drawn once per layer (`PARAMETERS`), and a few inputs are derived from extra projections
(RWKV-7's a and b from one key: `HIDDEN`, `DERIVED`). The delta-rule mixers normalize their q and k
themselves (normalize_qk=True). A new causal mixer joins the stacks with no change here unless it needs
an activation or has parameters.

The weights are random (seeded), W ~ N(0, 1/fan_in), NumPy arrays of `dtype` (so the stack runs on
NumPy inputs): this is a harness to run and measure mixers in a stack, not a trained model (`minilin.nn`
trains). Shapes: heads H, head_dim K = V (the key and value size per head); per-channel mixers (HGRN, Mamba-1, S4) get D = H * head_dim
channels.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from . import activations, catalog
from . import cache as cache_accounting
from .backend import array_module, is_cupy_array
from .validation import Shapes, check_array, check_chunk_size, check_count


# --- what a layer feeds its mixer ---------------------------------------------------------------------
# Each mixer's SIGNATURE says which arrays it takes and their dims; a per-token input ([B, T, ...]) is a
# projection of h, a parameter (no B, T) is drawn once per layer. What is said here is only what the
# signature cannot know: the activation that puts a projection in its valid range, how to draw a parameter,
# inputs derived from other projections, the letters' sizes, and the options a layer passes.


def _negative_rates(rng, shape):
    """A <= 0: decay rates spread over [0.5, 2] (Mamba-2 per head; Mamba-1 S4D-Real-like per channel)."""
    return -rng.uniform(0.5, 2.0, shape)


def _normal(rng, shape):
    return rng.standard_normal(shape)


def _time_steps(rng, shape):
    """S4D's dt, log-uniform in [1e-3, 1e-1]."""
    return np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), shape))


# The activation of each projected input that needs one (the rest are the identity). Gates are
# log-sigmoids (<= 0), beta a sigmoid, dt a softplus. The delta-rule mixers get raw q and k and
# normalize them inside (normalize_qk=True in OPTIONS).
ACTIVATIONS: dict[str, dict] = {
    "simple_gla": {"g": activations.log_sigmoid},
    "gla": {"g": activations.log_sigmoid},
    "deltanet": {"beta": activations.sigmoid},
    "gated_deltanet": {"g": activations.log_sigmoid, "beta": activations.sigmoid},
    "kda": {"g": activations.log_sigmoid, "beta": activations.sigmoid},
    "mamba2": {"dt": activations.step_size},
    "mamba": {"dt": activations.step_size},
    "hgrn": {"g": activations.log_sigmoid},
    "hgrn2": {"g": activations.log_sigmoid},
    "rwkv6": {"w": activations.log_sigmoid},
    "rwkv7": {"w": activations.rwkv7_decay},
}

# How each parameter (an input without B, T) is drawn: init(rng, shape) -> array.
PARAMETERS: dict[str, dict] = {
    "mamba2": {"A": _negative_rates, "D": _normal},
    "mamba": {"A": _negative_rates, "D": _normal},
    "rwkv6": {"u": _normal},
    "s4": {"dt": _time_steps, "A": _negative_rates, "B": _normal, "C": _normal, "D": _normal},
}

# RWKV-7 (see its module): a = -kappa, b = kappa * alpha with kappa a unit removal key and alpha the
# in-context learning rate in (0, 1), so the transition is Diag(w) - kappa (alpha * kappa)^T. The layer
# projects kappa and alpha (`HIDDEN`) and derives a and b from them (`DERIVED`).
HIDDEN: dict[str, tuple] = {"rwkv7": (("kappa", "H K", activations.l2_normalize), ("alpha", "H K", activations.sigmoid))}
DERIVED: dict[str, dict] = {"rwkv7": {"a": lambda x: -x["kappa"], "b": lambda x: x["kappa"] * x["alpha"]}}

# Keyword options a mixer needs from the layer.
OPTIONS: dict[str, Callable] = {
    "sliding_window": lambda layer: {"window": layer.window},
    "deltanet": lambda layer: {"normalize_qk": True},
    "gated_deltanet": lambda layer: {"normalize_qk": True},
    "kda": lambda layer: {"normalize_qk": True},
}

# S4's channels are its "heads" of width 1: in a stack its letter H stands for all D = heads * head_dim.
LETTERS: dict[str, dict] = {"s4": {"H": "D"}}

PATTERN_LETTERS = {"A": "attention", "W": "sliding_window", "L": None}  # None: the `mixer` argument


def supported_mixers() -> list[str]:
    """The mixers a stack can hold: every causal one (those with a `step` form)."""
    return [name for name in catalog.names() if callable(getattr(catalog.module(name), "step", None))]


def layer_inputs(mixer: str) -> list[tuple]:
    """How a layer of `mixer` makes each input, in signature order (hidden projections first):
    (name, "projected", dims, activation) | (name, "parameter", dims, init) | (name, "derived", None, fn).
    dims use the stack's letters H, K, V, D (D = H * K channels)."""
    rename = {"N": "K", "P": "V", **LETTERS.get(mixer, {})}
    sources = [(name, "projected", dims, act) for name, dims, act in HIDDEN.get(mixer, ())]
    for t in catalog.signature(mixer).inputs:
        dims = " ".join(rename.get(d, d) for d in t.dims.split())
        if t.name in DERIVED.get(mixer, {}):
            sources.append((t.name, "derived", None, DERIVED[mixer][t.name]))
        elif t.per_token:
            stack_dims = " ".join(dims.split()[2:])
            sources.append((t.name, "projected", stack_dims, ACTIVATIONS.get(mixer, {}).get(t.name, activations.identity)))
        else:
            sources.append((t.name, "parameter", dims, PARAMETERS[mixer][t.name]))
    return sources


# --- the stack -----------------------------------------------------------------------------------------

RMS_EPS = 1e-6


def rms_norm(x, weight, eps: float = RMS_EPS):
    """RMSNorm (Zhang & Sennrich 2019): x / sqrt(mean(x^2) + eps) * weight, over the last axis."""
    xp = array_module(x)
    return x / xp.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight


@dataclass
class Layer:
    """One pre-norm residual layer around a mixer. weights: input name -> W [d_model, prod(dims)];
    params: input name -> parameter array; out: W_o [mixer output features, d_model]."""

    mixer: str
    heads: int
    head_dim: int
    norm: object
    weights: dict
    params: dict
    out: object
    window: int | None = None
    module: object = field(init=False, repr=False)

    def __post_init__(self):
        self.module = catalog.module(self.mixer)

    def sizes(self) -> dict:
        return {"H": self.heads, "K": self.head_dim, "V": self.head_dim, "D": self.heads * self.head_dim}

    def mixer_inputs(self, h):
        """The mixer's positional arguments computed from the normalized hidden state h [B, T, d]."""
        B, T = h.shape[:2]
        sizes = self.sizes()
        values, hidden = {}, {name for name, *_ in HIDDEN.get(self.mixer, ())}
        for name, kind, dims, source in layer_inputs(self.mixer):
            if kind == "parameter":
                values[name] = self.params[name]
            elif kind == "derived":
                values[name] = source(values)
            else:
                shape = [sizes[letter] for letter in dims.split()]
                values[name] = source((h @ self.weights[name]).reshape(B, T, *shape))
        return [value for name, value in values.items() if name not in hidden]

    def options(self) -> dict:
        return OPTIONS.get(self.mixer, lambda layer: {})(self)

    def prefill(self, x, state, chunk_size: int):
        """x [B, T, d] -> (x + mixer output [B, T, d], the mixer's state after these tokens)."""
        h = rms_norm(x, self.norm, RMS_EPS)
        o, state = self.module.chunked(*self.mixer_inputs(h), initial_state=state, chunk_size=chunk_size,
                                       **self.options())
        return x + o.reshape(*x.shape[:2], -1) @ self.out, state

    def decode(self, x_t, state):
        """x_t [B, d] -> (x_t + mixer output [B, d], the state one token later)."""
        h = rms_norm(x_t[:, None], self.norm, RMS_EPS)
        token_args = [a[:, 0] if a.ndim >= 3 else a for a in self.mixer_inputs(h)]  # drop the T axis
        o_t, state = self.step_form(x_t)(*token_args, state=state, **self.options())
        return x_t + o_t.reshape(x_t.shape[0], -1) @ self.out, state

    def step_form(self, x_t):
        """The mixer's one-token step: minilin.cuda's decode kernel on CuPy float32 arrays where it has one
        (out of place, so that a cache handed in stays as it was), else the reference's `step`."""
        if is_cupy_array(x_t) and x_t.dtype == np.float32:
            from . import cuda

            if self.mixer in cuda.STEPS:
                step = cuda.STEPS[self.mixer]
                return lambda *args, **kwargs: step(*args, in_place=False, **kwargs)
        return self.module.step

    def cache_spec(self) -> cache_accounting.LayerCache:
        """What this layer's cache is, for `minilin.cache` accounting."""
        if self.mixer == "attention":
            return cache_accounting.MHA(self.heads, self.head_dim)
        if self.mixer == "sliding_window":
            return cache_accounting.SlidingWindow(self.window, self.heads, self.head_dim)
        return cache_accounting.FixedState(self.mixer, self.heads, self.head_dim, self.head_dim)


class HybridStack:
    """A stack of pre-norm residual mixer layers with a final RMSNorm (module docstring)."""

    def __init__(self, layers: list[Layer], d_model: int, final_norm):
        self.layers, self.d_model, self.final_norm = list(layers), d_model, final_norm

    @classmethod
    def from_pattern(cls, pattern: str, *, d_model: int, heads: int, head_dim: int | None = None,
                     mixer: str = "gated_deltanet", window: int | None = None, seed: int = 0, dtype=np.float64):
        """One layer per letter of `pattern`: "A" softmax attention, "W" sliding window (`window`),
        "L" the linear `mixer`. E.g. "LLLLLLLA" * 6 is a 48-layer 1:7 hybrid."""
        if not isinstance(pattern, str) or not pattern or set(pattern) - set(PATTERN_LETTERS):
            raise ValueError(f"pattern: expected a non-empty string of the letters {sorted(PATTERN_LETTERS)} "
                             f"(A attention, W sliding window, L the linear mixer), got {pattern!r}")
        mixers = [PATTERN_LETTERS[letter] or mixer for letter in pattern]
        return cls.from_mixers(mixers, d_model=d_model, heads=heads, head_dim=head_dim, window=window,
                               seed=seed, dtype=dtype)

    @classmethod
    def from_mixers(cls, mixers, *, d_model: int, heads: int, head_dim: int | None = None,
                    window: int | None = None, seed: int = 0, dtype=np.float64):
        """One layer per mixer name (any of `supported_mixers()`), seeded random weights.
        head_dim defaults to d_model // heads."""
        d_model, heads = check_count("d_model", d_model), check_count("heads", heads)
        head_dim = check_count("head_dim", d_model // heads if head_dim is None else head_dim)
        if np.dtype(dtype) not in (np.float32, np.float64):  # an integer dtype drew all-zero weights
            raise TypeError(f"dtype: expected float32 or float64, got {np.dtype(dtype)}")
        if isinstance(mixers, str) or not mixers:
            raise ValueError(f"mixers: expected a non-empty list of mixer names, got {mixers!r}")
        known = supported_mixers()
        for name in mixers:
            if name not in known:
                raise ValueError(f"mixer: expected one of {known} (the causal mixers), got {name!r}")
        if "sliding_window" in mixers:
            window = check_count("window", window)
        rng = np.random.default_rng(seed)

        def draw(shape, fan_in):
            return np.asarray(rng.standard_normal(shape) / np.sqrt(fan_in), dtype=dtype)

        layers = []
        for name in mixers:
            sizes = {"H": heads, "K": head_dim, "V": head_dim, "D": heads * head_dim}
            weights, params = {}, {}
            for arg, kind, dims, source in layer_inputs(name):
                if kind == "derived":
                    continue
                shape = tuple(sizes[letter] for letter in dims.split())
                if kind == "parameter":
                    params[arg] = np.asarray(source(rng, shape), dtype=dtype)
                else:
                    weights[arg] = draw((d_model, int(np.prod(shape))), d_model)
            out_features = heads * head_dim  # [B, T, H, V] and [B, T, D] both flatten to H * head_dim
            norm = np.asarray(1 + 0.1 * rng.standard_normal(d_model), dtype=dtype)
            layers.append(Layer(name, heads, head_dim, norm, weights, params, draw((out_features, d_model), out_features),
                                window if name == "sliding_window" else None))
        final_norm = np.asarray(1 + 0.1 * rng.standard_normal(d_model), dtype=dtype)
        return cls(layers, d_model, final_norm)

    def to(self, xp, dtype=None) -> "HybridStack":
        """The same stack with every weight, parameter and norm an array of module `xp` (numpy or cupy), in
        `dtype` if given: `stack.to(cupy, np.float32)` decodes with minilin.cuda's kernels."""
        def move(a):
            return xp.asarray(a, dtype=dtype or a.dtype)

        layers = [Layer(layer.mixer, layer.heads, layer.head_dim, move(layer.norm),
                        {n: move(w) for n, w in layer.weights.items()}, {n: move(p) for n, p in layer.params.items()},
                        move(layer.out), layer.window) for layer in self.layers]
        return HybridStack(layers, self.d_model, move(self.final_norm))

    @property
    def mixers(self) -> list[str]:
        return [layer.mixer for layer in self.layers]

    def _check_cache(self, cache):
        if cache is None:
            return [None] * len(self.layers)
        if not isinstance(cache, (list, tuple)) or len(cache) != len(self.layers):
            given = f"a {type(cache).__name__} of {len(cache)}" if isinstance(cache, (list, tuple)) else type(cache).__name__
            raise ValueError(f"cache: expected a list of {len(self.layers)} layer states (or None), got {given}")
        return list(cache)

    def _check_hidden(self, name, x, dims):
        return check_array(name, x, dims, Shapes(D=self.d_model), array_module(x))

    def prefill(self, x, cache=None, *, chunk_size: int = 64):
        """Run a block of tokens x [B, T, d_model] through every layer's chunked form, continuing from
        `cache` (None: an empty context). Returns (y [B, T, d_model], the cache after these tokens)."""
        x = self._check_hidden("x", x, "B T D")
        if x.shape[1] < 1:
            raise ValueError("x: expected at least one token (T >= 1), got T = 0")
        chunk_size = check_chunk_size(chunk_size)
        cache = self._check_cache(cache)
        for i, layer in enumerate(self.layers):
            x, cache[i] = layer.prefill(x, cache[i], chunk_size)
        return rms_norm(x, self.final_norm, RMS_EPS), cache

    def decode(self, x_t, cache=None):
        """One token x_t [B, d_model] through every layer's step form. Returns (y_t [B, d_model], cache)."""
        x_t = self._check_hidden("x_t", x_t, "B D")
        cache = self._check_cache(cache)
        for i, layer in enumerate(self.layers):
            x_t, cache[i] = layer.decode(x_t, cache[i])
        return rms_norm(x_t, self.final_norm, RMS_EPS), cache

    def cache_specs(self) -> list:
        """Each layer's cache as a `minilin.cache` spec (MHA, SlidingWindow or FixedState)."""
        return [layer.cache_spec() for layer in self.layers]


def cache_nbytes(cache) -> list[int]:
    """Bytes of arrays held by each layer's state in a cache (the window's position counter not counted)."""
    def arrays(state):
        if isinstance(state, (tuple, list)):
            return sum(arrays(s) for s in state)
        return int(state.nbytes) if getattr(state, "ndim", 0) >= 1 else 0
    return [arrays(state) for state in cache]
