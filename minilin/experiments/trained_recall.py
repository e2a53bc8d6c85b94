"""Trained recall: multi-query associative recall (MQAR) learned from scratch, every gradient from minilin's own
hand-written backward passes (`minilin.nn`, `minilin.train`).

The other recall experiments write their pairs by hand. Here small two-block models learn the task (Arora et al.
2023, "Zoology"): read D key-value pairs, then answer D queries, one per key. What the literature reports on
trained models, and what this measures on the CPU: softmax attention, which keeps every token, solves it; plain
linear attention, whose additive writes pile up cross-talk in its fixed state, does not; the delta rule, which
corrects what the state already holds before it writes, recovers it (DeltaNet, Gated DeltaNet), and so does a
hybrid with one softmax block.

Default: the quick sweep of `minilin train mqar --quick` (five models, d_model 32, 8 pairs, 600 steps each;
about a minute and a half on 2 cores), whose records are cached under ~/.cache/minilin (or $MINILIN_CACHE) by their configuration, so
a second tour reads them back. Quick: a smaller sweep of three models (d_model 16, 4 pairs, 24 tokens), a few
seconds. Accuracy is measured on held-out examples, at the query positions only.
"""
from __future__ import annotations

import hashlib
import json
import os

from . import _plot, _timing

QUICK_MIXERS = ("attention", "linear_attention", "gated_deltanet")


def _runs(quick: bool):
    from ..train import QUICK, model_mixers, task_for
    from ..train.loop import Run
    from ..train.mqar import MQAR

    if quick:
        task = MQAR(vocab=16, seq_len=24, num_kv_pairs=4)
        return [Run(mixers=model_mixers(m, 2), d_model=16, heads=2, task=task, steps=300, batch_size=32, lr=1e-2,
                    eval_size=128) for m in QUICK_MIXERS]
    (D, widths), = QUICK["groups"]
    task, batch_size, steps = task_for(D)
    return [Run(mixers=model_mixers(m, 2), d_model=w, heads=2, task=task, steps=steps, batch_size=batch_size, lr=5e-3)
            for w in widths for m in QUICK["mixers"]]


def cache_path(runs) -> str:
    """Where the records of these runs are kept: a name from their configurations."""
    key = hashlib.sha256("\n".join(run.to_json() for run in runs).encode()).hexdigest()[:16]
    root = os.environ.get("MINILIN_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "minilin")
    return os.path.join(root, f"mqar-{key}.json")


def run(quick: bool = False) -> dict:
    from ..threads import is_one_thread
    from ..train.loop import train

    runs = _runs(quick)
    path = cache_path(runs)
    source = "trained in this run"
    records = None
    if not quick and os.path.exists(path):
        with open(path) as f:
            records = json.load(f)["runs"]
        source = f"read back from {path}"
    if records is None:
        if is_one_thread():
            records = [train(r, progress=False) for r in runs]
        else:
            records = _timing.single_threaded(train_records, quick=quick)
        if not quick:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                json.dump({"runs": records}, f, indent=1)
    data = {"records": records, "source": source, "quick": quick}
    data["checks"] = checks(data)
    return data


def train_records(quick: bool) -> list:
    """The records of the sweep, trained in this process (the timing child: one BLAS thread)."""
    from ..train.loop import train

    return [train(r, progress=False) for r in _runs(quick)]


def checks(data: dict) -> list[dict]:
    acc = {r["mixer"]: r["accuracy"] for r in data["records"]}
    out = [{"claim": "softmax attention solves it (at least 90% of the queries)",
            "reproduced": acc.get("attention", 0) >= 0.9, "measured": f"{acc.get('attention', 0):.0%}"}]
    if "linear_attention" in acc:
        out.append({"claim": "plain linear attention falls well short (at least 30 points below softmax attention)",
                    "reproduced": acc["linear_attention"] <= acc.get("attention", 1) - 0.3,
                    "measured": f"{acc['linear_attention']:.0%}"})
    delta = {m: a for m, a in acc.items() if m in ("deltanet", "gated_deltanet")}
    if delta:
        worst = min(delta, key=delta.get)
        out.append({"claim": "the delta rule recovers it (at least 90%)", "reproduced": delta[worst] >= 0.9,
                    "measured": ", ".join(f"{m} {a:.0%}" for m, a in delta.items())})
    hybrids = {m: a for m, a in acc.items() if "+" in m and "attention" in m.split("+")}
    if hybrids:
        worst = min(hybrids, key=hybrids.get)
        out.append({"claim": "a hybrid with one softmax block recovers it (at least 90%)",
                    "reproduced": hybrids[worst] >= 0.9,
                    "measured": ", ".join(f"{m} {a:.0%}" for m, a in hybrids.items())})
    return out


def table(data: dict) -> str:
    r0 = data["records"][0]
    lines = [f"{r0['num_kv_pairs']} pairs, {r0['seq_len']} tokens, vocabulary {r0['vocab']}, two blocks; "
             f"{data['source']}",
             "| mixer | d_model | state bytes per sequence | steps | seconds | held-out accuracy |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in data["records"]:
        lines.append(f"| {r['mixer']} | {r['d_model']} | {r['state_bytes']:,} | {r['steps']} | {r['seconds']:.1f} | "
                     f"{r['accuracy']:.1%} |")
    return "\n".join(lines + _timing.not_reproduced(data["checks"]))


def plot(data: dict, path: str) -> None:
    fig, (ax,) = _plot.subplots(1, width=6.0)
    records = data["records"]
    ax.bar(range(len(records)), [r["accuracy"] for r in records], color="tab:blue", label="held-out accuracy")
    ax.set_xticks(range(len(records)))
    ax.set_xticklabels([r["mixer"].replace("+", "+\n") for r in records], fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("accuracy at the queries")
    ax.set_xlabel(f"mixer (two blocks, d_model {records[0]['d_model']}, {records[0]['num_kv_pairs']} pairs)")
    ax.legend(fontsize=8)
    _plot.save(fig, path, "trained_recall", _timing.not_reproduced(data["checks"]))
