"""`minilin train mqar`: small models trained from scratch on the CPU, every gradient from minilin's own
hand-written backward passes, on multi-query associative recall (`mqar`).

    minilin train mqar --quick                       the quick sweep: five models at 8 pairs (about a minute)
    minilin train mqar                               the full sweep: six mixers x three widths, up to 64 pairs
    minilin train mqar --mixers attention deltanet --widths 64 --kv-pairs 8 16 --steps 800
    minilin train mqar --json runs.json --plot plots/ --checkpoint-dir ckpt/

A mixer name stands for a model of `--layers` blocks of that mixer; "a+b" for a hybrid whose blocks cycle
through a, b (`gated_deltanet+attention`: one softmax block in two). Each run prints a progress line
(step, loss, held-out accuracy, tokens/s, time left) and ends with a row of the table; `--json` writes
{"runs": [{"mixer", "d_model", "num_kv_pairs", "state_bytes", "steps", "seconds", "loss", "accuracy", ...}]}.
With --checkpoint-dir every run checkpoints as it goes and resumes from its checkpoint when started again.

The runs go through NumPy's BLAS on one thread with fixed malloc thresholds: a command started otherwise re-runs
itself in a child Python with that environment (`minilin.threads` says why, with what each saved).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from ..threads import is_one_thread, rerun
from .loop import Run, state_bytes, train
from ..validation import check_count
from .mqar import MQAR

# The sweeps (README: what they found, and their measured times on a 2-core CPU). Each number of pairs D gets the
# task of `task_for`; the full sweep trains every width at 8 and 16 pairs and the middle width at 64 (the long
# examples cost the most, and one width there already shows which mixers still recall).
QUICK = dict(mixers=["attention", "linear_attention", "deltanet", "gated_deltanet", "gated_deltanet+attention"],
             groups=[(8, [32])])
FULL = dict(mixers=["attention", "linear_attention", "mamba2", "deltanet", "gated_deltanet", "gated_deltanet+attention"],
            groups=[(8, [16, 32, 64]), (16, [16, 32, 64]), (64, [32])])
TOKENS_PER_STEP = 1536
LR = 5e-3


def task_for(num_kv_pairs: int, seq_len: int | None = None, vocab: int | None = None) -> tuple[MQAR, int, int]:
    """(task, batch size, steps) for D pairs: examples of 3 D tokens (at least 48) from a vocabulary just large
    enough for D distinct keys (at least 32), batches of about TOKENS_PER_STEP tokens, and 600 steps (1200 past
    16 pairs, where softmax attention needs them: measured, it reaches 100% at 64 pairs in 1200)."""
    D = num_kv_pairs
    seq_len = max(48, 3 * D) if seq_len is None else seq_len  # a 0 given is refused by MQAR, not replaced
    vocab = max(32, 2 * D + 2) if vocab is None else vocab
    return MQAR(vocab=vocab, seq_len=seq_len, num_kv_pairs=D), max(4, TOKENS_PER_STEP // seq_len), 600 if D <= 16 else 1200


def register(subparsers) -> None:
    p = subparsers.add_parser("train", help="train small models on the CPU with minilin's own gradients",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("task", choices=["mqar"], help="the task (mqar: multi-query associative recall)")
    p.add_argument("--quick", action="store_true", help="the quick sweep (five models, one size)")
    p.add_argument("--mixers", nargs="+", metavar="NAME", help="mixers (a+b for a hybrid), default: the sweep's")
    p.add_argument("--widths", nargs="+", type=int, metavar="D", help="model widths d_model")
    p.add_argument("--kv-pairs", nargs="+", type=int, metavar="N", help="key-value pairs per example")
    p.add_argument("--layers", type=int, default=2, help="blocks per model (default 2)")
    p.add_argument("--heads", type=int, default=2, help="heads per mixer (default 2)")
    p.add_argument("--steps", type=int, help="training steps per run")
    p.add_argument("--batch-size", type=int, help="examples per step (default: the sweep's)")
    p.add_argument("--lr", type=float, help="peak learning rate (AdamW, cosine schedule; default: the sweep's)")
    p.add_argument("--seq-len", type=int, help="tokens per example (default: max(48, 3 x pairs))")
    p.add_argument("--vocab", type=int, help="vocabulary size (default: max(32, 2 x pairs + 2))")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="PATH", help="write the runs as JSON")
    p.add_argument("--plot", metavar="DIR", help="draw accuracy against state size (needs matplotlib)")
    p.add_argument("--checkpoint-dir", metavar="DIR", help="checkpoint each run there and resume from it")
    p.set_defaults(func=main)


def model_mixers(spec: str, layers: int) -> list[str]:
    """"gated_deltanet" -> that mixer in every block; "a+b" -> blocks cycling through a, b."""
    parts = spec.split("+")
    return [parts[i % len(parts)] for i in range(layers)]


def runs_of(args) -> list[Run]:
    sweep = QUICK if args.quick else FULL
    mixers = args.mixers or sweep["mixers"]
    if args.kv_pairs or args.widths:
        groups = [(D, args.widths or sorted({w for _, ws in sweep["groups"] for w in ws}))
                  for D in (args.kv_pairs or [D for D, _ in sweep["groups"]])]
    else:
        groups = sweep["groups"]
    check_count("layers", args.layers)
    runs = []
    for D, widths in groups:
        task, batch_size, steps = task_for(D, args.seq_len, args.vocab)
        for width in widths:
            for spec in mixers:
                runs.append(Run(mixers=model_mixers(spec, args.layers), d_model=width, heads=args.heads, task=task,
                                steps=steps if args.steps is None else args.steps,  # 0 given: refused by Run
                                batch_size=batch_size if args.batch_size is None else args.batch_size,
                                lr=LR if args.lr is None else args.lr, seed=args.seed))
    return runs


def table(records) -> str:
    head = "| mixer | d_model | pairs | state bytes | steps | seconds | tokens/s | loss | accuracy |"
    rows = [head, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in records:
        rows.append(f"| {r['mixer']} | {r['d_model']} | {r['num_kv_pairs']} | {r['state_bytes']:,} | {r['steps']} | "
                    f"{r['seconds']:.1f} | {r['tokens_per_s']:,} | {r['loss']:.3f} | {r['accuracy']:.3f} |")
    return "\n".join(rows)


def main(args) -> int:
    if not is_one_thread():
        return rerun(args.argv)
    try:
        runs = runs_of(args)
        if args.plot:
            import matplotlib  # noqa: F401 - fail before training when matplotlib is missing
    except (ValueError, TypeError) as error:
        print(f"minilin train: {error}", file=sys.stderr)
        return 2
    except ImportError:
        print('minilin train --plot needs matplotlib: pip install matplotlib (or pip install -e ".[plot]")',
              file=sys.stderr)
        return 2
    if args.checkpoint_dir:
        os.makedirs(args.checkpoint_dir, exist_ok=True)
    start = time.perf_counter()
    records = []
    for i, run in enumerate(runs, 1):
        print(f"[{i}/{len(runs)}] {run.name}, d_model {run.d_model}, {run.task.num_kv_pairs} pairs, "
              f"state {state_bytes(run):,} bytes", file=sys.stderr, flush=True)
        checkpoint = None
        if args.checkpoint_dir:
            checkpoint = os.path.join(args.checkpoint_dir, f"{run.name}-d{run.d_model}-kv{run.task.num_kv_pairs}.npz")
        try:
            records.append(train(run, checkpoint=checkpoint))
        except ValueError as error:
            print(f"minilin train: {error}", file=sys.stderr)
            return 2
    print(table(records))
    print(f"\n{len(records)} run(s) in {time.perf_counter() - start:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": records}, f, indent=2)
    if args.plot:
        from .plot import accuracy_against_state

        path = accuracy_against_state(records, args.plot)
        print(f"plot: {path}")
    return 0
