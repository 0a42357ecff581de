"""`python -m rope_bwd_triton <command>`: each command lives in its own module,
which defines add_arguments(parser) and main(args). A bad argument is one line on
stderr and exit status 2 (see cli.py)."""

import argparse
import importlib
import sys

from .cli import UsageError


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        # one line (argparse would print the usage first); status 2 as argparse
        self.exit(2, f"{self.prog}: error: {message}\n")


COMMANDS = {
    "build": "build the Hub variants into build/ (torch-cuda, torch-cpu)",
    "api": "check the package's public API against api/v<version>.json (a removal or change needs a version "
    "bump); --write regenerates it",
    "bench": "verify, then time ours against the byte floor, a copy of its bytes and the peers, by preset: "
    "suite (the 16 public workloads and the scaling sizes; the demo), realcall (the models' call), copybound "
    "(the best plain Triton copy); JSON, markdown, plot, a table",
    "e2e": "time a Qwen3-Omni vision-encoder training step: eager, kernelized, identity rotary; --varres: "
    "images of varying size, each variant in a fresh process",
    "overhead": "first calls in fresh processes with empty caches, and host time per call (fast launch on and off)",
    "tune": "search launch configurations on this GPU; write torch-ext/rope_bwd/configs/<GPU>.json",
    "results": "write RESULTS.md's GPU sections and the README's performance table from the release records in "
    "benchmarks/<gpu>/ (--check: only compare); --release: a release run's summary (scripts/gpu.sh release)",
    "publish": "write CARD.md (the Hub card) from README.md's card part, then upload build/ and the card to the Hub "
    "(or --card-only, --dry-run, --to-cache)",
}


def main(argv=None) -> int:
    parser = _Parser(prog="python -m rope_bwd_triton", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    modules = {}
    for name, help_ in COMMANDS.items():
        modules[name] = importlib.import_module(f"rope_bwd_triton.{name}")
        modules[name].add_arguments(sub.add_parser(name, help=help_, description=help_))
    args = parser.parse_args(argv)
    try:
        return modules[args.command].main(args) or 0
    except UsageError as e:
        parser.exit(2, f"{parser.prog} {args.command}: error: {e}\n")


if __name__ == "__main__":
    sys.exit(main())
