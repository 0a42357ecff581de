"""`python -m rope_bwd_triton coldstart`: what the first calls cost, as a new training run sees them.

Each implementation runs in a fresh process with empty Triton and inductor caches (new
TRITON_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR): the real call (realcall.py: bf16, q/k views of
one qkv, sdpa's gradient layout) forward + backward at a first S, then at each of a list of
new sizes, then at a size seen before, each timed from the host until the GPU is done.
Loading (imports, get_kernel) is timed apart. For ours the child also records each Triton
compilation of rotary_kernel (its key and time, through Triton's compile hooks).

Every implementation runs once per round (--rounds), each run with caches of its own, in an
order rotated by one each round, so that no implementation always runs first; the table gives
each one's median over rounds with its range (one process per implementation gave Liger-Kernel's
first call as 1153 ms in one run and 1833 ms in another). --profile adds one more child of ours,
untimed, for a cProfile of its first call (the profiler slows the Python it watches).
"""

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from . import REPO_ROOT, cli, output
from .fresh import add_result_argument, run_fresh

IMPLS = ("ours", "liger", "compile", "transformers")
# A first size, then images of other sizes (square grids of 14-pixel patches), across tuning buckets.
SIZES = (1024, 1600, 2304, 3136, 4096, 5184, 784, 6400, 9216, 196, 2500, 3600, 13456)


def _load(impl):
    if impl == "ours":
        from .load import load_kernel

        return load_kernel(build=False).apply_rotary_pos_emb_vision
    if impl == "liger":
        from liger_kernel.transformers.rope import liger_rotary_pos_emb_vision

        return liger_rotary_pos_emb_vision
    from .realcall import _transformers_fn

    if impl == "compile":
        import torch

        return torch.compile(_transformers_fn())
    return _transformers_fn()


def _compile_log():
    """Triton's compile hooks: [(key, seconds)] of every rotary_kernel compilation."""
    import triton

    log, started = [], {}

    def before(*, key, fn, **_):
        started[str(key)] = time.perf_counter()
        return False

    def after(*, key, fn, **_):
        if fn.name == "rotary_kernel":
            log.append((str(key), time.perf_counter() - started.pop(str(key), time.perf_counter())))

    triton.knobs.runtime.jit_cache_hook = before
    triton.knobs.runtime.jit_post_compile_hook = after
    return log


def child(impl, sizes, heads, head_dim, profile_path=None) -> dict:
    """Runs in the fresh process: {load_s, calls: [{S, ms, new, compiles}]}."""
    import torch

    from .realcall import FwdBwd, make_inputs

    t0 = time.perf_counter()
    fn = _load(impl)
    load_s = time.perf_counter() - t0
    log = _compile_log() if impl == "ours" else None
    gen = torch.Generator().manual_seed(0)
    calls, seen = [], set()
    for i, S in enumerate([*sizes, sizes[-1]]):
        call = FwdBwd(fn, make_inputs(S, heads, head_dim, torch.bfloat16, "sdpa", "cuda", gen))
        torch.cuda.synchronize()
        before = len(log) if log is not None else 0
        if i == 0 and profile_path:
            import cProfile
            import pstats

            prof = cProfile.Profile()
            t = time.perf_counter()
            prof.runcall(call)
            torch.cuda.synchronize()
            ms = (time.perf_counter() - t) * 1e3
            with open(profile_path, "w") as f:
                pstats.Stats(prof, stream=f).sort_stats("cumulative").print_stats(60)
        else:
            t = time.perf_counter()
            call()
            torch.cuda.synchronize()
            ms = (time.perf_counter() - t) * 1e3
        calls.append({"S": S, "ms": ms, "new": S not in seen, "compiles": log[before:] if log is not None else None})
        seen.add(S)
    return {"impl": impl, "load_s": load_s, "calls": calls}


def run_child(impl, args, workdir: Path, name, profile=False) -> dict:
    """The child of `impl` in a fresh process (fresh.py) with caches of its own under workdir/`name`;
    `profile`: with a cProfile of its first call written next to --json."""
    argv = [
        "coldstart",
        "--child",
        impl,
        "--sizes",
        *map(str, args.sizes),
        "--heads",
        str(args.heads),
        "--head-dim",
        str(args.head_dim),
    ]
    if profile:
        argv += ["--profile-to", str(args.json.with_suffix(".profile.txt"))]
    return {"impl": impl, **run_fresh(argv, workdir, name)}


def rounds(impls, n):
    """[(round, impl)]: every implementation once per round, the order rotated by one each round."""
    return [(r, impls[(r + i) % len(impls)]) for r in range(n) for i in range(len(impls))]


