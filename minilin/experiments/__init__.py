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
               forms.run, forms.table, forms.plot),
    Experiment("memory", "Memory: KV cache vs fixed state, and a 1:7 hybrid",
               "A softmax layer's KV cache grows linearly with the context while a linear mixer's state stays one "
               "size, so a hybrid with one softmax layer in eight keeps about 1/8 of an all-softmax model's cache "
               "at long context (48 layers, d=4096, bf16).",
               memory.run, memory.table, memory.plot),
]

from . import (bracket, capacity, cost, exactness, fact_update, fixed_decay, gradients,  # noqa: E402
               interference, recall, softmax_amplification, state_tracking, trained_recall, write_rules)

EXPERIMENTS += [
    Experiment("bracket", "The bracket move",
               "(QK^T)V costs 4 n^2 d FLOPs and Q(K^T V) 4 n d^2, so the two orders cross at n = d and past it the "
               "state-first order wins by n/d; the table also gives where the measured times cross on this CPU.",
               bracket.run, bracket.table, bracket.plot),
    Experiment("exactness", "Exactness of the bracket move",
               "For the same feature map the left bracket (parallel form) and the right bracket (recurrence) give "
               "the same outputs to float64 rounding (~1e-16 relative): moving the bracket changes the cost, not "
               "the result.",
               exactness.run, exactness.table, exactness.plot),
    Experiment("capacity", "Capacity of a d x d state",
               "An additive d x d memory returns n orthogonal pairs exactly up to n = d and fails past it; with "
               "random unit keys its read-back error grows like sqrt((n-1)/d) from the first pair, while softmax on "
               "the same pairs keeps the same log-weight gap between the right pair and each wrong one at every n.",
               capacity.run, capacity.table, capacity.plot),
    Experiment("interference", "Interference: own term vs cross-talk",
               "A read returns its own pair's value at full strength plus cross-talk from every other pair: zero "
               "for orthogonal keys until n passes d, and for random keys a sum of many small terms that grows "
               "like sqrt((n-1)/d) and overtakes the own term near n = d.",
               interference.run, interference.table, interference.plot),
    Experiment("softmax_amplification", "Softmax amplification",
               "Kernel feature maps (elu+1, relu) give the right pair only a few times the weight of each wrong pair "
               "(FAVOR+, a noisy estimate of the softmax kernel, more), so the n - 1 wrong pairs soon take most of "
               "the weight; softmax exponentiates the score gap (a ratio of about e^sqrt(d) at the usual 1/sqrt(d) "
               "scale: ~190 at d = 32, ~2000 at d = 64) and keeps most of the weight on the right pair.",
               softmax_amplification.run, softmax_amplification.table, softmax_amplification.plot),
    Experiment("fixed_decay", "Fixed decay: how fast an item fades",
               "Under RetNet's fixed decays a written item fades exactly as gamma^t (half-lives of 22 to 2839 "
               "tokens over 8 heads); with a new pair written every token, the later pairs' cross-talk buries it "
               "within about d writes in every head, and slower heads only pile up more of it.",
               fixed_decay.run, fixed_decay.table, fixed_decay.plot),
    Experiment("write_rules", "Write rules: additive vs delta",
               "The delta rule (beta = 1) reads its newest pair back exactly and has a lower reconstruction error "
               "than additive writes, but each write erases part of the older pairs: past n = d it recalls old pairs "
               "far worse than the additive rule, whose own terms stay at full strength under unbiased cross-talk; "
               "beta = 0.5 sits in between in recall of old pairs, and has the lowest error once n >= d.",
               write_rules.run, write_rules.table, write_rules.plot),
    Experiment("fact_update", "Updating a fact",
               "When a key's value changes, the delta rule (beta = 1, unit keys), gated or not, reads back the new "
               "value exactly at the update, while the additive rule keeps the old value in the read (off by about "
               "its norm) and additive decay only fades it.",
               fact_update.run, fact_update.table, fact_update.plot),
    Experiment("recall", "Far-key recall",
               "With random keys and hand-set writes softmax recalls every token id at every n; linear attention "
               "degrades slowly past n = d; DeltaNet and Gated DeltaNet, whose writes erase older pairs, lose the "
               "far (oldest) keys first and recall fewer pairs than linear attention once n >= d.",
               recall.run, recall.table, recall.plot),
    Experiment("state_tracking", "State tracking: parity",
               "A one-dimensional delta rule tracks parity exactly at every length when beta may reach 2 (a 1 bit "
               "multiplies the state by -1); with beta in [0, 1] the best of a grid of hand-set settings, read "
               "through a threshold, falls to chance as the strings grow.",
               state_tracking.run, state_tracking.table, state_tracking.plot),
    Experiment("cost", "Cost against sequence length",
               "Recurrent and chunked forms grow about linearly with the sequence length and softmax attention "
               "quadratically; the chunked form is the faster linear one because it works in large matrix "
               "products (this CPU always; the CUDA benchmark when a GPU and the extension are present).",
               cost.run, cost.table, cost.plot),
    Experiment("gradients", "Gradients: the backward pass, recurrent and chunked",
               "Each mixer's backward is written by hand twice: the state's adjoint run back token by token, and "
               "chunk by chunk with the work inside each chunk as matrix products; the two agree to float64 "
               "rounding and with finite differences, and the chunked one is the faster.",
               gradients.run, gradients.table, gradients.plot),
    Experiment("trained_recall", "Recall after training (MQAR)",
               "Trained from scratch on multi-query associative recall with minilin's own gradients, softmax "
               "attention answers the queries, plain linear attention does not, and the delta rule (DeltaNet, "
               "Gated DeltaNet) and a hybrid with one softmax block recover it.",
               trained_recall.run, trained_recall.table, trained_recall.plot),
]
