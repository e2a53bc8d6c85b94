"""Memory: a softmax layer's KV cache grows with the context, a linear mixer's state does not, and a
hybrid with one softmax layer in eight keeps about an eighth of an all-softmax model's cache.

The model (stated, not measured: a common shape of 7-8B models, e.g. Llama-3-8B's attention but with
48 layers): 48 layers, d_model = 4096, 32 query heads of 128, GQA with 8 KV heads, bf16 caches and
states (2 bytes per number), one sequence. The other layer types at the same width: MHA (32 KV heads),
MLA as DeepSeek-V2 (latent 512 + RoPE key 64 per token), a sliding window of 4096 tokens (8 KV heads),
and every linear mixer in `minilin.mixers` with 32 heads of K = V = 128, its state counted from what
its own `step` returns (`minilin.cache.FixedState`).

The byte counts are `minilin.cache`'s formulas. They are also checked against the arrays a real
`HybridStack` holds after prefill and decode (float64, a small model): `measured` rows, equal to the byte.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from .. import cache, catalog
from ..hybrid import HybridStack, cache_nbytes

CONTEXTS = (4096, 131072, 1048576)                 # 4K, 128K, 1M tokens
GROWTH = tuple(2 ** p for p in range(10, 21))      # 1K .. 1M, for the per-layer curves


@dataclass(frozen=True)
class ModelConfig:
    layers: int = 48
    d_model: int = 4096
    heads: int = 32
    head_dim: int = 128
    kv_heads: int = 8
    mla_latent: int = 512
    mla_rope: int = 64
    window: int = 4096
    linear_mixer: str = "gated_deltanet"
    softmax_every: int = 8          # 1:7 -> one softmax layer in every 8
    bytes_per_element: int = 2      # bf16


def layer_types(config: ModelConfig) -> dict:
    """Label -> LayerCache spec for one layer of each kind at this width."""
    types = {
        "MHA": cache.MHA(config.heads, config.head_dim),
        "GQA": cache.GQA(config.kv_heads, config.head_dim),
        "MLA": cache.MLA(config.mla_latent, config.mla_rope),
        f"sliding window {config.window}": cache.SlidingWindow(config.window, config.kv_heads, config.head_dim),
    }
    for name in catalog.names():
        if name in cache.GROWING or not callable(getattr(catalog.module(name), "step", None)):
            continue  # growing caches are above; the non-causal approximations keep nothing
        types[name] = cache.FixedState(name, config.heads, config.head_dim, config.head_dim)
    return types


def stacks(config: ModelConfig) -> dict:
    """Name -> list of per-layer specs for the whole-model comparison."""
    types = layer_types(config)
    linear = types[config.linear_mixer]

    def hybrid(softmax_layer, other_layer):
        r = config.softmax_every
        return [softmax_layer if (i + 1) % r == 0 else other_layer for i in range(config.layers)]

    ratio = f"1:{config.softmax_every - 1}"
    return {
        "all softmax, MHA": [types["MHA"]] * config.layers,
        "all softmax, GQA": [types["GQA"]] * config.layers,
        "all softmax, MLA": [types["MLA"]] * config.layers,
        f"{ratio} GQA + sliding window {config.window}": hybrid(types["GQA"], types[f"sliding window {config.window}"]),
        f"{ratio} GQA + {config.linear_mixer}": hybrid(types["GQA"], linear),
    }


def measure_stack(tokens: tuple, decode_tokens: int = 4, seed: int = 0) -> list[dict]:
    """Prefill a small float64 1:7 hybrid with a sliding-window layer ("LLLWLLLA", d_model 64, 4 heads of 16,
    W = 32) for each length in `tokens`, then decode a few tokens; compare each layer's cache arrays
    with the accounting (8 bytes per number)."""
    stack = HybridStack.from_pattern("LLLWLLLA", d_model=64, heads=4, head_dim=16, window=32, seed=seed)
    specs = stack.cache_specs()
    rng = np.random.default_rng(seed)
    rows = []
    for T in tokens:
        x = rng.standard_normal((1, T + decode_tokens, 64))
        _, state = stack.prefill(x[:, :T])
        for when, n in (("prefill", T), ("decode", T + decode_tokens)):
            if when == "decode":
                for t in range(T, T + decode_tokens):
                    _, state = stack.decode(x[:, t], state)
            measured = cache_nbytes(state)
            for mixer, spec, got in zip(stack.mixers, specs, measured):
                rows.append({"mixer": mixer, "tokens": n, "after": when, "measured": got,
                             "accounted": spec.bytes(n, bytes_per_element=8)})
    return rows


def run(quick: bool = False) -> dict:
    config = ModelConfig()
    bpe = config.bytes_per_element
    types = layer_types(config)
    per_layer = [{"layer": label, "grows": spec.grows(), "spec": spec.label,
                  "bytes": {n: spec.bytes(n, bytes_per_element=bpe) for n in CONTEXTS}}
                 for label, spec in types.items()]
    growth = {label: [spec.bytes(n, bytes_per_element=bpe) for n in GROWTH]
              for label, spec in types.items() if label in ("MHA", "GQA", "MLA", f"sliding window {config.window}",
                                                             config.linear_mixer)}
    whole = {name: {n: cache.stack_bytes(layers, n, bytes_per_element=bpe)["total"] for n in CONTEXTS}
             for name, layers in stacks(config).items()}
    return {"config": asdict(config), "contexts": CONTEXTS, "per_layer": per_layer,
            "growth_tokens": GROWTH, "growth": growth, "stacks": whole,
            "measured": measure_stack((16, 64) if quick else (16, 64, 256))}


def table(data: dict) -> str:
    c, contexts = data["config"], data["contexts"]
    heads = "".join(f"{_tokens(n):>12s}" for n in contexts)
    lines = [f"Per layer, one sequence, bf16 ({c['heads']} heads x {c['head_dim']}, {c['kv_heads']} KV heads):",
             f"  {'layer':32s}{heads}"]
    for row in data["per_layer"]:
        kind = "" if row["grows"] else "  (fixed)"
        lines.append(f"  {row['layer']:32s}" + "".join(f"{cache.format_bytes(row['bytes'][n]):>12s}" for n in contexts)
                     + kind)
    reference = data["stacks"]["all softmax, GQA"]
    lines += ["", f"Whole model, {c['layers']} layers ((x) = all-softmax GQA's cache / this stack's):",
              f"  {'stack':40s}" + "".join(f"{_tokens(n):>20s}" for n in contexts)]
    for name, totals in data["stacks"].items():
        cells = "".join(f"{cache.format_bytes(totals[n]):>11s} ({reference[n] / totals[n]:4.1f}x)" for n in contexts)
        lines.append(f"  {name:40s}{cells}")
    mismatched = [r for r in data["measured"] if r["measured"] != r["accounted"]]
    checked = len(data["measured"])
    lines += ["", f"Accounting vs the arrays a real HybridStack holds (LLLWLLLA, float64): {checked - len(mismatched)} "
              f"of {checked} layer caches equal to the byte."]
    return "\n".join(lines)


def plot(data: dict, path: str) -> None:
    from . import _plot

    fig, (ax,) = _plot.subplots(1, width=6.5, height=4.5)
    for label, values in data["growth"].items():
        ax.plot(data["growth_tokens"], np.asarray(values) / 2 ** 20, marker="o", ms=3, label=label,
                linestyle="--" if label.startswith("sliding") else "-")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("cache per layer (MiB, bf16)")
    ax.set_title("KV cache grows with the context; a linear mixer's state does not")
    ax.legend(fontsize=8)
    _plot.save(fig, path, "memory")


def _tokens(n: int) -> str:
    return f"{n // 1048576}M" if n % 1048576 == 0 else f"{n // 1024}K"
