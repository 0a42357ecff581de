"""`python -m rope_bwd_triton overhead`: what the rotary costs besides its GPU time, on a CUDA GPU.

Two parts (--parts), each measured in fresh processes with empty Triton and inductor caches:
    first-call  the first calls of ours and the peers, as a new training run sees them
                (firstcall.py): loading, the first forward + backward, new sizes, a seen one
    host        host time per call of each layer of the launch path and of the peers, and
                of never-seen sizes (hosttime.py), with the package's fast launch on and off
Writes --json (the parts' results and the run's meta) and the markdown next to it (.md), and
prints the markdown.
"""

import argparse
import json
import tempfile
from pathlib import Path

from . import REPO_ROOT, cli, firstcall, hosttime
from .fresh import add_result_argument, run_fresh

PARTS = ("first-call", "host")
FAST_LAUNCH = {"on": "1", "off": "0"}  # ROPE_BWD_FAST_LAUNCH of each setting


def add_arguments(parser):
    parser.add_argument("--parts", type=cli.subset_of(PARTS, "parts"), default=list(PARTS), help=",".join(PARTS))
    parser.add_argument(
        "--impls",
        type=cli.subset_of(firstcall.IMPLS, "implementations"),
        default=list(firstcall.IMPLS),
        help=f"first-call: comma-separated subset of {','.join(firstcall.IMPLS)}",
    )
    parser.add_argument("--sizes", type=cli.positive_int, nargs="+", default=list(firstcall.SIZES), help="first-call")
    parser.add_argument("--heads", type=cli.positive_int, default=16, help="first-call")
    parser.add_argument("--head-dim", type=cli.head_dim, default=72, help="first-call")
    parser.add_argument("--rounds", type=cli.positive_int, default=3, help="first-call: fresh processes per impl")
    parser.add_argument("--profile", action="store_true", help="first-call: a cProfile of ours' first call too")
    parser.add_argument(
        "--fast-launch",
        type=cli.subset_of(FAST_LAUNCH, "settings"),
        default=list(FAST_LAUNCH),
        help="host: the package's fast launch on, off or both (ROPE_BWD_FAST_LAUNCH)",
    )
    parser.add_argument("--no-compile", action="store_true", help="host: leave out the torch.compile rows")
    parser.add_argument("--json", type=Path, default=REPO_ROOT / "results" / "overhead.json")
    # The parent's arguments to each fresh child process:
    parser.add_argument("--child", help=argparse.SUPPRESS)  # an implementation (first call) or "host"
    parser.add_argument("--profile-to", type=Path, help=argparse.SUPPRESS)
    add_result_argument(parser)


def _child(args) -> dict:
    if args.child == "host":
        return hosttime.child(not args.no_compile)
    return firstcall.child(args.child, args.sizes, args.heads, args.head_dim, args.profile_to)


def _first_calls(args, tmp: Path) -> list:
    argv = ["overhead", "--sizes", *map(str, args.sizes), "--heads", str(args.heads), "--head-dim", str(args.head_dim)]
    runs = [
        {"round": r, "impl": impl, **run_fresh([*argv, "--child", impl], tmp, f"{impl}-{r}")}
        for r, impl in firstcall.rounds(args.impls, args.rounds)
    ]
    if args.profile and "ours" in args.impls:
        profile = ["--profile-to", str(args.json.with_suffix(".profile.txt"))]
        run_fresh([*argv, "--child", "ours", *profile], tmp, "ours-profiled")
    return runs


def main(args) -> int:
    if args.child:
        args.child_result.write_text(json.dumps(_child(args)))
        return 0
    import torch

    from .load import use_local_build
    from .output import run_meta

    if not torch.cuda.is_available():
        raise cli.UsageError("overhead times Triton compilations and host time around GPU calls: it needs a CUDA GPU")
    use_local_build()  # the children load it with build=False
    report = {}
    with tempfile.TemporaryDirectory() as tmp:
        if "first-call" in args.parts:
            report["first_call"] = _first_calls(args, Path(tmp))
        if "host" in args.parts:
            argv = ["overhead", "--child", "host"] + (["--no-compile"] if args.no_compile else [])
            report["host"] = {
                setting: run_fresh(argv, Path(tmp), f"host-{setting}", ROPE_BWD_FAST_LAUNCH=FAST_LAUNCH[setting])
                for setting in args.fast_launch
            }
    meta = run_meta("cuda", sizes=args.sizes, heads=args.heads, head_dim=args.head_dim, rounds=args.rounds)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"meta": meta, **report}, indent=1) + "\n")
    parts = []
    if "first_call" in report:
        parts.append(firstcall.markdown(report["first_call"], meta))
    if "host" in report:
        parts.append(hosttime.markdown(report["host"], meta))
    text = "\n".join(parts)
    args.json.with_suffix(".md").write_text(text)
    print(text)
    failed = any("error" in r for r in report.get("first_call", [])) or any(
        "error" in r for r in report.get("host", {}).values()
    )
    return 1 if failed else 0
