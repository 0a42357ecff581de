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
    "demo": "the main job, bench with a preset: build, load through get_kernel, verify and time ours on the 16 "
    "public workloads; table, JSON, plot",
    "bench": "time ours and the peers against the byte floor (cold L2); JSON, markdown, plot",
    "realcall": "time the real model's call (views of qkv, sdpa's gradient layout) against a copy and the peers",
    "coldstart": "first calls in fresh processes with empty Triton caches: ours and the peers",
    "host": "host time per call of each layer of the launch path, and of a never-seen S",
    "copybound": "ours against the best plain Triton copy of each task's bytes on the 16 public workloads",
    "ncu": "Nsight Compute counters of our kernel and of a streaming kernel over the same bytes: metrics, run, report",
    "crosstriton": "our kernel compiled by another Triton version (compile: any machine), checked and timed beside "
    "this machine's Triton (run: a CUDA GPU)",
    "tune": "search launch configurations on this GPU; write torch-ext/rope_bwd/configs/<GPU>.json",
    "attncheck": "whether this torch's attention backward follows the upstream gradient's strides from call to call "
    "(sdpa per image on slices of one batch's gradient), against float64",
    "e2e": "time a Qwen3-Omni vision-encoder training step: eager, kernelized, identity rotary",
    "card": "write CARD.md (the Hub card) from README.md's card part",
    "publish": "upload build/ and the card to branch v<version> of the Hub repo (or --dry-run, --to-cache)",
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
