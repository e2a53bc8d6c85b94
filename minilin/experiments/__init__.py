"""The chapters' claims as experiments: each is a function that returns its data (no printing);
`minilin tour` prints each one as a table with one sentence of what it shows.

An experiment is registered in EXPERIMENTS as an `Experiment`: a name for `minilin tour NAME`, a title,
the sentence it demonstrates, `run(quick: bool) -> data`, `table(data) -> str` and optionally
`plot(data, path)` (matplotlib, the `plot` extra).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional


@dataclass(frozen=True)
class Experiment:
    name: str
    title: str
    claim: str
    run: Callable[[bool], Any]
    table: Callable[[Any], str]
    plot: Optional[Callable[[Any, str], None]] = None


from . import forms, memory  # noqa: E402  (the registry below needs the dataclass above)

EXPERIMENTS: list[Experiment] = [
    Experiment("forms", "Every mixer, every form",
               "Each mixer's recurrent, chunked and parallel forms compute the same function, with a fixed-size "
               "state where softmax attention keeps a growing KV cache.",
               forms.run, forms.table),
    Experiment("memory", "Memory: KV cache vs fixed state, and a 1:7 hybrid",
               "A softmax layer's KV cache grows linearly with the context while a linear mixer's state stays one "
               "size, so a hybrid with one softmax layer in eight keeps about 1/8 of an all-softmax model's cache "
               "at long context (48 layers, d=4096, bf16).",
               memory.run, memory.table, memory.plot),
]
