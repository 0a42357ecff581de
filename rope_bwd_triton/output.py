"""What the commands' recorded results share: the run's own description ("meta"), markdown
tables, and plots, which are skipped with a notice where matplotlib is not installed (the
command writes its other results all the same)."""

import importlib.metadata
import os
import platform
import shlex
import sys
from datetime import UTC, datetime
from pathlib import Path

CPU_NOTE = "CPU run: code-path check only, the timings mean nothing"


def versions() -> dict:
    import torch
    import triton

    found = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton.__version__,
    }
    for dist in ("kernels", "liger-kernel", "transformers"):
        try:
            found[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            found[dist] = None
    return found


def commit() -> str | None:
    """The tree that ran: ROPE_COMMIT where set (a GPU machine gets the files without their git
    history: scripts/gpu.sh release passes it on), else the checkout's short hash, `_dirty` with
    uncommitted changes; None outside git."""
    from .build import git_state

    if os.environ.get("ROPE_COMMIT"):
        return os.environ["ROPE_COMMIT"]
    state = git_state()
    return state and state[0][:7] + ("_dirty" if state[1] else "")


def run_meta(device, *, kernel=None, timer=None, **fields) -> dict:
    """What a recorded run says about itself, so that it can be read and redone: date (UTC),
    commit, command, device, versions; on CUDA the GPU's name, SM count and L2 size, on the CPU gpu
    None and a note. kernel: the loaded variant, recorded by name; timer: the
    timing.ColdL2Timer, its calls and methods. Then the command's own `fields`."""
    import torch

    device = torch.device(device)
    meta = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit(),
        "command": "python -m rope_bwd_triton " + shlex.join(sys.argv[1:]),
        "device": str(device),
        "versions": versions(),
        "tuned_tables": os.environ.get("ROPE_BWD_TUNED", "1") != "0",  # tuning.py's switch
    }
    if kernel is not None:
        meta["kernel_variant"] = kernel.__name__
    if timer is not None:
        meta.update(calls=timer.calls, timer=timer.method, timer_other=timer.other)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        meta.update(gpu=props.name, sm_count=props.multi_processor_count, l2_bytes=props.L2_cache_size)
    else:
        meta.update(gpu=None, note=CPU_NOTE)
    meta.update(fields)
    return meta


def recorded_versions(meta) -> dict:
    """The versions in a saved run's meta: e2e.json files written before run_meta hold them
    flat (benchmarks/RESULTS.md renders those files again with `e2e --from-json`)."""
    return meta.get("versions", meta)


def in_rounds(meta) -> str:
    """How a run's calls were taken, for its header: " in N rotating rounds" (runs from before
    rounds existed timed each implementation's calls at once)."""
    rounds = meta.get("rounds")
    return f" in {rounds} rotating rounds" if rounds else ""


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


def against_s(ax, ylabel: str, title: str):
    """Log-log axes of a figure against S."""
    ax.set(xscale="log", yscale="log", xlabel="S (tokens)", ylabel=ylabel, title=title)


def save_figure(fig, path):
    """Lays fig out, writes it to path (its folder made first) and closes it. A log x axis (S) is
    labelled at powers of two, without the minor labels, which overlap on a narrow range."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    for ax in fig.axes:
        if ax.get_xscale() == "log":
            ax.xaxis.set_major_locator(LogLocator(base=2))
            ax.xaxis.set_major_formatter(ScalarFormatter())
            ax.xaxis.set_minor_formatter(NullFormatter())
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