def _median_range(values, fmt):
    med = statistics.median(values)
    return f"{med:{fmt}}" if len(values) == 1 else f"{med:{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def _failures(runs):
    failed = [r["error"] for r in runs if "error" in r]
    return f"{len(failed)} of {len(runs)} runs failed: {failed[0]}" if failed else ""


def markdown(runs, meta) -> str:
    """One row per implementation over its rounds: medians, with the range over rounds."""
    rows = []
    for impl in dict.fromkeys(r["impl"] for r in runs):
        mine = [r for r in runs if r["impl"] == impl]
        ok = [r for r in mine if "error" not in r]
        if not ok:
            rows.append([impl, "—", "—", "—", "—", "—", _failures(mine)])
            continue
        new = [c["ms"] for r in ok for c in r["calls"][1:] if c["new"]]
        again = [[c["ms"] for c in r["calls"][1:] if not c["new"]][-1] for r in ok]
        compiles = {
            (len(r["calls"][0]["compiles"]), sum(len(c["compiles"]) for c in r["calls"][1:]))
            for r in ok
            if r["calls"][0]["compiles"] is not None
        }
        rows.append(
            [
                impl,
                _median_range([r["load_s"] * 1e3 for r in ok], ".0f"),
                _median_range([r["calls"][0]["ms"] for r in ok], ".0f"),
                f"{statistics.median(new):.1f} ({min(new):.1f}-{max(new):.1f})",
                _median_range(again, ".2f"),
                " / ".join(f"{a} then {b}" for a, b in sorted(compiles)) or "—",
                _failures(mine),
            ]
        )
    v = meta["versions"]
    head = (
        f"First calls of the real call (bf16, {meta['heads']} heads x {meta['head_dim']}, sdpa's gradient "
        f"layout), each implementation in a fresh process with empty Triton/inductor caches, "
        f"{meta['rounds']} round(s) in rotated order, median (range over rounds); {meta['gpu']}, "
        f"torch {v['torch']}, triton {v['triton']}; {meta['date']}. New sizes after the first: "
        f"{', '.join(map(str, meta['sizes'][1:]))}."
    )
    return (
        head
        + "\n\n"
        + output.markdown_table(
            [
                "implementation",
                "load ms",
                "first fwd+bwd ms",
                "each new size ms: median (range)",
                "a seen size ms",
                "rotary_kernel compilations: first call, then",
                "note",
            ],
            rows,
        )
        + "\n"
    )


def add_arguments(parser):
    parser.add_argument(
        "--impls",
        type=cli.subset_of(IMPLS, "implementations"),
        default=list(IMPLS),
        help=f"comma-separated subset of {','.join(IMPLS)}",
    )
    parser.add_argument("--sizes", type=cli.positive_int, nargs="+", default=list(SIZES))
    parser.add_argument("--heads", type=cli.positive_int, default=16)
    parser.add_argument("--head-dim", type=cli.head_dim, default=72)
    parser.add_argument("--rounds", type=cli.positive_int, default=3, help="fresh processes per implementation")
    parser.add_argument(
        "--profile", action="store_true", help="one more, untimed, child of ours: cProfile of its first call"
    )
    parser.add_argument("--json", type=Path, default=REPO_ROOT / "results" / "coldstart.json")
    # The parent's arguments to each fresh child process:
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--profile-to", type=Path, help=argparse.SUPPRESS)
    add_result_argument(parser)


def main(args) -> int:
    if args.child:
        args.child_result.write_text(
            json.dumps(child(args.child, args.sizes, args.heads, args.head_dim, args.profile_to))
        )
        return 0
    import torch

    from .load import use_local_build
    from .runmeta import run_meta

    if not torch.cuda.is_available():
        raise cli.UsageError("coldstart needs a CUDA GPU (it times Triton compilations and GPU calls)")
    use_local_build()  # the children load it with build=False
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        order = rounds(args.impls, args.rounds)
        runs = [{"round": r, **run_child(impl, args, tmp, f"{impl}-{r}")} for r, impl in order]
        if args.profile and "ours" in args.impls:
            run_child("ours", args, tmp, "ours-profiled", profile=True)
    meta = run_meta("cuda", sizes=args.sizes, heads=args.heads, head_dim=args.head_dim, rounds=args.rounds)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"meta": meta, "runs": runs}, indent=1) + "\n")
    text = markdown(runs, meta)
    args.json.with_suffix(".md").write_text(text)
    print(text)
    return 1 if any("error" in r for r in runs) else 0
