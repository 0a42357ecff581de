"""`python -m rope_bwd_triton bench --preset copybound`: what a kernel that only streams a
task's bytes takes at the suite's sizes. On the 16 public workloads, ours (the benchmark's own calls, verification
and timer) against the best of a few plain Triton copies of each task's floor bytes (half read,
half written, int32 elements) and the benchmark's device copy. The floor (bytes / bandwidth of a
1 GiB copy) has no per-call cost; a streaming kernel pays its launch, first DRAM round trip and
tail at every size, so its suite mean shows how close to the floor any kernel that moves these
bytes gets on this GPU.

It is the suite preset with `--set suite --peers copy --timer span` and the Triton copies
timed after each workload, on the same timer; the JSON is that bench run, each workload
with its "triton_copy" (us, BLOCK, num_warps) per task. `--quick` exercises the code path
on the CPU in Triton's interpreter (TRITON_INTERPRET=1): one tiny workload, the timings
mean nothing there."""

import statistics

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
    Triton copy of the floor bytes of each task ours ran (w["triton_copy"])."""
    bad = [n for n, r in w["results"].items() if "skipped" not in r and not r.get("verify", {}).get("ok")]
    if bad:
        raise AssertionError(f"S={w['S']}: {bad} failed verification or did not run")
    tasks = [t for t in w["floors"] if f"ours_{t}" in w["results"]]
    copies = {t: best_copy(timer, w["floors"][t]["bytes"]) for t in {SAME_BYTES.get(t, t) for t in tasks}}
    w["triton_copy"] = {t: copies[SAME_BYTES.get(t, t)] for t in tasks}
    bar.write(
        f"S={w['S']}: "
        + ", ".join(f"{t} {_us(w, 'ours_' + t):.2f} / {copies[SAME_BYTES.get(t, t)][0]:.2f} us" for t in tasks)
    )


def _us(w, name):
    r = w["results"].get(name, {})
    return r["time"]["mean_us"] if "time" in r else None


def summary(run) -> list:
    """[(task, floor, ours, Triton copy, device copy or None)]: means over the workloads, in us."""
    ws = run["workloads"]

    def mean(values):
        values = list(values)
        return None if None in values else statistics.fmean(values)

    return [
        (
            task,
            mean(w["floors"][task]["us"] for w in ws),
            mean(_us(w, "ours_" + task) for w in ws),
            mean(w["triton_copy"][task][0] for w in ws),
            mean(_us(w, "copy_" + task) for w in ws),
        )
        for task in ws[0]["triton_copy"]
    ]


def markdown(run) -> str:
    """The means of ours, the best Triton copy and the device copy, against the floor."""
    from .output import markdown_table

    def cell(us, floor):
        return "—" if us is None else f"{us:.2f} ({us / floor:.3f}x)"

    rows = [[task, f"{floor:.2f}", *(cell(us, floor) for us in rest)] for task, floor, *rest in summary(run)]
    return (
        f"### Copy bound: means over {len(run['workloads'])} workloads, us (x floor)\n\n"
        f"The best of the Triton copies (BLOCK, num_warps) {', '.join(map(str, CONFIGS))} of each task's floor "
        "bytes, timed after each workload on the same timer.\n\n"
        + markdown_table(["task", "floor", "ours", "Triton copy", "device copy"], rows)
        + "\n"
    )
