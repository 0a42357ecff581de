"""`python -m rope_bwd_triton demo`: the main job, `bench` with a preset.

Builds the Hub variants, loads the kernel through kernels.get_kernel as a user would,
then measures what `bench --set suite --tasks bwd --peers "" --timer events` measures:
rope_bwd(out=) on the 16 public SOL-ExecBench workloads (fp32, H=16, D=128), every
token row checked against the float64 reference before it is timed. Prints a table:
per workload the error, the fraction of elements within SOL-ExecBench's own rule, the
time per call and, on a GPU, the achieved bandwidth against the byte floor. A workload
passes within suite.TOLERANCE and with SOL-ExecBench's rule met on >= 99% of the
elements; the exit status is 1 unless every one passes. Writes demo.json (the bench
run: `bench --from-json` renders it too) and demo.png. On a machine without CUDA it
runs the package's CPU path and says so.
"""

import json
from pathlib import Path

from . import REPO_ROOT, cli, output


def add_arguments(parser):
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "results", help="folder for demo.json and demo.png")
    parser.add_argument(
        "--seq-lens", type=cli.positive_int, nargs="+", default=None, help="default: the 16 public workloads"
    )
    parser.add_argument("--calls", type=cli.positive_int, default=40, help="timed calls per workload")
    parser.add_argument("--seed", type=int, default=0)


def bench_args(args, on_gpu):
    """The preset: bench's arguments for this demo."""
    from . import bench, suite

    argv = [
        "--set",
        "suite",
        "--tasks",
        "bwd",
        "--peers",
        "",
        "--timer",
        "events",
        "--calls",
        str(args.calls),
        "--seed",
        str(args.seed),
        "--verify-tokens",
        str(max(args.seq_lens or suite.SEQ_LENS)),  # every token row
        "--copy-mib",
        str(1024 if on_gpu else bench.QUICK["copy_mib"]),
    ]  # on the CPU no floor is shown
    return bench.preset(*argv, *(["--seq-lens", *map(str, args.seq_lens)] if args.seq_lens else []))


def rows(run) -> list:
    """The table's rows from the bench run: per workload S, rel_err, sol_pass, ok, time_us and,
    on a GPU, floor_us and GBps."""
    from . import suite

    out = []
    for w in run["workloads"]:
        r = w["results"]["ours_bwd"]
        if "error" in r:
            raise RuntimeError(f"rope_bwd at S={w['S']}: {r['error']}")
        check = r["verify"]
        row = {
            "S": w["S"],
            "rel_err": check["max_rel_err"],
            "sol_pass": check["sol_pass_fraction"],
            "ok": check["ok"] and check["sol_pass_fraction"] >= suite.SOL_MIN_PASS,
            "time_us": r["time"]["mean_us"],
        }
        if run["meta"]["gpu"]:
            row.update(floor_us=w["floors"]["bwd"]["us"], GBps=r["GBps"])
        out.append(row)
    return out


def _plot(rows, path, on_gpu) -> bool:
    """Draws demo.png; False where matplotlib is missing."""
    plt = output.pyplot("demo", path)
    if plt is None:
        return False
    S = [r["S"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(S, [r["time_us"] for r in rows], "o-", label="rope_bwd (ours)")
    if on_gpu:
        ax.plot(S, [r["floor_us"] for r in rows], "k--", label="byte floor (bytes / copy bandwidth)")
    ax.set(
        xlabel="S (tokens), H=16, D=128, fp32",
        ylabel="us per call" + (" (cold L2)" if on_gpu else " (CPU wall clock)"),
        title="rope-bwd on the SOL-ExecBench 019 workloads",
    )
    ax.grid(alpha=0.3)
    ax.legend()
    output.save_figure(fig, path)
    return True


def table(rows, gpu_name=None, bandwidth=None):
    """The printed result: one line per workload, then the suite mean and the verdict.
    With a GPU (gpu_name set) rows carry floor_us and GBps, and the mean is set against the floor."""
    from . import suite

    head = f"{'S':>6} {'max rel err':>12} {'SOL pass':>9} {'us/call':>9}"
    lines = ["", head + (f" {'floor us':>9} {'x floor':>8} {'GB/s':>7}" if gpu_name else "")]
    for r in rows:
        line = f"{r['S']:>6} {r['rel_err']:>12.2e} {100 * r['sol_pass']:>8.1f}% {r['time_us']:>9.1f}"
        if gpu_name:
            line += f" {r['floor_us']:>9.1f} {r['time_us'] / r['floor_us']:>8.2f} {r['GBps']:>7.0f}"
        lines.append(line + ("" if r["ok"] else "  FAILED"))
    mean_t = sum(r["time_us"] for r in rows) / len(rows)
    summary = f"suite mean: {mean_t:.1f} us per call"
    if gpu_name:
        mean_f = sum(r["floor_us"] for r in rows) / len(rows)
        summary += (
            f" on {gpu_name}, floor {mean_f:.1f} us ({mean_t / mean_f:.2f}x; copy bandwidth {bandwidth:.0f} GB/s)"
        )
    else:
        summary += " (CPU wall clock of the PyTorch path; GPU figures come from `bench` on a GPU)"
    ok = all(r["ok"] for r in rows)
    return lines + [
        summary,
        f"verification: {'all workloads pass' if ok else 'FAILURES'} "
        f"(rel err <= {suite.TOLERANCE['float32']:g} vs float64, and the SOL-ExecBench rule on "
        f">= {suite.SOL_MIN_PASS:.0%} of elements)",
    ]


def main(args) -> int:
    import torch
    import triton

    from . import bench
    from .load import load_kernel

    kernel = load_kernel()
    on_gpu = torch.cuda.is_available()
    where = torch.cuda.get_device_name() if on_gpu else "CPU (no GPU here: the package's PyTorch path runs)"
    print(f"loaded {kernel.__name__} from {Path(kernel.__file__).parent} through kernels.get_kernel")
    print(f"device: {where}; torch {torch.__version__}, triton {triton.__version__}")
    run = bench.measure(bench_args(args, on_gpu), kernel)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "demo.json").write_text(json.dumps(run, indent=2) + "\n")
    table_rows = rows(run)
    for line in table(table_rows, where if on_gpu else None, run["copy"]["GBps"]):
        print(line)
    plotted = _plot(table_rows, args.out / "demo.png", on_gpu)
    print(f"wrote {args.out / 'demo.json'}" + (f" and {args.out / 'demo.png'}" if plotted else ""))
    return 0 if all(r["ok"] for r in table_rows) else 1
