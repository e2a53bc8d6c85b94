"""The plots' shared boilerplate. matplotlib (the `plot` extra) is imported only when a plot is drawn,
so the experiments and the tour run without it.

Every figure carries, above its axes, the sentence its experiment demonstrates (the claim registered in
experiments/__init__.py, looked up by the experiment's name), and under it, in red, each measured claim the
run did not reproduce ("not reproduced in this run: ...").
"""
from __future__ import annotations

import textwrap

CLAIM_FONT_PT = 9.5
LINE_INCHES = 0.2  # the height of one line of the header at CLAIM_FONT_PT


def subplots(ncols: int = 1, width: float = 5.5, height: float = 4.2):
    """A figure with `ncols` axes side by side, drawn off-screen (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, height), squeeze=False)
    return fig, list(axes[0])


def plain_ticks(ax, ticks) -> None:
    """Label a log-scaled x axis at exactly these values, as plain numbers."""
    from matplotlib.ticker import NullFormatter

    ax.set_xticks(list(ticks))
    ax.set_xticklabels([str(t) for t in ticks])
    ax.xaxis.set_minor_formatter(NullFormatter())


def claim(name: str) -> str:
    """The sentence experiment `name` demonstrates, as the tour prints it."""
    from . import EXPERIMENTS

    for e in EXPERIMENTS:
        if e.name == name:
            return e.claim
    raise ValueError(f"name: expected an experiment's name, one of {[e.name for e in EXPERIMENTS]}, got {name!r}")


def header_lines(fig, name: str, not_reproduced=()) -> list[tuple[str, str]]:
    """The header's lines as (text, color): the claim wrapped to the figure's width, then each
    "not reproduced in this run: ..." line in red."""
    chars = max(40, int(fig.get_figwidth() * 72 / (CLAIM_FONT_PT * 0.6)))
    wrap = textwrap.TextWrapper(chars, break_long_words=False, break_on_hyphens=False).wrap
    lines = [(line, "black") for line in wrap(claim(name))]
    for note in not_reproduced:
        lines += [(line, "#b00000") for line in wrap(note)]
    return lines


def save(fig, path: str, name: str, not_reproduced=()) -> list[str]:
    """Put the header above the axes (the figure grows by its height), lay out and write the PNG.

    name: the experiment's name (for its claim); not_reproduced: the lines saying which measured claims this
    run did not reproduce (experiments/_timing.not_reproduced). Returns the header's text, line by line."""
    import matplotlib.pyplot as plt

    lines = header_lines(fig, name, not_reproduced)
    header = (len(lines) + 0.6) * LINE_INCHES
    width, height = fig.get_size_inches()
    fig.set_size_inches(width, height + header)
    top = 1 - header / (height + header)
    for i, (text, color) in enumerate(lines):
        fig.text(0.01, 1 - (0.3 + i) * LINE_INCHES / (height + header), text, ha="left", va="top",
                 fontsize=CLAIM_FONT_PT, color=color, fontweight="bold" if color != "black" else "normal")
    fig.tight_layout(rect=(0, 0, 1, top))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [text for text, _ in lines]
