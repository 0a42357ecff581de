"""`python -m rope_bwd_triton tune`: search launch configurations on this GPU and
write them into torch-ext/rope_bwd/configs/<GPU name>.json, which the package reads at run
time (tuning.get_config): no autotuning at a user's call. That file holds one table per
Triton version ({"3.6": {bucket: config}, ...}; a Triton uses the newest table not newer
than itself); the results go into the installed Triton's table, which starts as a copy of
the newest older one where it is absent, and the buckets it already has are kept.

For each bucket (mode x dtype x head_dim x S bucket, heads fixed) the search
starts at the package's current configuration (the shipped tuned one, else
default_config) and improves one parameter at a time
(BLOCK_D, BLOCK_R, BLOCK_S, then num_warps; at most two rounds), or with --grid tries
every candidate (slower, but finds joint optima the coordinate search misses), timing each
candidate with the cold-L2 timer of the benchmark on representative S values of
the bucket (or the S of --seq-lens), launched through launch.launch_fwd/launch_bwd with
the candidate as their configuration. The score of a candidate is its mean time relative
to the starting configuration's, averaged over those S. With --shared the winner of a
search over several buckets' sizes is written to each of them (one kernel for all). A
candidate is first checked against the float64 reference on the smallest S, and rejected
if it is wrong. Buckets run in priority order (the suite's shape first, then the real
models' bf16 shapes) until --budget seconds have passed; the file and the log are
rewritten after each bucket, so an interrupted run keeps what it finished.

On a GPU, worker processes (--jobs) first compile every candidate of the grid into
Triton's on-disk cache (for at most half the budget), so that the search itself only
loads them: compiled one at a time, the compiles took most of a search.
"""

import json
import os
import sys
import time
from pathlib import Path

from . import REPO_ROOT, cli

MODES = ("bwd", "bwd_qk", "fwd")
DTYPES = ("float32", "bfloat16")
HEAD_DIMS = (128, 72, 80)
S_REPS = {"S256": (131, 256), "S1024": (613, 1024), "S4096": (2213, 4096), "S16384": (16384,), "Sbig": (65536,)}
BLOCK_S = (1, 2, 4, 8)
NUM_WARPS = (1, 2, 4, 8)
MAX_TILE = 8192  # elements of a BLOCK_S x BLOCK_R x BLOCK_D tile; more only spills registers
# Channels of one half tile (BLOCK_S x BLOCK_R/2 x BLOCK_D) per thread: past 32 the tile spills,
# and Triton 3.6 compiled some such tiles very slowly.
MAX_PER_THREAD = 32
SEARCHED = ("BLOCK_S", "BLOCK_D", "BLOCK_R", "num_warps")  # what a tuned entry holds
VERIFY_ROWS = 256


def priority(dtype, D):
    """The suite's fp32 head_dim 128 first, then the real models' bf16 72/80, then the rest."""
    if D == 128 and dtype == "float32":
        return 0
    if D != 128 and dtype == "bfloat16":
        return 1
    return 2


