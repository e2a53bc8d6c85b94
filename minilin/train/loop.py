"""The training loop: batches from the task, forward + backward by hand (`minilin.nn`), AdamW, evaluation on
held-out examples, checkpoints that resume exactly, and one record of what the run reached.

    run = Run(mixers=["gated_deltanet", "gated_deltanet"], d_model=64, task=MQAR(num_kv_pairs=8), steps=600)
    record = train(run, checkpoint="ckpt.npz")     # {"mixer", "d_model", ..., "loss", "accuracy"}

Each step: tokens, targets = batch(task, step, batch_size, seed); zero the gradients; loss_and_grads; clip
the global norm to `clip`; AdamW at the warm-up + cosine learning rate of this step. Every `eval_every`
steps, and at the end, the accuracy on `eval_size` held-out examples at the query positions.

A checkpoint (`.npz`) holds the parameters, AdamW's moments and step count, the step reached, the loss
history, and the run's configuration. Because batch i is a pure function of (seed, i) and the learning rate a
function of the step, resuming from a checkpoint continues exactly as the run would have (tests/test_train.py
checks bit for bit). A checkpoint of another configuration is refused, naming the first difference.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from .. import cache as cache_accounting
from ..hybrid import supported_mixers
from ..nn import AdamW, LanguageModel, accuracy, clip_grad_norm, cosine_schedule
from ..validation import check_count, check_real
from .mqar import MQAR, batch, held_out


@dataclass(frozen=True)
class Run:
    """One training run: the model (one mixer per block), the task, and the optimizer's settings."""

    mixers: tuple = ("gated_deltanet", "gated_deltanet")
    d_model: int = 64
    heads: int = 2
    task: MQAR = field(default_factory=MQAR)
    steps: int = 600
    batch_size: int = 64
    lr: float = 3e-3
    warmup: int = 50
    weight_decay: float = 0.1
    clip: float = 1.0
    seed: int = 0
    eval_size: int = 256
    eval_every: int = 100
    chunk_size: int = 32
    window: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "mixers", tuple(self.mixers))
        known = supported_mixers()
        for name in self.mixers:
            if name not in known:
                raise ValueError(f"mixer: expected one of {known} (the causal mixers), got {name!r}")
        for name in ("d_model", "heads", "steps", "batch_size", "eval_size", "eval_every", "chunk_size"):
            check_count(name, getattr(self, name))
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int):
            raise TypeError(f"warmup: expected a non-negative integer, got {self.warmup!r}")
        if self.warmup < 0:
            raise ValueError(f"warmup: expected a non-negative integer, got {self.warmup!r}")
        if not self.mixers:
            raise ValueError("mixers: expected at least one mixer, got none")
        check_real("lr", self.lr, 0.0, strict=True)
        check_real("clip", self.clip, 0.0, strict=True)
        check_real("weight_decay", self.weight_decay, 0.0, strict=False)
        if self.d_model % self.heads:
            raise ValueError(f"d_model: expected a multiple of heads = {self.heads}, got {self.d_model}")
        if "sliding_window" in self.mixers:
            check_count("window", self.window)

    @property
    def name(self) -> str:
        """The mixer, or the hybrid's mixers joined: "gated_deltanet" / "gated_deltanet+attention"."""
        distinct = list(dict.fromkeys(self.mixers))
        return "+".join(distinct)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    def model(self) -> LanguageModel:
        return LanguageModel(self.mixers, vocab=self.task.vocab, d_model=self.d_model, heads=self.heads,
                             window=self.window, chunk_size=self.chunk_size, seed=self.seed)


def state_bytes(run: Run, bytes_per_element: int = 4) -> int:
    """What the model keeps per sequence while decoding at the task's length, summed over blocks: the fixed
    state of each linear mixer, the KV cache (or window) of each softmax block (float32 by default)."""
    head_dim = run.d_model // run.heads
    total = 0
    for mixer in run.mixers:
        if mixer == "attention":
            spec = cache_accounting.MHA(run.heads, head_dim)
        elif mixer == "sliding_window":
            spec = cache_accounting.SlidingWindow(run.window, run.heads, head_dim)
        else:
            spec = cache_accounting.FixedState(mixer, run.heads, head_dim, head_dim)
        total += spec.bytes(run.task.seq_len, bytes_per_element=bytes_per_element)
    return total


def evaluate(model: LanguageModel, run: Run, examples=None) -> tuple[float, float]:
    """(mean loss, accuracy at the query positions) on the held-out examples, in batches."""
    from ..nn import cross_entropy

    tokens, targets = examples if examples is not None else held_out(run.task, run.eval_size, run.seed)
    losses, correct, counted = [], 0.0, 0
    for start in range(0, len(tokens), run.batch_size):
        t, y = tokens[start:start + run.batch_size], targets[start:start + run.batch_size]
        logits, _ = model.forward(t)
        loss, _, n = cross_entropy(logits, y)
        losses.append(loss * n)
        correct += accuracy(logits, y) * n
        counted += n
    return float(sum(losses) / counted), float(correct / counted)


# --- checkpoints -----------------------------------------------------------------------------------------

