"""Hybrid stacks: layers of different mixers in one model, e.g. one softmax layer every r layers, as Jamba
(1 attention : 7 Mamba), MiniMax-01 (1 softmax : 7 Lightning) and Kimi Linear (1 MLA : 3 KDA) do.

    from minilin.hybrid import HybridStack
    stack = HybridStack.from_pattern("LLLLLLLA", d_model=256, heads=4, mixer="gated_deltanet", seed=0)
    y, cache = stack.prefill(x)                 # x [B, T, d_model]: the prompt, chunked forms
    y_t, cache = stack.decode(x_t, cache)       # x_t [B, d_model]: one token, step forms

Each layer is pre-norm with a residual connection (no MLP: the mixers are what is compared):

    h = RMSNorm(x) = x / sqrt(mean(x^2) + eps) * w_norm          [B, T, d]
    inputs = projections of h: q, k, v, gates, ... (`INPUTS`)       e.g. q = (h W_q) as [B, T, H, K]
    o, state = mixer(inputs, initial_state=state)                  [B, T, H, V] (or [B, T, D])
    x = x + o W_o                                                  W_o: [H V, d]

and the stack ends with a final RMSNorm. `prefill` runs each mixer's `chunked` form over a block of
tokens, `decode` its `step` form on one token; both read and return the cache, a list with one state per
layer (a KV cache for softmax layers, a ring buffer for sliding windows, the fixed state for the
others). Prefilling [0, t) and then decoding token by token from the returned cache gives the same
outputs and the same cache as prefilling [0, T) (tests/test_hybrid.py, float64, 1e-10).

Pattern letters: "A" softmax attention (MHA), "W" sliding-window attention (`window` tokens), "L" the
linear `mixer`. `from_mixers` takes any list of mixer names from `INPUTS` instead.

`INPUTS` says, per mixer, where each positional argument comes from: `Projected` (a per-token
projection of h with an activation that puts it in the valid range: log-sigmoid gates <= 0, sigmoid
beta, softplus dt, unit keys for the delta rule), `Parameter` (per-layer, e.g. Mamba's A) or `Derived`
(from other inputs, e.g. RWKV-7's a and b from one key). A new causal mixer joins the stacks by adding
its row there (tests/test_hybrid.py checks that every causal mixer has one).

The weights are random (seeded), W ~ N(0, 1/fan_in), NumPy arrays of `dtype` (so the stack runs on
NumPy inputs): this is a harness to run and measure mixers in a stack, not a trained model. Shapes: heads H, head_dim K = V (the key and value size per head); per-channel
mixers (HGRN, Mamba-1, S4) get D = H * head_dim channels.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from . import cache as cache_accounting
from . import catalog
from .backend import array_module
from .validation import Shapes, check_array, check_chunk_size, check_count


# --- what a layer feeds its mixer ---------------------------------------------------------------------

def _identity(z):
    return z


def _l2_normalize(z):
    """Unit vectors over the last axis (keys and queries of the delta rule, as DeltaNet / GDN / KDA do)."""
    xp = array_module(z)
    return z / xp.sqrt((z * z).sum(-1, keepdims=True) + 1e-12)


def _log_sigmoid(z):
    """log sigmoid(z) = -log(1 + exp(-z)) <= 0: a log-space decay (GLA's gate), computed without overflow."""
    return -array_module(z).logaddexp(0, -z)


def _sigmoid(z):
    """sigmoid(z) in (0, 1): the delta rule's write strength beta."""
    return array_module(z).exp(_log_sigmoid(z))


def _step_size(z):
    """softplus(z - 2) > 0: Mamba's dt (the shift starts it small, about 0.13 at z = 0)."""
    return array_module(z).logaddexp(0, z - 2)


@dataclass(frozen=True)
class Projected:
    """A per-token input: activation(h W) with W [d_model, prod(dims)], reshaped to [B, T, *dims]."""

    dims: str
    activation: Callable = _identity


@dataclass(frozen=True)
class Parameter:
    """A per-layer parameter of shape dims, drawn once: init(rng, shape) -> array."""

    dims: str
    init: Callable


@dataclass(frozen=True)
class Derived:
    """A per-token input computed from inputs listed before it (by name) in the same layer: e.g. RWKV-7's
    a and b, which share one normalized key. Names starting with "_" are such intermediate values,
    computed but not passed to the mixer."""

    compute: Callable


def _negative_rates(rng, shape):
    """A <= 0: decay rates spread over [0.5, 2] (Mamba-2 per head; Mamba-1 S4D-Real-like per channel)."""
    return -rng.uniform(0.5, 2.0, shape)


def _normal(rng, shape):
    return rng.standard_normal(shape)


def _time_steps(rng, shape):
    """S4D's dt, log-uniform in [1e-3, 1e-1]."""
    return np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), shape))


def _rwkv7_log_decay(z):
    """RWKV-7's decay w = exp(-e^{-1/2} sigmoid(z)), in log space: -e^{-1/2} sigmoid(z) in (-0.61, 0)."""
    return -np.exp(-0.5) * _sigmoid(z)


_QKV = (("q", Projected("H K")), ("k", Projected("H K")), ("v", Projected("H V")))
_DELTA_QK = (("q", Projected("H K", _l2_normalize)), ("k", Projected("H K", _l2_normalize)), ("v", Projected("H V")))

