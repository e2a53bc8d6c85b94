"""The bookkeeping every layer shares: its parameters, their gradients, and its sublayers, by name.

    layer.params   {"weight": array, ...}    what the optimizer updates
    layer.grads    {"weight": array, ...}    dL/d(param), same keys and shapes, accumulated by `backward`
    layer.children {"norm": Module, ...}     sublayers, whose names prefix their parameters' names

Every layer has `forward(x, ...) -> (y, ctx)`, where ctx holds what its backward needs, and
`backward(ctx, dy) -> dx`, which adds dL/d(param) into `grads` (so a parameter used twice gets both
contributions) and returns dL/dx. `zero_grad` clears the sums before a step.
"""
from __future__ import annotations

import numpy as np


class Module:
    def __init__(self):
        self.params: dict[str, np.ndarray] = {}
        self.grads: dict[str, np.ndarray] = {}
        self.children: dict[str, Module] = {}

    def add_param(self, name: str, value) -> np.ndarray:
        self.params[name] = value
        self.grads[name] = np.zeros_like(value)
        return value

    def named_params(self, prefix: str = ""):
        """(name, param, grad) for every parameter of this layer and its sublayers, e.g. "blocks.0.mlp.up"."""
        for name, value in self.params.items():
            yield prefix + name, value, self.grads[name]
        for child_name, child in self.children.items():
            yield from child.named_params(f"{prefix}{child_name}.")

    def zero_grad(self) -> None:
        for _, _, grad in self.named_params():
            grad[...] = 0

    def num_params(self) -> int:
        return sum(p.size for _, p, _ in self.named_params())

    def state_dict(self) -> dict:
        """Every parameter by its dotted name (copies), as a checkpoint stores them."""
        return {name: p.copy() for name, p, _ in self.named_params()}

    def load_state_dict(self, values: dict) -> None:
        """Set every parameter from `values`, which must hold exactly this model's names and shapes."""
        own = {name: p for name, p, _ in self.named_params()}
        missing, unexpected = sorted(set(own) - set(values)), sorted(set(values) - set(own))
        if missing or unexpected:
            raise ValueError(f"checkpoint: expected the parameters of this model, got {len(missing)} missing "
                             f"({missing[:3]}...) and {len(unexpected)} unexpected ({unexpected[:3]}...)")
        for name, p in own.items():
            if values[name].shape != p.shape:
                raise ValueError(f"checkpoint: {name}: expected shape {list(p.shape)}, got {list(values[name].shape)}")
            p[...] = values[name]
