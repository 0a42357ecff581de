"""The repository's own toolkit (not shipped to the Hub): offline build of the Hub
variants, benchmarks (the demo among them), end-to-end training timing, overheads, tuning
and publishing. Run as `python -m rope_bwd_triton <command>`."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