def save_checkpoint(path: str, run: Run, model, optimizer, step: int, history: list) -> None:
    """Everything a resumed run needs, written to a temporary file first so an interruption never leaves a
    half-written checkpoint behind."""
    arrays = {f"param.{k}": v for k, v in model.state_dict().items()}
    arrays.update({f"opt.{k}": v for k, v in optimizer.state_dict().items()})
    arrays["step"] = np.asarray(step)
    arrays["history"] = np.asarray(history, dtype=np.float64).reshape(-1, 3)
    arrays["config"] = np.asarray(run.to_json())
    tmp = f"{path}.tmp.npz"
    np.savez(tmp, **arrays)
    os.replace(tmp, path)


def load_checkpoint(path: str, run: Run, model, optimizer) -> tuple[int, list]:
    """Restore model and optimizer from `path`; returns (step reached, history). Refuses a checkpoint of
    another configuration, naming the first setting that differs."""
    with np.load(path) as data:
        saved = json.loads(str(data["config"]))
        mine = json.loads(run.to_json())
        for key in sorted(set(saved) | set(mine)):
            if saved.get(key) != mine.get(key):
                raise ValueError(f"checkpoint {path}: it was made by another configuration ({key} = "
                                 f"{saved.get(key)!r} there, {mine.get(key)!r} here); use another path or the same "
                                 f"settings")
        model.load_state_dict({k[len("param."):]: data[k] for k in data.files if k.startswith("param.")})
        optimizer.load_state_dict({k[len("opt."):]: data[k] for k in data.files if k.startswith("opt.")})
        return int(data["step"]), [tuple(row) for row in data["history"]]


# --- the loop ----------------------------------------------------------------------------------------------

class Progress:
    """One line on stderr, rewritten in place: step, loss, accuracy, tokens/s, time left."""

    def __init__(self, label: str, total: int, stream=None, every_seconds: float = 0.5):
        self.label, self.total, self.stream, self.every = label, total, stream or sys.stderr, every_seconds
        self.start = time.perf_counter()
        self.last = 0.0
        self.interactive = getattr(self.stream, "isatty", lambda: False)()

    def update(self, step, loss, acc, tokens_per_s, first_step, force=False):
        now = time.perf_counter()
        if not force and now - self.last < self.every:
            return
        self.last = now
        done = step - first_step
        left = (self.total - step) * (now - self.start) / max(done, 1)
        acc_text = "-" if acc is None else f"{acc:.3f}"
        line = (f"{self.label}: step {step}/{self.total}  loss {loss:.3f}  acc {acc_text}  "
                f"{tokens_per_s:,.0f} tok/s  {left:.0f} s left")
        if self.interactive:
            self.stream.write("\r" + line.ljust(100))
        elif force:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self):
        if self.interactive:
            self.stream.write("\n")
            self.stream.flush()


def train(run: Run, *, checkpoint: str | None = None, checkpoint_every: int = 100, resume: bool = True,
          progress: bool = True, stop_after: int | None = None) -> dict:
    """Train `run` from scratch, or resume it from `checkpoint` when that file exists (and `resume`).
    Writes the checkpoint every `checkpoint_every` steps and at the end. `stop_after` ends the loop early
    after that many steps of this call (for tests of resumption). Returns the run's record."""
    model = run.model()
    optimizer = AdamW(model, lr=run.lr, weight_decay=run.weight_decay)
    step, history = 0, []
    if checkpoint and resume and os.path.exists(checkpoint):
        step, history = load_checkpoint(checkpoint, run, model, optimizer)
    first_step = step
    examples = held_out(run.task, run.eval_size, run.seed)
    bar = Progress(run.name, run.steps) if progress else None
    start = time.perf_counter()
    train_seconds = 0.0
    acc = history[-1][2] if history else None
    loss = float("nan")
    last = min(run.steps, step + stop_after) if stop_after is not None else run.steps
    try:
        while step < last:
            tokens, targets = batch(run.task, step, run.batch_size, run.seed)
            t0 = time.perf_counter()
            model.zero_grad()
            loss, _ = model.loss_and_grads(tokens, targets)
            clip_grad_norm(model, run.clip)
            optimizer.step(cosine_schedule(step, run.steps, run.lr, run.warmup))
            train_seconds += time.perf_counter() - t0
            step += 1
            if step % run.eval_every == 0 or step == run.steps:
                _, acc = evaluate(model, run, examples)
                history.append((step, loss, acc))
            if checkpoint and (step % checkpoint_every == 0 or step == last):
                save_checkpoint(checkpoint, run, model, optimizer, step, history)
            if bar:
                bar.update(step, loss, acc, (step - first_step) * tokens.size / max(train_seconds, 1e-9),
                           first_step, force=step == last)
    finally:
        if bar:
            bar.close()
    eval_loss, acc = evaluate(model, run, examples)
    seconds = time.perf_counter() - start
    return {"mixer": run.name, "mixers": list(run.mixers), "d_model": run.d_model, "num_kv_pairs": run.task.num_kv_pairs,
            "seq_len": run.task.seq_len, "vocab": run.task.vocab, "state_bytes": state_bytes(run),
            "steps": step, "seconds": round(seconds, 2),
            "tokens_per_s": round((step - first_step) * run.batch_size * run.task.seq_len / max(train_seconds, 1e-9)),
            "loss": round(eval_loss, 4), "train_loss": round(float(loss), 4), "accuracy": round(acc, 4),
            "history": [[int(s), round(float(l), 4), round(float(a), 4)] for s, l, a in history]}
