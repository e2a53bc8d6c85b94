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
    mixers = list(dict.fromkeys(r["mixer"] for r in records))
    markers = "osD^vP*Xh"
    fig, axes = plt.subplots(1, len(pairs), figsize=(5.0 * len(pairs), 4.4), squeeze=False)
    for ax, D in zip(axes[0], pairs):
        for i, mixer in enumerate(mixers):
            rows = sorted((r for r in records if r["mixer"] == mixer and r["num_kv_pairs"] == D),
                          key=lambda r: r["state_bytes"])
            if rows:
                # Markers of decreasing size, so that mixers at the same point stay visible one inside another.
                ax.plot([r["state_bytes"] for r in rows], [r["accuracy"] for r in rows], marker=markers[i % 9],
                        markersize=11 - i, fillstyle="none" if i % 2 else "full", label=mixer)
        widths = sorted({r["d_model"] for r in records if r["num_kv_pairs"] == D})
        ax.set_xscale("log")
        ax.set_ylim(-0.02, 1.05)
        ax.set_xlabel("state per sequence (bytes, float32, log scale)")
        ax.set_ylabel("held-out accuracy at the queries")
        ax.set_title(f"{D} key-value pairs (d_model {', '.join(map(str, widths))})", fontsize=10)
        ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(mixers), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 0.9))
    fig.suptitle("\n".join(textwrap.wrap(SENTENCE, 110)), fontsize=9.5)
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "mqar.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
