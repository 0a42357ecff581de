"""What the suite preset (the demo) shows on a machine without a GPU, where timings mean nothing:
what holds there, the verification against float64 (worst relative error of each workload and
dtype against its tolerance), and the figures recorded on a GPU (RECORDED), labelled as such
with their GPU, versions, commit and date."""

import json

from . import REPO_ROOT, output
from .suite import TASKS

RECORDED = REPO_ROOT / "benchmarks" / "h200" / "bench.json"  # benchmarks/RESULTS.md, "The suite"


def recorded() -> dict:
    return json.loads(RECORDED.read_text())


def provenance(run) -> str:
    """Where a recorded run comes from, in one line."""
    return f"recorded on {run['meta']['gpu']} at {source(run)}"


def source(run) -> str:
    meta, v = run["meta"], output.recorded_versions(run["meta"])
    return (
        f"commit {meta.get('commit', '?')}, {meta['date']}: torch {v['torch']}, triton {v['triton']} "
        f"({RECORDED.relative_to(REPO_ROOT).as_posix()})"
    )


def tasks(run) -> set:
    """The tasks the run measured (the recorded figures shown are those of the same tasks)."""
    return {info["task"] for info in run["impls"].values()}


def verification_rows(run) -> list:
    """[S, H, D, dtype, worst rel err, tolerance, SOL pass, ok] of ours per workload and task."""
    rows = []
    for w in run["workloads"]:
        for name, r in w["results"].items():
            if name.startswith("ours") and "verify" in r:
                check = r["verify"]
                rows.append([w["S"], w["H"], w["D"], TASKS[run["impls"][name]["task"]][0], check["max_rel_err"],
                             check["tolerance"], check["sol_pass_fraction"], check["ok"]])  # fmt: skip
    return rows


def terminal_table(run) -> str:
    from tabulate import tabulate

    rec = recorded()
    header = ["S", "H", "D", "task", "worst rel err", "tolerance", "SOL pass", "within"]
    rows = [
        [S, H, D, task, f"{err:.2e}", f"{tol:.0e}", f"{100 * sol:.1f}%", "yes" if ok else "FAILED"]
        for S, H, D, task, err, tol, sol, ok in verification_rows(run)
    ]
    lines = [
        "Verification of ours against float64 on this machine (the CPU runs the package's PyTorch path; "
        "its timings mean nothing and are left out):",
        tabulate(rows, header, disable_numparse=True, colalign=("right",) * len(header)),
        "",
        f"Timings of these tasks {provenance(rec)}, mean over the 16 public workloads:",
    ]
    for name, s in rec["summary"]["impls"].items():
        info = rec["impls"][name]
        if info["task"] in tasks(run):
            label = f"{info['label']} [{TASKS[info['task']][0]}]"
            lines.append(f"  {label}: {s['mean_us']:.1f} us, {s['x_floor']:.2f}x the byte floor")
    return "\n".join(lines)


def render_plot(run, path, draw_times) -> bool:
    """Left: the verification (worst error of each workload against each dtype's tolerance);
    right: the recorded GPU times against S (draw_times(ax, runs) draws them as the GPU plot does)."""
    plt = output.pyplot("bench", path)
    if plt is None:
        return False
    fig, (ax_v, ax_t) = plt.subplots(1, 2, figsize=(14, 5.5))
    rows = verification_rows(run)
    for task in dict.fromkeys(r[3] for r in rows):
        mine = sorted((S, err, tol) for S, _, _, t, err, tol, _, _ in rows if t == task)
        (line,) = ax_v.plot([S for S, _, _ in mine], [e for _, e, _ in mine], "-o", ms=3, label=f"worst error: {task}")
        ax_v.axhline(mine[0][2], color=line.get_color(), ls="--", lw=1, label=f"tolerance: {task}")
    verdict = "all within tolerance" if all(r[7] for r in rows) else "SOME OUTSIDE TOLERANCE"
    output.against_s(ax_v, "relative error against float64", f"This machine (CPU): ours against float64,\n{verdict}")
    rec = recorded()
    draw_times(ax_t, [rec], tasks=tasks(run))
    where = source(rec).replace(" (", "\n(")  # the file on a line of its own
    ax_t.set_title(f"Recorded on {rec['meta']['gpu']}, not measured here:\n{where}", fontsize=10)
    for ax in (ax_v, ax_t):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    gpu = rec["meta"]["gpu"]
    fig.suptitle(f"rope-bwd without a GPU: what holds on this machine (left), what the {gpu} measured (right)")
    output.save_figure(fig, path)
    return True