def block_d_values(D):
    top, bd, out = 1 << max(0, (D // 2 - 1).bit_length()), 8, []
    while bd <= top:
        out.append(bd)
        bd *= 2
    return out


def block_r_values(R):
    """Heads of q plus k per chunk: 2 up to all of them (at most 32)."""
    top = min(1 << max(1, (R - 1).bit_length()), 32)
    return [1 << i for i in range(1, top.bit_length())]


def candidate_ok(cfg):
    tile = cfg["BLOCK_S"] * cfg["BLOCK_R"] * cfg["BLOCK_D"]
    return tile <= MAX_TILE and tile // 2 <= MAX_PER_THREAD * 32 * cfg["num_warps"]


def grid(D, R):
    """Every candidate of the search space that candidate_ok accepts."""
    return [
        cfg
        for bd in block_d_values(D)
        for br in block_r_values(R)
        for bs in BLOCK_S
        for w in NUM_WARPS
        if candidate_ok(cfg := {"BLOCK_S": bs, "BLOCK_D": bd, "BLOCK_R": br, "num_warps": w})
    ]


def _key(cfg):
    return tuple(cfg[k] for k in SEARCHED)


def _version(key: str) -> tuple:
    return tuple(int(n) for n in key.split("."))


def merge_write(path: Path, tuned: dict, version: str):
    """Write tuned buckets into the table of Triton `version` in the JSON file at path, keeping
    the buckets that table has; an absent table starts as a copy of the newest older one."""
    tables = json.loads(path.read_text()) if path.exists() else {}
    if version not in tables:
        older = [v for v in tables if _version(v) < _version(version)]
        tables[version] = dict(tables[max(older, key=_version)]) if older else {}
    tables[version].update(tuned)
    tables = {v: dict(sorted(tables[v].items())) for v in sorted(tables, key=_version)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(tables, indent=1) + "\n")


class Bucket:
    """One bucket's tensors (per representative S) and timing of candidate configs."""

    def __init__(self, kernel, timer, mode, dtype, seq_lens, data_for, layout=""):
        from .load import submodule

        self.timer, self.mode, self.dtype = timer, mode, dtype
        self.launch = submodule(kernel, "launch")
        self.cases = []
        for i, S in enumerate(seq_lens):
            data = data_for(S)
            x = data.inputs(mode, dtype)
            if layout == "sdpa":  # the upstream gradients with their heads outside their tokens
                x = (*(g.transpose(0, 1).contiguous().transpose(0, 1) for g in x[:2]), *x[2:])
            self.cases.append((x, self._outputs(x)))
            if i == 0:  # candidates are checked on the first (smallest) S
                import torch

                self.rows = torch.arange(min(S, VERIFY_ROWS))
                self.refs = data.reference(mode, dtype, self.rows)

    def _outputs(self, x):
        import torch

        if self.mode == "bwd":
            return (torch.empty_like(x[0]), torch.empty_like(x[1]), torch.empty_like(x[4]))
        return (torch.empty_like(x[0]), torch.empty_like(x[1]))

    def _run(self, x, out, cfg):
        if self.mode == "fwd":
            q, k, emb = x
            self.launch.launch_fwd(q=q, k=k, q_out=out[0], k_out=out[1], angles=emb, config=cfg)
            return
        gq, gk, *rest = x
        grads = dict(grad_q_embed=gq, grad_k_embed=gk, grad_q=out[0], grad_k=out[1], config=cfg)
        if self.mode == "bwd":
            q, k, emb = rest
            self.launch.launch_bwd(**grads, q=q, k=k, angles=emb, grad_angles=out[2])
        else:
            cos, sin = rest
            self.launch.launch_bwd(**grads, cos=cos, sin=sin)

    def correct(self, cfg) -> bool:
        from . import suite

        x, out = self.cases[0]
        for o in out:  # a candidate that skips elements must not pass on an earlier one's results
            o.fill_(float("nan"))
        self._run(x, out, cfg)
        return all(
            suite.rel_err(o[self.rows.to(o.device)], r) <= suite.TOLERANCE[self.dtype] for o, r in zip(out, self.refs)
        )

    def times(self, cfg) -> list:
        return [self.timer(lambda: self._run(x, out, cfg)).mean_us for x, out in self.cases]


def relative_time(times, base_times) -> float:
    """A candidate's score: its mean time relative to the starting configuration's at the same sizes."""
    return sum(a / b for a, b in zip(times, base_times)) / len(times)


def tune_bucket(bucket, current, D, R, log, *, grid_search=False):
    """Coordinate search from the package's current config (tuned or default) for the bucket,
    or with grid_search=True every candidate (the coordinate search can miss a joint optimum).
    Returns (best {BLOCK_S, BLOCK_D, BLOCK_R, num_warps}, its time relative to current, current's times)."""
    start = {k: current[k] for k in SEARCHED}
    base_times = bucket.times(current)
    scores = {}

    def score(cfg):
        if _key(cfg) not in scores:
            full = {**current, **cfg}
            if not candidate_ok(full) or not bucket.correct(full):
                scores[_key(cfg)] = float("inf")
            else:
                t = bucket.times(full)
                scores[_key(cfg)] = relative_time(t, base_times)
            log.append({**cfg, "score": scores[_key(cfg)] if scores[_key(cfg)] < float("inf") else None})
        return scores[_key(cfg)]

    best = dict(start)
    score(best)
    if grid_search:
        best = min([best, *grid(D, R)], key=score)
        return best, scores[_key(best)], base_times
    for _ in range(2):
        before = dict(best)
        for param, values in (
            ("BLOCK_D", block_d_values(D)),
            ("BLOCK_R", block_r_values(R)),
            ("BLOCK_S", BLOCK_S),
            ("num_warps", NUM_WARPS),
        ):
            # the current value stays a candidate even when the grid lacks it (a default's BLOCK_S=16)
            best = min(({**best, param: v} for v in sorted({*values, best[param]})), key=score)
        if best == before:
            break
    return best, scores[_key(best)], base_times


def target_keys(tuning, mode, seq_lens, R, D, elem, layout, shared):
    """Table keys a search's winner goes to: the bucket of the first S, or (shared) of every S."""
    sizes = seq_lens if shared else seq_lens[:1]
    return list(dict.fromkeys(tuning.bucket(mode, S, R, D, elem, layout) for S in sizes))


def _inputs(H, device, seed):
    """data_for(D)(S) -> measure.Data, drawn once per (S, D): drawing costs more than timing at large S."""
    from .measure import Data

    cache = {}

    def data_for(D):
        def get(S):
            if (S, D) not in cache:
                cache[S, D] = Data(S, H, D, device, seed + S)
            return cache[S, D]

        return get

    return data_for


def _compile(task):
    """Worker: run each candidate once at each S (which compiles it into Triton's cache)."""
    import torch

    from .load import load_kernel

    mode, dtype, D, H, seed, seq_lens, cfgs, deadline, layout = task
    data_for = _inputs(H, torch.device("cuda"), seed)(D)
    bucket = Bucket(load_kernel(build=False), None, mode, dtype, seq_lens, data_for, layout)
    done = 0
    for cfg in cfgs:
        if time.time() > deadline:
            break
        for x, out in bucket.cases:
            bucket._run(x, out, cfg)
        done += 1
    torch.cuda.synchronize()
    return done


def precompile(jobs, H, seed, n_proc, deadline, layout=""):
    """Compile the grid of every (mode, dtype, head_dim) of jobs at the S the buckets time, in
    n_proc worker processes; returns how many candidates were compiled and how many asked for."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    groups = {}
    for mode, dtype, D, seq_lens in jobs:
        groups.setdefault((mode, dtype, D), set()).update(seq_lens)
    tasks = []
    for (mode, dtype, D), seq_lens in groups.items():
        cfgs = grid(D, 2 * H)
        tasks += [(mode, dtype, D, H, seed, sorted(seq_lens), cfgs[i::n_proc], deadline, layout) for i in range(n_proc)]
    with ProcessPoolExecutor(n_proc, mp_context=multiprocessing.get_context("spawn")) as pool:
        return sum(pool.map(_compile, tasks)), sum(len(t[6]) for t in tasks)


def run(args) -> dict:
    import torch

    from .load import load_kernel, submodule
    from .output import run_meta
    from .timing import ColdL2Timer

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    kernel = load_kernel()
    tuning = submodule(kernel, "tuning")
    name = torch.cuda.get_device_properties(device).name if device.type == "cuda" else "cpu"
    out = args.out or REPO_ROOT / "torch-ext" / "rope_bwd" / "configs" / tuning.config_file(name).name
    version = tuning.triton_version()
    # CUDA events by default: they rank candidates, and the profiler's host cost eats budget
    timer = ColdL2Timer(device, calls=args.calls, warmup=2, primary=args.timer, profile=args.timer == "span")
    H = args.heads
    data_for = _inputs(H, device, args.seed)

    s_buckets = args.s_buckets[:1] if args.seq_lens else args.s_buckets  # --seq-lens: one search, not one per bucket
    jobs = sorted(  # stable: the order of the options within a priority
        ((m, dt, D, sb) for m in args.modes for dt in args.dtypes for D in args.head_dims for sb in s_buckets),
        key=lambda j: priority(j[1], j[2]),
    )
    start = time.monotonic()
    # "device" names the table file (tuning.config_file), "triton" its table in there
    report = {
        "meta": run_meta(device, kernel=kernel, timer=timer),
        "device": name,
        "out": str(out),
        "triton": version,
        "buckets": {},
        "not_tuned": [],
    }
    if device.type == "cuda" and args.jobs > 0:
        done, asked = precompile(
            [(m, dt, D, args.seq_lens or S_REPS[sb]) for m, dt, D, sb in jobs],
            H,
            args.seed,
            args.jobs,
            time.time() + args.budget / 2,
            args.layout,
        )
        report["precompile"] = {"compiled": done, "candidates": asked, "seconds": round(time.monotonic() - start, 1)}
        print(
            f"compiled {done} of {asked} candidates in {args.jobs} processes ({time.monotonic() - start:.0f}s)",
            flush=True,
        )
    for i, (mode, dtype, D, sb) in enumerate(jobs):
        seq_lens = args.seq_lens or S_REPS[sb]
        elem = getattr(torch, dtype).itemsize
        keys = target_keys(tuning, mode, seq_lens, 2 * H, D, elem, args.layout, args.shared)
        key = keys[0]
        elapsed = time.monotonic() - start
        if elapsed > args.budget:
            report["not_tuned"].append(key)
            continue
        print(f"[{i + 1}/{len(jobs)} {elapsed:5.0f}s] {key} at S={','.join(map(str, seq_lens))}", flush=True)
        current = tuning.get_config(mode, seq_lens[0], H, H, D, elem, device, args.layout)
        bucket = Bucket(kernel, timer, mode, dtype, seq_lens, data_for(D), args.layout)
        log = []
        best, score, base_times = tune_bucket(bucket, current, D, 2 * H, log, grid_search=args.grid)
        del bucket
        report["buckets"][key] = {
            "start": current,
            "start_us": base_times,
            "best": best,
            "time_vs_start": score if score < float("inf") else None,
            "seconds": round(time.monotonic() - start - elapsed, 1),
            "written_to": keys if score < float("inf") else [],
            "tried": log,
        }
        if score == float("inf"):
            print(f"    no candidate passed the check; {key} keeps the package's rule", file=sys.stderr)
        else:
            print(f"    best {best}: {score:.3f}x the time of {current} ({len(log)} candidates)", flush=True)
            merge_write(out, dict.fromkeys(keys, best), version)
        write_log(args.log, report)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if report["not_tuned"]:
        print(
            f"budget of {args.budget}s spent; {len(report['not_tuned'])} buckets keep default_config: "
            + ", ".join(report["not_tuned"]),
            file=sys.stderr,
        )
    print(f"wrote {out} ({time.monotonic() - start:.0f}s)")
    return report


def write_log(path: Path, report: dict):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")


def add_arguments(parser):
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--dtypes", nargs="+", choices=DTYPES, default=list(DTYPES))
    parser.add_argument("--head-dims", type=cli.head_dim, nargs="+", default=list(HEAD_DIMS))
    parser.add_argument("--s-buckets", nargs="+", choices=list(S_REPS), default=list(S_REPS))
    parser.add_argument("--heads", type=cli.positive_int, default=16, help="heads of q and of k (default 16)")
    parser.add_argument(
        "--seq-lens",
        type=cli.positive_int,
        nargs="+",
        help="time at these S instead of each bucket's representatives (the key uses the first; one search "
        "per mode, dtype and head_dim)",
    )
    parser.add_argument(
        "--shared",
        action="store_true",
        help="with --seq-lens: write the winner to the bucket of every S given, so that those sizes share one "
        "configuration (one compiled kernel per call site)",
    )
    parser.add_argument(
        "--timer",
        choices=("events", "span"),
        default="events",
        help="what ranks candidates: CUDA events (default, cheap) or the kernel span from the profiler (what the "
        "bench reports; events also count launch gaps, which shift ranks where a call takes a few us)",
    )
    parser.add_argument(
        "--layout",
        choices=("", "sdpa"),
        default="",
        help="sdpa: tune the backward for the upstream gradient as sdpa returns it (heads outside the tokens), "
        "into entries of its own (default: contiguous inputs, the entries every layout falls back to)",
    )
    parser.add_argument("--calls", type=cli.positive_int, default=10, help="cold-L2 calls timed per candidate and S")
    parser.add_argument(
        "--grid",
        action="store_true",
        help="time every (BLOCK_S, BLOCK_D, BLOCK_R, num_warps) candidate instead of the coordinate search",
    )
    parser.add_argument(
        "--budget", type=cli.positive_float, default=270, help="seconds; buckets not started by then are skipped"
    )
    parser.add_argument(
        "--jobs",
        type=cli.nonnegative_int,
        default=max(1, (os.cpu_count() or 2) - 1),
        help="processes that compile the candidates before the search, on a GPU (0: none)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--device", type=cli.device, help="default: cuda if available, else cpu (only with TRITON_INTERPRET=1)"
    )
    parser.add_argument(
        "--out", type=Path, help="default: torch-ext/rope_bwd/configs/<GPU name>.json (this Triton's table in it)"
    )
    parser.add_argument(
        "--log", type=Path, default=REPO_ROOT / "results" / "tune.json", help="every candidate's score, per bucket"
    )


def main(args) -> int:
    import torch

    if args.shared and not args.seq_lens:
        raise cli.UsageError("--shared writes one winner to the buckets of the S given by --seq-lens: give --seq-lens")
    if args.layout and "fwd" in args.modes:
        raise cli.UsageError("--layout sdpa is the upstream gradient's layout: give --modes bwd_qk and/or bwd")

    if (args.device or ("cuda" if torch.cuda.is_available() else "cpu")) == "cpu" and os.environ.get(
        "TRITON_INTERPRET"
    ) != "1":
        raise cli.UsageError(
            "tuning times the Triton kernel: it needs a CUDA GPU, or TRITON_INTERPRET=1 "
            "to run it on the CPU in Triton's interpreter (a code-path check)"
        )
    write_log(args.log, run(args))
    print(f"wrote {args.log}")
    return 0
