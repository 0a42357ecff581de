"""`python -m rope_bwd_triton copybound`: what a kernel that only streams a task's bytes takes
at the suite's sizes. On the 16 public workloads, ours (the benchmark's own calls, verification
and timer) against the best of a few plain Triton copies of each task's floor bytes (half read,
half written, int32 elements) and the benchmark's device copy. The floor (bytes / bandwidth of a
1 GiB copy) has no per-call cost; a streaming kernel pays its launch, first DRAM round trip and
tail at every size, so its suite mean shows how close to the floor any kernel that moves these
bytes gets on this GPU.

It is `bench --set suite --peers copy` with the Triton copies timed after each workload, on the
same timer; the JSON is that bench run, each workload with its "triton_copy" (us, BLOCK,
num_warps) per task. `--quick` exercises the code path on the CPU in Triton's interpreter
(TRITON_INTERPRET=1): one tiny workload, the timings mean nothing there."""

import json
import os
import statistics
from pathlib import Path

from . import REPO_ROOT, cli

CONFIGS = ((2048, 4), (4096, 8), (8192, 8))  # (BLOCK, num_warps): the copy's best is kept per size
SAME_BYTES = {"fwd": "bwd_qk"}  # tasks whose floor bytes equal another's: its copy is timed once


def best_copy(timer, nbytes):
    """(mean us, BLOCK, num_warps) of the fastest CONFIGS copy of nbytes // 2 bytes."""
    import torch
    import triton

    from .timing import rope_bench_copy

    n = nbytes // 8
    src = torch.randint(0, 1 << 20, (n,), dtype=torch.int32, device=timer.device)
    dst = torch.empty_like(src)
    best = None
    for block, warps in CONFIGS:

        def copy():
            # the timer's own copy kernel, loads at the default eviction priority
            rope_bench_copy[(triton.cdiv(n, block),)](src, dst, n, BLOCK=block, EVICTION="", num_warps=warps)

        dst.fill_(-1)
        copy()
        if not torch.equal(src, dst):
            raise AssertionError(f"copy of {n} elements with BLOCK={block} is wrong")
        us = timer(copy).mean_us
        if best is None or us < best[0]:
            best = (us, block, warps)
    return best


def triton_copies(timer, w, bar):
    """bench's after_workload: checks that every implementation passed, then times the best
    Triton copy of each task's floor bytes (w["triton_copy"])."""
    bad = [n for n, r in w["results"].items() if not r.get("verify", {}).get("ok")]
    if bad:
        raise AssertionError(f"S={w['S']}: {bad} failed verification or did not run")
    copies = {task: best_copy(timer, floor["bytes"]) for task, floor in w["floors"].items() if task not in SAME_BYTES}
    w["triton_copy"] = {task: copies[SAME_BYTES.get(task, task)] for task in w["floors"]}
    bar.write(
        f"S={w['S']}: "
        + ", ".join(f"{t} {_us(w, 'ours_' + t):.2f} / {w['triton_copy'][t][0]:.2f} us" for t in w["floors"])
    )


def _us(w, name):
    return w["results"][name]["time"]["mean_us"]


def summary(run) -> list:
    """[(task, floor, ours, triton copy, device copy)], suite means in us."""
    ws = run["workloads"]
    out = []
    for task in ws[0]["floors"]:

        def mean(get):
            return statistics.fmean(get(w) for w in ws)

        out.append(
            (
                task,
                mean(lambda w: w["floors"][task]["us"]),
                mean(lambda w: _us(w, "ours_" + task)),
                mean(lambda w: w["triton_copy"][task][0]),
                mean(lambda w: _us(w, "copy_" + task)),
            )
        )
    return out


def add_arguments(parser):
    parser.add_argument("--json", type=Path, default=REPO_ROOT / "results" / "copy-bound.json")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="CPU code-path check in Triton's interpreter (TRITON_INTERPRET=1): one tiny workload",
    )


def main(args) -> int:
    import torch

    from . import bench

    if args.quick:
        if os.environ.get("TRITON_INTERPRET") != "1":
            raise cli.UsageError("--quick runs Triton's copies on the CPU: it needs TRITON_INTERPRET=1")
        preset = [
            "--quick",
            "--device",
            "cpu",
            "--seq-lens",
            str(bench.QUICK["seq_lens"][0]),
            "--calls",
            "2",
            "--copy-mib",
            "1",
        ]
    elif not torch.cuda.is_available():
        raise cli.UsageError("copybound times Triton kernels: it needs a CUDA GPU (or --quick with TRITON_INTERPRET=1)")
    else:
        preset = ["--set", "suite", "--device", "cuda", "--calls", "20", "--copy-mib", "1024"]
    # ours and the device copy of each task, by the kernel span
    run = bench.measure(bench.preset(*preset, "--peers", "copy", "--timer", "span"), after_workload=triton_copies)
    run["configs"] = CONFIGS
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(run, indent=1) + "\n")
    print(
        f"means over {len(run['workloads'])} workloads, us (x floor); {run['meta']['gpu'] or 'CPU'}, "
        f"copy {run['copy']['GBps']:.0f} GB/s"
    )
    print("task       floor  ours            triton copy     device copy")
    for task, floor, ours, tcopy, dcopy in summary(run):
        print(
            f"{task:9s} {floor:6.2f}  {ours:6.2f} ({ours / floor:.3f}x)  {tcopy:6.2f} ({tcopy / floor:.3f}x)"
            f"  {dcopy:6.2f} ({dcopy / floor:.3f}x)"
        )
    return 0
