"""The plots' shared boilerplate. matplotlib (the `plot` extra) is imported only when a plot is drawn,
so the experiments and the tour run without it."""
from __future__ import annotations


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


def save(fig, path: str) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
