"""AdamW (Loshchilov & Hutter 2019), gradient clipping by global norm, and a warm-up + cosine schedule.

    m = b1 m + (1 - b1) g,   v = b2 v + (1 - b2) g^2                    (moments, per parameter)
    p -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + lr wd p    (decoupled weight decay)

Weight decay applies to every parameter of two or more dims but the convolution taps: the projections and
embeddings, and so also the mixers' own matrices (Mamba-1's and S4's A_log, S4's B and C, RWKV-6's u); norms'
gains, vectors such as Mamba-2's A_log and the taps are not decayed.
"""
from __future__ import annotations

import math

import numpy as np

from ..validation import check_real


class AdamW:
    def __init__(self, model, lr: float = 3e-3, betas=(0.9, 0.98), eps: float = 1e-8, weight_decay: float = 0.1):
        lr, eps = check_real("lr", lr, 0.0, strict=True), check_real("eps", eps, 0.0, strict=False)
        weight_decay = check_real("weight_decay", weight_decay, 0.0, strict=False)
        if len(betas) != 2 or not all(0.0 <= check_real("betas", b, 0.0, strict=False) < 1.0 for b in betas):
            raise ValueError(f"betas: expected two numbers in [0, 1), got {betas!r}")
        self.model, self.lr, self.betas, self.eps, self.weight_decay = model, lr, betas, eps, weight_decay
        self.step_count = 0
        self.m = {name: np.zeros_like(p) for name, p, _ in model.named_params()}
        self.v = {name: np.zeros_like(p) for name, p, _ in model.named_params()}

    def step(self, lr: float | None = None) -> None:
        lr = self.lr if lr is None else lr
        b1, b2 = self.betas
        self.step_count += 1
        c1, c2 = 1 - b1 ** self.step_count, 1 - b2 ** self.step_count
        for name, p, g in self.model.named_params():
            m, v = self.m[name], self.v[name]
            m *= b1
            m += (1 - b1) * g
            v *= b2
            v += (1 - b2) * g * g
            if p.ndim >= 2 and not name.endswith("conv.weight"):
                p -= lr * self.weight_decay * p
            p -= lr * (m / c1) / (np.sqrt(v / c2) + self.eps)

    def state_dict(self) -> dict:
        out = {"step_count": np.asarray(self.step_count)}
        out.update({f"m.{k}": v for k, v in self.m.items()})
        out.update({f"v.{k}": v for k, v in self.v.items()})
        return out

    def load_state_dict(self, values: dict) -> None:
        self.step_count = int(values["step_count"])
        for k in self.m:
            self.m[k][...] = values[f"m.{k}"]
            self.v[k][...] = values[f"v.{k}"]


def clip_grad_norm(model, max_norm: float) -> float:
    """Scale every gradient by min(1, max_norm / ||g||), ||g|| over all parameters; returns ||g|| before. max_norm
    must be positive (a negative one flipped every gradient: training climbed the loss); a non-finite ||g||
    raises, naming the gradients, rather than passing NaN on to the update."""
    max_norm = check_real("clip", max_norm, 0.0, strict=True)
    total = math.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for _, _, g in model.named_params()))
    if not math.isfinite(total):
        raise ValueError(f"gradients: expected a finite global norm, got {total}")
    if total > max_norm:
        for _, _, g in model.named_params():
            g *= max_norm / (total + 1e-12)
    return total


def cosine_schedule(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warm-up over `warmup` steps to `peak`, then a cosine down to peak / 10 at `total`."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
