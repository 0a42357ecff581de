"""`python -m rope_bwd_triton copybound`: what a kernel that only streams a task's bytes takes
at the suite's sizes. On the 16 public workloads, ours (the benchmark's own calls, verification
and timer) against the best of a few plain Triton copies of each task's floor bytes (half read,
half written, int32 elements) and the benchmark's device copy. The floor (bytes / bandwidth of a
1 GiB copy) has no per-call cost; a streaming kernel pays its launch, first DRAM round trip and
tail at every size, so its suite mean shows how close to the floor any kernel that moves these
bytes gets on this GPU.

`--quick` exercises the code path on the CPU in Triton's interpreter (TRITON_INTERPRET=1): one
tiny workload, the timings mean nothing there."""

import json
import os
import statistics
import sys
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


def measure(device, seq_lens, H, D, calls, copy_mib):
    from tqdm import tqdm

    from . import bench, timing
    from .load import load_kernel
    from .runmeta import run_meta

    kernel = load_kernel()
    timer = timing.ColdL2Timer(device, calls=calls, primary="span")
    bandwidth = timing.copy_bandwidth(timer, copy_mib << 20)["GBps"]
    args = bench.preset("--peers", "copy")
    impls = [i for i in bench.IMPLS if i.peer in (None, "copy")]
    run = {"meta": run_meta(device, kernel=kernel, timer=timer), "copy_GBps": bandwidth, "configs": CONFIGS,
           "workloads": []}
    bar = tqdm(total=len(seq_lens) * len(impls), desc="copy-bound", unit="run", file=sys.stderr)
    for S in seq_lens:
        w = bench.measure_workload(kernel, impls, timer, bandwidth, "suite", S, H, D, args, bar)
        bad = [n for n, r in w["results"].items() if not r.get("verify", {}).get("ok")]
        if bad:
            raise AssertionError(f"S={S}: {bad} failed verification or did not run")
        row = {"S": S, "floor_us": {t: f["us"] for t, f in w["floors"].items()},
               "ours_us": {i.task: w["results"][i.name]["time"]["mean_us"] for i in impls if i.peer is None},
               "device_copy_us": {i.task: w["results"][i.name]["time"]["mean_us"] for i in impls if i.peer == "copy"},
               "triton_copy": {}}
        for task, floor in w["floors"].items():
            if task not in SAME_BYTES:
                row["triton_copy"][task] = best_copy(timer, floor["bytes"])
        for task, same in SAME_BYTES.items():
            row["triton_copy"][task] = row["triton_copy"][same]
        run["workloads"].append(row)
        bar.write(f"S={S}: " + ", ".join(f"{t} {row['ours_us'][t]:.2f} / {row['triton_copy'][t][0]:.2f} us"
                                         for t in row["ours_us"]))
    bar.close()
    return run


def summary(run) -> list:
    """[(task, floor, ours, triton copy, device copy)], suite means in us."""
    ws = run["workloads"]
    out = []
    for task in ws[0]["ours_us"]:
        def mean(get):
            return statistics.fmean(get(r) for r in ws)
        out.append((task, mean(lambda r: r["floor_us"][task]), mean(lambda r: r["ours_us"][task]),
                    mean(lambda r: r["triton_copy"][task][0]), mean(lambda r: r["device_copy_us"][task])))
    return out


def add_arguments(parser):
    parser.add_argument("--json", type=Path, default=REPO_ROOT / "results" / "copy-bound.json")
    parser.add_argument("--quick", action="store_true",
                        help="CPU code-path check in Triton's interpreter (TRITON_INTERPRET=1): one tiny workload")


def main(args) -> int:
    import torch

    from . import bench, suite

    if args.quick:
        if os.environ.get("TRITON_INTERPRET") != "1":
            raise cli.UsageError("--quick runs Triton's copies on the CPU: it needs TRITON_INTERPRET=1")
        q = bench.QUICK
        run = measure("cpu", q["seq_lens"][:1], q["heads"], q["head_dim"], 2, 1)
    elif not torch.cuda.is_available():
        raise cli.UsageError("copybound times Triton kernels: it needs a CUDA GPU (or --quick with TRITON_INTERPRET=1)")
    else:
        run = measure("cuda", suite.SEQ_LENS, suite.HEADS, suite.HEAD_DIM, 20, 1024)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(run, indent=1) + "\n")
    print(f"means over {len(run['workloads'])} workloads, us (x floor); {run['meta']['gpu'] or 'CPU'}, "
          f"copy {run['copy_GBps']:.0f} GB/s")
    print("task       floor  ours            triton copy     device copy")
    for task, floor, ours, tcopy, dcopy in summary(run):
        print(f"{task:9s} {floor:6.2f}  {ours:6.2f} ({ours / floor:.3f}x)  {tcopy:6.2f} ({tcopy / floor:.3f}x)"
              f"  {dcopy:6.2f} ({dcopy / floor:.3f}x)")
    return 0
