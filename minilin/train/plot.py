"""`minilin train mqar --plot DIR`: held-out accuracy against the bytes of state each model keeps per
sequence, one line per mixer (its widths joined), one panel per number of key-value pairs."""
from __future__ import annotations

import os
import textwrap

SENTENCE = ("MQAR recall of trained models against the memory they keep per sequence: softmax attention keeps "
            "every token; a fixed state holds only so many pairs.")


def accuracy_against_state(records, directory: str) -> str:
    """Draw the records' accuracy against state_bytes into DIR/mqar.png; returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pairs = sorted({r["num_kv_pairs"] for r in records})
    fig, axes = plt.subplots(1, len(pairs), figsize=(5.0 * len(pairs), 4.2), squeeze=False)
    for ax, D in zip(axes[0], pairs):
        for mixer in dict.fromkeys(r["mixer"] for r in records):
            rows = sorted((r for r in records if r["mixer"] == mixer and r["num_kv_pairs"] == D),
                          key=lambda r: r["state_bytes"])
            if rows:
                ax.plot([r["state_bytes"] for r in rows], [r["accuracy"] for r in rows], marker="o", label=mixer)
        ax.set_xscale("log")
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("state per sequence (bytes, float32, log scale)")
        ax.set_ylabel("held-out accuracy at the queries")
        ax.set_title(f"{D} key-value pairs")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("\n".join(textwrap.wrap(SENTENCE, 110)), fontsize=9.5)
    fig.tight_layout()
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "mqar.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