# The mixer's positional arguments, in signature order, and where each comes from. Keyword options come
# from `OPTIONS`. Gates are log-sigmoids (<= 0), beta a sigmoid, dt a softplus.
INPUTS: dict[str, tuple] = {
    "attention": _QKV,
    "sliding_window": _QKV,
    "linear_attention": _QKV,
    "retnet": _QKV,
    "lightning": _QKV,
    "simple_gla": _QKV + (("g", Projected("H", _log_sigmoid)),),
    "gla": _QKV + (("g", Projected("H K", _log_sigmoid)),),
    "deltanet": _DELTA_QK + (("beta", Projected("H", _sigmoid)),),
    "gated_deltanet": _DELTA_QK + (("g", Projected("H", _log_sigmoid)), ("beta", Projected("H", _sigmoid))),
    "kda": _DELTA_QK + (("g", Projected("H K", _log_sigmoid)), ("beta", Projected("H", _sigmoid))),
    "mamba2": (("x", Projected("H V")), ("dt", Projected("H", _step_size)), ("A", Parameter("H", _negative_rates)),
               ("B", Projected("H K")), ("C", Projected("H K")), ("D", Parameter("H", _normal))),
    "mamba": (("x", Projected("D")), ("dt", Projected("D", _step_size)), ("A", Parameter("D K", _negative_rates)),
              ("B", Projected("K")), ("C", Projected("K")), ("D", Parameter("D", _normal))),
    "hgrn": (("x", Projected("D")), ("g", Projected("D", _log_sigmoid))),
    "hgrn2": (("q", Projected("H K")), ("v", Projected("H V")), ("g", Projected("H K", _log_sigmoid))),
    "rwkv6": (("r", Projected("H K")), ("k", Projected("H K")), ("v", Projected("H V")),
              ("w", Projected("H K", _log_sigmoid)), ("u", Parameter("H K", _normal))),
    # RWKV-7 (see its module): a = -kappa, b = kappa * alpha with kappa a unit removal key and alpha the
    # in-context learning rate in (0, 1), so the transition is Diag(w) - kappa (alpha * kappa)^T.
    "rwkv7": (("_kappa", Projected("H K", _l2_normalize)), ("_alpha", Projected("H K", _sigmoid)),
              ("r", Projected("H K")), ("w", Projected("H K", _rwkv7_log_decay)), ("k", Projected("H K")),
              ("v", Projected("H V")), ("a", Derived(lambda x: -x["_kappa"])),
              ("b", Derived(lambda x: x["_kappa"] * x["_alpha"]))),
    # S4 (S4D-Real): time-invariant, so everything but the input u is a parameter; D = H * head_dim channels.
    "s4": (("u", Projected("D")), ("dt", Parameter("D", _time_steps)), ("A", Parameter("D K", _negative_rates)),
           ("B", Parameter("D K", _normal)), ("C", Parameter("D K", _normal)), ("D", Parameter("D", _normal))),
}

# Keyword options a mixer needs from the layer.
OPTIONS: dict[str, Callable] = {"sliding_window": lambda layer: {"window": layer.window}}

PATTERN_LETTERS = {"A": "attention", "W": "sliding_window", "L": None}  # None: the `mixer` argument


def supported_mixers() -> list[str]:
    """The mixers a stack can hold: those in `INPUTS` that exist in `minilin.mixers` (causal ones)."""
    return [name for name in catalog.names() if name in INPUTS]


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
        values = {}
        for name, source in INPUTS[self.mixer]:
            if isinstance(source, Parameter):
                values[name] = self.params[name]
            elif isinstance(source, Derived):
                values[name] = source.compute(values)
            else:
                shape = [sizes[letter] for letter in source.dims.split()]
                values[name] = source.activation((h @ self.weights[name]).reshape(B, T, *shape))
        return [value for name, value in values.items() if not name.startswith("_")]

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
        o_t, state = self.module.step(*token_args, state=state, **self.options())
        return x_t + o_t.reshape(x_t.shape[0], -1) @ self.out, state

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
        known = supported_mixers()
        for name in mixers:
            if name not in known:
                raise ValueError(f"mixer: expected one of {known} (causal mixers whose inputs hybrid.INPUTS "
                                 f"projects), got {name!r}")
        if "sliding_window" in mixers:
            window = check_count("window", window)
        rng = np.random.default_rng(seed)

        def draw(shape, fan_in):
            return np.asarray(rng.standard_normal(shape) / np.sqrt(fan_in), dtype=dtype)

        layers = []
        for name in mixers:
            sizes = {"H": heads, "K": head_dim, "V": head_dim, "D": heads * head_dim}
            weights, params = {}, {}
            for arg, source in INPUTS[name]:
                if isinstance(source, Derived):
                    continue
                shape = tuple(sizes[letter] for letter in source.dims.split())
                if isinstance(source, Parameter):
                    params[arg] = np.asarray(source.init(rng, shape), dtype=dtype)
                else:
                    weights[arg] = draw((d_model, int(np.prod(shape))), d_model)
            out_features = heads * head_dim  # [B, T, H, V] and [B, T, D] both flatten to H * head_dim
            norm = np.asarray(1 + 0.1 * rng.standard_normal(d_model), dtype=dtype)
            layers.append(Layer(name, heads, head_dim, norm, weights, params, draw((out_features, d_model), out_features),
                                window if name == "sliding_window" else None))
        final_norm = np.asarray(1 + 0.1 * rng.standard_normal(d_model), dtype=dtype)
        return cls(layers, d_model, final_norm)

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
