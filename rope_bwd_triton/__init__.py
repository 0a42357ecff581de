"""The repository's own toolkit (not shipped to the Hub): offline build of the Hub
variants, the workload suite, verification, benchmark, tuning, end-to-end timing,
publishing and the demo. Run as `python -m rope_bwd_triton <command>`."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
