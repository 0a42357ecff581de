"""`overhead`'s first part: what the first calls cost, as a new training run sees them.

Each implementation runs in a fresh process with empty Triton and inductor caches (fresh.py):
the real call (realcall.py: bf16, q/k views of one qkv, sdpa's gradient layout) forward +
backward at a first S, then at each of a list of new sizes, then at a size seen before, each
timed from the host until the GPU is done. Loading (imports, get_kernel) is timed apart. For
ours the child also records each Triton compilation of rotary_kernel (its key and time,
through Triton's compile hooks).

Every implementation runs once per round, each run with caches of its own, in an order
rotated by one each round, so that no implementation always runs first; the table gives each
one's median over rounds with its range (the first call of one implementation varied by half
from one fresh process to the next). A profiled child of ours, untimed, can add a cProfile of
its first call (the profiler slows the Python it watches).
"""

import statistics
import time

from . import output

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
    from .realcall import transformers_fn

    if impl == "compile":
        import torch

        return torch.compile(transformers_fn())
    return transformers_fn()


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
        t = time.perf_counter()
        if i == 0 and profile_path:
            import cProfile
            import pstats

            prof = cProfile.Profile()
            prof.runcall(call)
            torch.cuda.synchronize()
            ms = (time.perf_counter() - t) * 1e3
            with open(profile_path, "w") as f:
                pstats.Stats(prof, stream=f).sort_stats("cumulative").print_stats(60)
        else:
            call()
            torch.cuda.synchronize()
            ms = (time.perf_counter() - t) * 1e3
        calls.append({"S": S, "ms": ms, "new": S not in seen, "compiles": log[before:] if log is not None else None})
        seen.add(S)
    return {"impl": impl, "load_s": load_s, "calls": calls}


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
    header = [
        "implementation",
        "load ms",
        "first fwd+bwd ms",
        "each new size ms: median (range)",
        "a seen size ms",
        "rotary_kernel compilations: first call, then",
        "note",
    ]
    return head + "\n\n" + output.markdown_table(header, rows) + "\n"
