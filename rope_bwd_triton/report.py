"""What `bench --preset suite` (and copybound) reports of a run: the suite means, the markdown
(method, per-workload tables, verification), the plot (time and achieved bandwidth against S,
with the floor) and the terminal table of ours per workload."""

import os
import statistics
from pathlib import Path

from . import nogpu, output, suite
from .suite import TASKS


def summarize(run) -> dict:
    """Mean over the 16 public workloads (or over a custom set) per implementation;
    x floor = mean time / mean floor, the suite figure of docs/design.md, section 7."""
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
        f"Timer: {meta['timer']}; mean of {meta['calls']} calls per workload{output.in_rounds(meta)}.  ",
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
        output.markdown_table(["implementation", "worst rel err", "min SOL pass fraction", "all pass", "checks"], rows),
        "",
    ]
    if notes:
        lines += ["Not measured:", ""] + [f"- {n}" for n in sorted(notes)] + [""]
    return "\n".join(lines)


METHOD = """\
Method (docs/design.md, section 7): GPU time of one call on a cold L2 (a buffer of 2x the
L2 size is zeroed before each call, with evict_last stores and then again with default
ones, so that lines read with evict_last priority go too), the GPU kept busy by
`torch.cuda._sleep` while the host enqueues, mean over the calls of a workload, which
its implementations take in turns over rotating rounds. Each call is timed two ways
at once: the kernel span (as SOL-ExecBench: from the start of the first kernel,
memset or memcpy the call launched to the end of the last, read from CUPTI through
torch.profiler) and CUDA events around the call; the Timer line of a run says which
is the primary figure (ratios, floor, plot), the suite-mean table shows the other's
mean too. Each implementation is verified against a float64 evaluation of the math
(all token rows, or a random sample of `--verify-tokens` rows for large S) before
it is timed: it passes within the relative-error tolerance of its dtype, with
SOL-ExecBench's own rule met on at least 99% of the elements. Byte floor = bytes that
must move (suite.floor_bytes) / copy bandwidth measured in the same run; bf16 tasks
count 2 bytes per q/k/gradient element, the fp32 tables 4. Full backward: `rope_bwd(..., out=preallocated)` (destination
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
    if not runs[-1]["meta"]["gpu"]:  # what the timings of a GPU are: those recorded
        parts += [f"## Timings {nogpu.provenance(nogpu.recorded())}", "", *_suite_table(nogpu.recorded())]
    return "\n".join(parts)


def render_plot(runs, path) -> bool:
    """Draws the plot; False where matplotlib is missing. A CPU run: its verification and the
    times recorded on a GPU instead (nogpu.py)."""
    if not runs[0]["meta"]["gpu"]:
        return nogpu.render_plot(runs[-1], path, draw_times)
    plt = output.pyplot("bench", path)
    if plt is None:
        return False
    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(14, 5.5))
    draw_times(ax_t, runs, ax_b)
    for run in runs:
        ax_b.axhline(run["copy"]["GBps"], color="k", ls="--", lw=1)
    ax_b.plot([], [], "k--", lw=1, label="copy bandwidth (the floor)")
    ax_b.set(xscale="log", xlabel="S (tokens)", ylabel="GB/s (floor bytes / time)", title="achieved bandwidth")
    for ax in (ax_t, ax_b):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    output.save_figure(fig, path)
    return True


def draw_times(ax_t, runs, ax_b=None, tasks=None):
    """Time per call against S of every implementation of GPU runs (of `tasks` alone if given),
    with the floors, on ax_t (and the achieved bandwidth on ax_b)."""
    # The (H, D) with the most workloads: an S axis needs one head shape.
    shapes = [(w["H"], w["D"]) for run in runs for w in run["workloads"]]
    H, D = max(set(shapes), key=shapes.count)
    ws = sorted(
        ((w, run) for run in runs for w in run["workloads"] if (w["H"], w["D"]) == (H, D)), key=lambda p: p[0]["S"]
    )
    impls = {n: i for run in runs for n, i in run["impls"].items() if tasks is None or i["task"] in tasks}
    measured = {i["task"] for i in impls.values()}
    for task, style in ((t, style) for t, style in (("bwd", "k--"), ("bwd_qk", "k:")) if t in measured):
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
        if ax_b is not None:
            ax_b.plot([s for s, _ in pts], [r["GBps"] for _, r in pts], style, ms=3, label=label)
    output.against_s(ax_t, "us per call (cold L2)", f"time, H={H} D={D}, {runs[0]['meta']['gpu']}")


def terminal_table(run) -> str:
    """Ours per workload and task (the demo's view): error, SOL pass fraction, time, the floor, x
    floor and achieved bandwidth; then the suite means. A CPU run: nogpu.terminal_table."""
    from tabulate import tabulate

    gpu = run["meta"]["gpu"]
    if not gpu:
        return nogpu.terminal_table(run)
    header = ["S", "H", "D", "task", "max rel err", "SOL pass", "us/call", "floor us", "x floor", "GB/s"]
    rows = []
    for w in run["workloads"]:
        for name, r in w["results"].items():
            if not name.startswith("ours"):
                continue
            task = run["impls"][name]["task"]
            if "time" not in r:  # its error was printed as it happened, and is in the JSON
                rows.append([w["S"], w["H"], w["D"], task, "—", "—", "did not run"])
                continue
            check = r["verify"]
            row = [
                w["S"],
                w["H"],
                w["D"],
                task,
                f"{check['max_rel_err']:.2e}",
                f"{100 * check['sol_pass_fraction']:.1f}%",
            ]
            row.append(f"{r['time']['mean_us']:.1f}" + ("" if check["ok"] else "  FAILED"))
            row += [f"{w['floors'][task]['us']:.1f}", f"{r['x_floor']:.2f}", f"{r['GBps']:.0f}"]
            rows.append(row)
    lines = [tabulate(rows, header, disable_numparse=True, colalign=("right",) * len(header))]
    summary = run["summary"]
    for name, s in summary.get("impls", {}).items():
        if name.startswith("ours"):
            where = f"floor {s['floor_us']:.1f} us ({s['x_floor']:.2f}x) on {gpu}"
            lines.append(f"{run['impls'][name]['label']}: mean over {summary['over']}: {s['mean_us']:.1f} us, {where}")
    return "\n".join(lines)
