"""What the commands' written results share: markdown tables, and plots, which are skipped
with a notice where matplotlib is not installed (the command writes its other results all
the same)."""

import sys
from pathlib import Path


def markdown_table(header, rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def pyplot(command: str, path):
    """matplotlib.pyplot on the file backend; None, with a notice, where matplotlib is not
    installed."""
    try:
        import matplotlib
    except ImportError:
        print(
            f"{command}: matplotlib is not installed, so {path} is not drawn (pip install matplotlib)", file=sys.stderr
        )
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path):
    """Lays fig out, writes it to path (its folder made first) and closes it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
