"""`python -m rope_bwd_triton bench`: ours against the byte floor and the peers (docs/design.md, section 7).

Measures, in one process: the device-to-device copy bandwidth; then for every
workload the byte floor of each task and the cold-L2 GPU time per call (mean of
--calls calls) of our variants, of the peers and of a device copy of the same
bytes (a reference), each verified (against the float64 reference; the copy
against its source) before it is timed. Writes JSON (everything measured), a
markdown summary (suite mean over the 16 public workloads, per-workload tables,
verification) and a PNG plot (time and achieved bandwidth against S, with the
floor), and prints the tables.

Tasks (byte floors from suite.floor_bytes; bf16 tasks count 2 bytes per q/k and
gradient element, the tables stay fp32 and count 4):
    bwd       full backward, fp32: SOL-ExecBench 019
    bwd_qk    q/k-only backward, fp32: cos/sin need no gradient (the real models)
    bwd_bf16  full backward, bf16 gradients/q/k, fp32 embeddings
    fwd, fwd_bf16   the fused forward

Each call is timed by two methods at once (timing.py): the kernel span (CUPTI)
and CUDA events; --timer picks the primary figure (ratios, floors, plot), and the
JSON and the suite-mean table carry the other one too.

On a machine without CUDA it runs on the CPU to exercise the code path only
(`--quick`): wall clock, no cold L2, no second figure, Liger skipped; the numbers
mean nothing.
"""

import argparse
import json
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from . import REPO_ROOT, cli, output

TASKS = {  # name: (description, suite.floor_bytes mode, dtype name)
    "bwd": ("full backward, fp32", "bwd", "float32"),
    "bwd_qk": ("q/k-only backward, fp32", "bwd_qk", "float32"),
    "bwd_bf16": ("full backward, bf16 (fp32 table)", "bwd", "bfloat16"),
    "fwd": ("forward, fp32", "fwd", "float32"),
    "fwd_bf16": ("forward, bf16 (fp32 table)", "fwd", "bfloat16"),
}
SCALING = [(S, 16, 128) for S in (16384, 65536)] + [(S, 16, D) for D in (72, 80) for S in (4096, 16384)]
QUICK = {"seq_lens": (8, 33), "heads": 2, "head_dim": 16, "calls": 3, "copy_mib": 16}


@dataclass
class Impl:
    name: str
    label: str
    task: str
    peer: str | None  # which --peers entry enables it; None for ours
    make: object  # (kernel, inputs of the task) -> Call
    check: object = None  # (Call) -> verification dict, for what the float64 reference does not judge


# ------------------------------------------------------------------ inputs


class Data:
    """One workload's inputs on the device, in fp32 and bf16 (tables stay fp32)."""

    def __init__(self, S, H, D, device, seed):
        import torch

        from . import suite

        gen = torch.Generator().manual_seed(seed)
        x = suite.make_inputs(S, H, D, generator=gen, device=device)
        self.S, self.H, self.D = S, H, D
        big = [x[n] for n in ("grad_q_embed", "grad_k_embed", "q", "k")]
        self.big = {"float32": big, "bfloat16": [t.to(torch.bfloat16) for t in big]}
        self.embeddings = x["embeddings"]
        # The q/k-only mode uses the real models' table cat(freqs, freqs), which Liger assumes.
        e = self.embeddings[:, : D // 2]
        self.emb_dup = torch.cat((e, e), dim=1)
        self.cos, self.sin = self.emb_dup.cos(), self.emb_dup.sin()

    def inputs(self, mode, dtype):
        """fwd: q, k, embeddings; bwd: gq, gk, q, k, embeddings; bwd_qk: gq, gk, cos, sin."""
        gq, gk, q, k = self.big[dtype]
        if mode == "fwd":
            return [q, k, self.embeddings]
        if mode == "bwd":
            return [gq, gk, q, k, self.embeddings]
        return [gq, gk, self.cos, self.sin]

    def reference(self, mode, dtype, rows):
        """float64 reference outputs on the given token rows (tokens are independent)."""
        from . import suite

        gq, gk, q, k = (t[rows.to(t.device)] for t in self.big[dtype])
        pick = rows.to(self.embeddings.device)
        if mode == "fwd":
            return suite.reference_forward(*(t.cpu().double() for t in (q, k, self.embeddings[pick])))
        if mode == "bwd":
            return suite.reference_backward(gq, gk, q, k, self.embeddings[pick])
        return suite.reference_backward(gq, gk, q, k, self.emb_dup[pick])[:2]


class Call:
    """fn(*args) as a zero-argument call that keeps its latest outputs (for verification)."""

    def __init__(self, fn, *args):
        self.fn, self.args, self.last = fn, args, ()

    def __call__(self):
        self.last = tuple(self.fn(*self.args))


# ------------------------------------------------------------ implementations
# make(kernel, x) -> Call, x = Data.inputs(mode, dtype) of the implementation's task.


def _ours_bwd(kernel, x):
    import torch

    # NaN before the verified first call: an element the kernel fails to write cannot pass
    out = tuple(torch.full_like(x[i], float("nan")) for i in (0, 1, 4))
    return Call(lambda *a: kernel.rope_bwd(*a, out=out), *x)  # destination passing: nothing allocated


def _ours_bwd_qk(kernel, x):
    # The op the autograd backward calls when cos/sin need no gradient; it allocates dq, dk.
    return Call(lambda gq, gk, cos, sin: kernel.ops.rotary_bwd(gq, gk, None, None, cos, sin, True, True)[:2], *x)


def _ours_fwd(kernel, x):
    return Call(kernel.rope_fwd, *x)


def _peer(fn_name, compile_):
    def make(kernel, x):
        from . import peers

        fn = getattr(peers, fn_name)
        return Call(_compiled(fn) if compile_ else fn, *x)

    return make


_COMPILED = {}


def _compiled(fn):
    """One torch.compile object per function for the whole run: it recompiles once per shape."""
    from . import peers

    if fn not in _COMPILED:
        _COMPILED[fn] = peers.compiled(fn)
    return _COMPILED[fn]


def _liger(kernel, x):
    from . import peers

    # In place on private copies: the first call (verified) sees fresh gradients; the timed
    # calls keep rotating the same buffers, which moves the same bytes and keeps values bounded.
    return Call(peers.liger_rope_backward(), x[0].clone(), x[1].clone(), x[2], x[3])


def _copy(task):
    """A device-to-device copy of the task's floor bytes (half read, half written): the time
    of a call that only moves those bytes, its launch and DRAM ramp included, which the
    floor (bytes / bandwidth of a 1 GiB copy) leaves out."""

    def make(kernel, x):
        import torch

        from . import suite

        S, H, D = x[0].shape
        nbytes = suite.floor_bytes(S, H, D, elem=x[0].element_size(), table_elem=4, mode=TASKS[task][1])
        src = torch.randint(0, 256, (nbytes // 2,), dtype=torch.uint8, device=x[0].device)
        dst = torch.empty_like(src)
        return Call(lambda: (dst.copy_(src), src))

    return make


def _check_copy(call):
    import torch

    dst, src = call.last
    same = torch.equal(dst, src)
    return {
        "max_rel_err": 0.0 if same else float("inf"),
        "sol_pass_fraction": 1.0 if same else 0.0,
        "ok": same,
        "what": "destination equals source",
    }


IMPLS = [
    Impl("ours_bwd", "ours: rope_bwd(out=)", "bwd", None, _ours_bwd),
    Impl("eager_bwd", "eager PyTorch reference", "bwd", "eager", _peer("eager_backward", False)),
    Impl("compiled_bwd", "torch.compile(reference)", "bwd", "compile", _peer("eager_backward", True)),
    Impl("ours_bwd_qk", "ours: ops.rotary_bwd (q/k only)", "bwd_qk", None, _ours_bwd_qk),
    Impl("compiled_bwd_qk", "torch.compile(q/k-only reference)", "bwd_qk", "compile", _peer("eager_backward_qk", True)),
    Impl("liger_bwd_qk", "Liger-Kernel rope_backward (in place)", "bwd_qk", "liger", _liger),
    Impl("ours_bwd_bf16", "ours: rope_bwd(out=), bf16", "bwd_bf16", None, _ours_bwd),
    Impl("ours_fwd", "ours: rope_fwd", "fwd", None, _ours_fwd),
    Impl("ours_fwd_bf16", "ours: rope_fwd, bf16", "fwd_bf16", None, _ours_fwd),
] + [Impl(f"copy_{task}", "device copy of the same bytes", task, "copy", _copy(task), _check_copy) for task in TASKS]
PEERS = ("eager", "compile", "liger", "copy")


def _skip_reason(impl, device):
    if impl.peer != "liger":
        return None
    if device.type != "cuda":
        return "Liger-Kernel's Triton kernel needs a CUDA GPU"
    from . import peers

    return None if peers.liger_rope_backward() else "liger-kernel is not installed"


# ------------------------------------------------------------------ measuring


def _verify(outputs, refs, dtype_name, rows):
    from . import suite

    errs = [suite.rel_err(o[rows.to(o.device)], r) for o, r in zip(outputs, refs)]
    passes = [suite.sol_pass_fraction(o[rows.to(o.device)], r) for o, r in zip(outputs, refs)]
    worst, tolerance = max(errs), suite.TOLERANCE[dtype_name]
    return {
        "rel_err": errs,
        "max_rel_err": worst,
        "sol_pass_fraction": min(passes),
        "tolerance": tolerance,
        "ok": worst <= tolerance,
        "rows": len(rows),
    }


def _rows(S, n, seed):
    """Token rows to verify: all of them, or n spread at random including the first and last."""
    import torch

    if S <= n:
        return torch.arange(S)
    pick = torch.randperm(S - 2, generator=torch.Generator().manual_seed(seed))[: n - 2] + 1
    return torch.cat((torch.tensor([0, S - 1]), pick)).sort().values


def measure_workload(kernel, impls, timer, bandwidth, set_name, S, H, D, args, bar):
    """One workload: each implementation in `impls` verified against float64, then timed by
    `timer`; `bar` (tqdm) shows progress. Returns the workload's entry of the run JSON."""
    import torch

    from . import suite
    from .timing import bandwidth_GBps, time_us

    seed = args.seed * 1_000_003 + S * 1009 + H * 31 + D
    data = Data(S, H, D, timer.device, seed)
    rows = _rows(S, args.verify_tokens, seed)
    floors = {}
    for task, (_, mode, dtype_name) in TASKS.items():
        nbytes = suite.floor_bytes(S, H, D, elem=getattr(torch, dtype_name).itemsize, table_elem=4, mode=mode)
        floors[task] = {"bytes": nbytes, "us": time_us(nbytes, bandwidth)}
    refs = {}
    results = {}
    for impl in impls:
        bar.set_postfix_str(f"S={S} H={H} D={D} {impl.name}")
        reason = _skip_reason(impl, timer.device)
        if reason:
            results[impl.name] = {"label": impl.label, "task": impl.task, "skipped": reason}
            bar.update()
            continue
        _, mode, dtype = TASKS[impl.task]
        try:
            call = impl.make(kernel, data.inputs(mode, dtype))
            call()
            if impl.check:
                check = impl.check(call)
            else:
                if impl.task not in refs:
                    refs[impl.task] = data.reference(mode, dtype, rows)
                check = _verify(call.last, refs[impl.task], dtype, rows)
            stats = timer(call)
        except Exception as exc:  # one failing peer must not cost the whole (GPU-time limited) run
            results[impl.name] = {"label": impl.label, "task": impl.task, "error": f"{type(exc).__name__}: {exc}"}
            bar.write(f"  {impl.name} S={S} H={H} D={D}: {results[impl.name]['error']}")
            bar.update()
            continue
        floor = floors[impl.task]
        results[impl.name] = {
            "label": impl.label,
            "task": impl.task,
            "time": stats.as_dict(),
            "x_floor": stats.mean_us / floor["us"],
            "GBps": bandwidth_GBps(floor["bytes"], stats.mean_us),
            "verify": check,
        }
        if not check["ok"]:
            bar.write(f"  {impl.name} S={S} H={H} D={D}: verification FAILED (rel err {check['max_rel_err']:.2e})")
        del call
        bar.update()
    del data
    if timer.cuda:
        torch.cuda.empty_cache()
    return {"set": set_name, "S": S, "H": H, "D": D, "floors": floors, "results": results}


def _workloads(args):
    from . import suite

    if args.quick or args.seq_lens:
        q = QUICK if args.quick else {}
        seq_lens = args.seq_lens or q["seq_lens"]
        H, D = args.heads or q.get("heads", suite.HEADS), args.head_dim or q.get("head_dim", suite.HEAD_DIM)
        return [("custom", S, H, D) for S in seq_lens]
    out = []
    if args.set in ("suite", "all"):
        out += [("suite", S, suite.HEADS, suite.HEAD_DIM) for S in suite.SEQ_LENS]
    if args.set in ("scaling", "all"):
        out += [("scaling", *w) for w in SCALING]
    return out


def measure(args, kernel=None, after_workload=None) -> dict:
    """The run `args` (bench's arguments) ask for; `kernel`: the loaded package, else loaded here.
    after_workload(timer, entry, bar): a preset's own work on each measured workload (copybound)."""
    import torch
    from tqdm import tqdm

    from .load import load_kernel, load_other
    from .runmeta import run_meta
    from .timing import ColdL2Timer, copy_bandwidth, flush_check

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    kernel = kernel or load_kernel()
    timer = ColdL2Timer(device, calls=args.calls, primary=args.timer)
    copy = copy_bandwidth(timer, args.copy_mib << 20)
    impls = [i for i in IMPLS if i.task in args.tasks and (i.peer is None or i.peer in args.peers)]
    if args.ab:  # the same calls of another build, in this process
        other = load_other(args.ab)
        impls += [
            Impl(
                "ab_" + i.name,
                f"A/B {other.__name__}: {i.label}",
                i.task,
                None,
                lambda _, x, make=i.make: make(other, x),
            )
            for i in impls
            if i.peer is None
        ]
    workloads = _workloads(args)
    meta = run_meta(timer.device, kernel=kernel, timer=timer)
    measured = []
    with tqdm(total=len(workloads) * len(impls), desc="bench", unit="run", file=sys.stderr) as bar:
        for set_name, S, H, D in workloads:
            measured.append(measure_workload(kernel, impls, timer, copy["GBps"], set_name, S, H, D, args, bar))
            if after_workload:
                after_workload(timer, measured[-1], bar)
    run = {
        "meta": meta,
        "copy": copy,
        "impls": {i.name: {"label": i.label, "task": i.task} for i in impls},
        "workloads": measured,
    }
    if timer.cuda:
        run["flush_check"] = flush_check(timer)
    run["summary"] = summarize(run)
    return run


# ------------------------------------------------------------------ reporting


def summarize(run) -> dict:
    """Mean over the 16 public workloads (or over a custom set) per implementation;
    x floor = mean time / mean floor, the suite figure of docs/design.md, section 7."""
    from . import suite

    suite_ws = [w for w in run["workloads"] if w["set"] == "suite"]
    complete = sorted(w["S"] for w in suite_ws) == sorted(suite.SEQ_LENS)
    group = suite_ws if suite_ws else [w for w in run["workloads"] if w["set"] == "custom"]
    if not group:
        return {}
    out = {
        "over": "the 16 public workloads" if complete else f"{len(group)} measured workloads (not the full suite)",
        "impls": {},
    }
    for name, info in run["impls"].items():
        times = [w["results"][name]["time"]["mean_us"] for w in group if "time" in w["results"].get(name, {})]
        if len(times) != len(group):
            continue
        floor = statistics.fmean(w["floors"][info["task"]]["us"] for w in group)
        mean = statistics.fmean(times)
        out["impls"][name] = {"mean_us": mean, "floor_us": floor, "x_floor": mean / floor}
        others = [w["results"][name]["time"].get("other") for w in group]
        if all(others):  # the same calls by the timer's other method (none on the CPU)
            out["impls"][name]["other_mean_us"] = statistics.fmean(o["mean_us"] for o in others)
    return out


def _cell(result):
    if "time" not in result:
        return "—"
    return f"{result['time']['mean_us']:.1f} ({result['x_floor']:.2f}x)"


def _suite_table(run) -> list:
    """The suite-mean table's markdown lines (none without a summary)."""
    summary, impls = run["summary"], run["impls"]
    if not summary.get("impls"):
        return []
    lines = [f"### Mean over {summary['over']}", ""]
    rows = []
    for name, s in summary["impls"].items():
        task = impls[name]["task"]
        ours = summary["impls"].get("ours_" + task)
        vs = f"{s['mean_us'] / ours['mean_us']:.2f}" if ours and not name.startswith("ours") else ""
        other = f"{s['other_mean_us']:.1f}" if "other_mean_us" in s else "—"
        rows.append(
            [
                impls[name]["label"],
                TASKS[task][0],
                f"{s['mean_us']:.1f}",
                f"{s['floor_us']:.1f}",
                f"{s['x_floor']:.2f}",
                vs,
                other,
            ]
        )
    other_header = f"mean us by {run['meta'].get('timer_other') or 'the other timer'}"
    header = ["implementation", "task", "mean us", "floor us", "x floor", "time / ours", other_header]
    return lines + [output.markdown_table(header, rows), ""]


def _run_markdown(run) -> str:
    meta, copy, impls = run["meta"], run["copy"], run["impls"]
    v = meta["versions"]
    if meta["gpu"]:
        where = f"{meta['gpu']} ({meta['sm_count']} SMs, {meta['l2_bytes'] / 2**20:.0f} MiB L2)"
    else:
        where = f"{meta['device']} — {meta['note']}"
    lines = [
        f"Device: {where}  ",
        f"Versions: torch {v['torch']} (CUDA {v['cuda']}), triton {v['triton']}, kernels {v['kernels']}, "
        f"liger-kernel {v['liger-kernel'] or 'not installed'}, Python {v['python']}  ",
        f"Date: {meta['date']}; kernel variant `{meta['kernel_variant']}`  ",
        f"Command: `{meta['command']}`  ",
        f"Timer: {meta['timer']}; mean of {meta['calls']} calls per workload.  ",
        f"Copy bandwidth (device-to-device copy, read + write): {copy['GBps'] / 1e3:.2f} TB/s "
        f"({copy['bytes'] >> 20} MiB buffer).",
    ]
    check = run.get("flush_check")
    if check:  # runs before this check existed have none
        lines[-1] += "  "
        lines.append(
            f"Cold-L2 check: a copy of {check['bytes'] >> 20} MiB after the flush takes "
            f"{check['us']['fresh']:.2f} us on fresh buffers and {check['us']['after_evict_last_read']:.2f} us "
            f"when its source was read with evict_last priority before ({check['ratio']:.2f}x; "
            "a flush that left such lines in L2 would make the second faster)."
        )
    lines.append("")
    lines += _suite_table(run)

    groups = [
        ("Backward, fp32: us per call (x floor)", ["bwd", "bwd_qk"]),
        ("Ours, bf16 backward and forward: us per call (x floor)", ["bwd_bf16", "fwd", "fwd_bf16"]),
    ]
    for title, tasks in groups:
        names = [n for n in impls if impls[n]["task"] in tasks]
        if not names:
            continue
        header = ["set", "S", "H", "D"]
        for task in tasks:
            header += [f"floor {task}"] + [impls[n]["label"] for n in names if impls[n]["task"] == task]
        rows = []
        for w in run["workloads"]:
            row = [w["set"], w["S"], w["H"], w["D"]]
            for task in tasks:
                row += [f"{w['floors'][task]['us']:.1f}"]
                row += [_cell(w["results"][n]) for n in names if impls[n]["task"] == task]
            rows.append(row)
        lines += [f"### {title}", "", output.markdown_table(header, rows), ""]

    checks_by_label, notes = {}, set()  # the copy reference has one label for all its tasks
    for name, info in impls.items():
        checks = checks_by_label.setdefault(info["label"], [])
        for w in run["workloads"]:
            r = w["results"][name]
            if "verify" in r:
                checks.append(r["verify"])
            if "skipped" in r or "error" in r:
                notes.add(f"{info['label']}: {r.get('skipped') or r.get('error')}")
    rows = [
        [
            label,
            f"{max(c['max_rel_err'] for c in checks):.2e}",
            f"{min(c['sol_pass_fraction'] for c in checks):.4f}",
            "yes" if all(c["ok"] for c in checks) else "**NO**",
            len(checks),
        ]
        for label, checks in checks_by_label.items()
        if checks
    ]
    lines += [
        "### Verification against the float64 reference (before timing; the copy against its source)",
        "",
        output.markdown_table(
            ["implementation", "worst rel err", "min SOL pass fraction", "all within tolerance", "checks"], rows
        ),
        "",
    ]
    if notes:
        lines += ["Not measured:", ""] + [f"- {n}" for n in sorted(notes)] + [""]
    return "\n".join(lines)


METHOD = """\
Method (docs/design.md, section 7): GPU time of one call on a cold L2 (a buffer of 2x the
L2 size is zeroed before each call, with evict_last stores and then again with default
ones, so that lines read with evict_last priority go too; runs before 2026-11-30 09:23
UTC zeroed it once), the GPU kept busy by `torch.cuda._sleep` while
the host enqueues, mean over the calls of a workload. Each call is timed two ways
at once: the kernel span (as SOL-ExecBench: from the start of the first kernel,
memset or memcpy the call launched to the end of the last, read from CUPTI through
torch.profiler) and CUDA events around the call; the Timer line of a run says which
is the primary figure (ratios, floor, plot), the suite-mean table shows the other's
mean too. Each implementation is verified against a float64 evaluation of the math
(all token rows, or a random sample of `--verify-tokens` rows for large S) before
it is timed. Byte floor = bytes that must move (suite.floor_bytes) / copy bandwidth
measured in the same run; bf16 tasks count 2 bytes per q/k/gradient element, the
fp32 tables 4. Full backward: `rope_bwd(..., out=preallocated)` (destination
passing, nothing allocated in the timed call); q/k-only: `ops.rotary_bwd` (the op
autograd calls when cos/sin need no gradient; it allocates its outputs), with the
real models' table cat(freqs, freqs); forward: `rope_fwd` (allocates). The eager
and compiled peers allocate their outputs; torch.compile compiles once per shape
(dynamic=False, recompile limit raised); Liger rotates in place on the same
buffers at every call (the bytes moved do not depend on the values, and a
rotation keeps them bounded). "Device copy of the same bytes" is a reference, not a
peer: one device-to-device copy of each task's floor bytes (half read, half
written), timed the same way; it shows what a call that only moves those bytes
takes at each size, launch and DRAM ramp included."""


def render_markdown(runs, plot_path=None, md_path=None) -> str:
    parts = ["# rope-bwd benchmark results", "", METHOD, ""]
    if plot_path and md_path:
        rel = os.path.relpath(Path(plot_path).resolve(), Path(md_path).resolve().parent)
        parts += [f"![time and achieved bandwidth against S]({Path(rel).as_posix()})", ""]
    for i, run in enumerate(runs):
        title = "Run" if len(runs) == 1 else f"Run {i + 1}"
        sets = " and ".join(dict.fromkeys(w["set"] for w in run["workloads"]))  # in run order
        parts += [f"## {title}: {sets} workloads", "", _run_markdown(run)]
    return "\n".join(parts)


def render_plot(runs, path) -> bool:
    """Draws the plot; False where matplotlib is missing."""
    plt = output.pyplot("bench", path)
    if plt is None:
        return False
    # The (H, D) with the most workloads: an S axis needs one head shape.
    shapes = [(w["H"], w["D"]) for run in runs for w in run["workloads"]]
    H, D = max(set(shapes), key=shapes.count)
    ws = sorted(
        ((w, run) for run in runs for w in run["workloads"] if (w["H"], w["D"]) == (H, D)), key=lambda p: p[0]["S"]
    )
    impls = {n: i for run in runs for n, i in run["impls"].items()}
    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(14, 5.5))
    for task, style in (("bwd", "k--"), ("bwd_qk", "k:")):
        ax_t.plot(
            [w["S"] for w, _ in ws], [w["floors"][task]["us"] for w, _ in ws], style, label=f"floor: {TASKS[task][0]}"
        )
    for name, info in impls.items():
        pts = [(w["S"], w["results"][name]) for w, _ in ws if "time" in w["results"].get(name, {})]
        if not pts or (name.startswith("copy") and info["task"] not in ("bwd", "bwd_qk")):
            continue
        style = "-o" if name.startswith("ours") else (":" if name.startswith("copy") else "--s")
        label = f"{info['label']} [{info['task']}]"
        ax_t.plot([s for s, _ in pts], [r["time"]["mean_us"] for _, r in pts], style, ms=3, label=label)
        ax_b.plot([s for s, _ in pts], [r["GBps"] for _, r in pts], style, ms=3, label=label)
    for run in runs:
        ax_b.axhline(run["copy"]["GBps"], color="k", ls="--", lw=1)
    ax_b.plot([], [], "k--", lw=1, label="copy bandwidth (the floor)")
    gpu = runs[0]["meta"]["gpu"] or "CPU (timings meaningless)"
    ax_t.set(
        xscale="log",
        yscale="log",
        xlabel="S (tokens)",
        ylabel="us per call (cold L2)",
        title=f"time, H={H} D={D}, {gpu}",
    )
    ax_b.set(xscale="log", xlabel="S (tokens)", ylabel="GB/s (floor bytes / time)", title="achieved bandwidth")
    ax_t.grid(True, which="both", alpha=0.3)
    ax_b.grid(True, which="both", alpha=0.3)
    ax_t.legend(fontsize=7)
    ax_b.legend(fontsize=7)
    output.save_figure(fig, path)
    return True


# ------------------------------------------------------------------ command


def add_arguments(parser):
    out = REPO_ROOT / "results"
    parser.add_argument(
        "--set",
        choices=("suite", "scaling", "all"),
        default="all",
        help="suite: the 16 public workloads; scaling: S 16384/65536 and head_dim 72/80 (default: all)",
    )
    parser.add_argument("--seq-lens", type=cli.positive_int, nargs="+", help="custom workloads instead of --set")
    parser.add_argument("--heads", type=cli.positive_int, help="heads of the custom workloads (default 16)")
    parser.add_argument("--head-dim", type=cli.head_dim, help="head_dim of the custom workloads (default 128)")
    parser.add_argument(
        "--quick", action="store_true", help=f"tiny CPU-friendly run that exercises the code path ({QUICK})"
    )
    parser.add_argument("--calls", type=cli.positive_int, default=None, help="timed calls per workload (default 40)")
    parser.add_argument(
        "--timer",
        choices=("events", "span"),
        default="span",
        help="primary figure: kernel span (CUPTI) or CUDA events; both are recorded (default: span)",
    )
    parser.add_argument(
        "--tasks",
        type=cli.subset_of(TASKS, "tasks"),
        default=list(TASKS),
        help=f"comma-separated subset of {','.join(TASKS)} (default: all)",
    )
    parser.add_argument(
        "--peers",
        type=cli.subset_of(PEERS, "peers"),
        default=list(PEERS),
        help=f"comma-separated subset of {','.join(PEERS)} (default: all)",
    )
    parser.add_argument("--copy-mib", type=cli.positive_int, default=None, help="copy-bandwidth buffer (default 1024)")
    parser.add_argument("--verify-tokens", type=cli.positive_int, default=4096, help="token rows verified per workload")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", type=cli.device, help="default: cuda if available, else cpu")
    parser.add_argument("--ab", type=Path, help="also time another build of ours: a checkout with build/")
    parser.add_argument("--json", type=Path, default=out / "bench.json")
    parser.add_argument("--markdown", type=Path, default=out / "bench.md")
    parser.add_argument("--plot", type=Path, default=out / "bench.png")
    parser.add_argument(
        "--from-json",
        type=cli.existing_file,
        nargs="+",
        help="measure nothing: render the markdown and plot from saved JSON runs",
    )


def preset(*argv) -> argparse.Namespace:
    """bench's arguments, as `python -m rope_bwd_triton bench <argv>` parses them, for the commands
    that measure with bench's own code (demo, copybound)."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def main(args) -> int:
    if args.from_json:
        runs = [json.loads(p.read_text()) for p in args.from_json]
    else:
        args.calls = args.calls or (QUICK["calls"] if args.quick else 40)
        args.copy_mib = args.copy_mib or (QUICK["copy_mib"] if args.quick else 1024)
        if args.calls < 30 and not args.quick:
            print(f"bench: {args.calls} calls per workload; docs/design.md (section 7) asks for >= 30", file=sys.stderr)
        runs = [measure(args)]
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(runs[0], indent=1) + "\n")
        print(f"wrote {args.json}")
    plotted = render_plot(runs, args.plot)
    text = render_markdown(runs, args.plot if plotted else None, args.markdown)
    args.markdown.parent.mkdir(parents=True, exist_ok=True)
    args.markdown.write_text(text)
    print(text)
    print(f"wrote {args.markdown}" + (f" and {args.plot}" if plotted else ""))
    failed = [
        f"{n} S={w['S']} H={w['H']} D={w['D']}"
        for run in runs
        for w in run["workloads"]
        for n, r in w["results"].items()
        if n.startswith("ours") and ("error" in r or not r.get("verify", {}).get("ok", True))
    ]
    if failed:
        print("ours failed on: " + "; ".join(failed), file=sys.stderr)
    return 1 if failed else 0
