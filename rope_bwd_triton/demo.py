"""`python -m rope_bwd_triton demo`: the main job.

Builds the Hub variants, loads the kernel through kernels.get_kernel as a user
would, runs rope_bwd on the 16 public SOL-ExecBench workloads (fp32, H=16,
D=128) with fresh random inputs, checks every output against the float64
reference (our relative-error bound and the benchmark's own pass rule), and
prints a table: per workload the error, the time per call and, on a GPU, the
achieved bandwidth against the byte floor. Writes demo.json and demo.png.
On a machine without CUDA it runs the package's CPU path and says so.
"""

import json
import sys
from pathlib import Path

from . import REPO_ROOT, cli


def add_arguments(parser):
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "results", help="folder for demo.json and demo.png")
    parser.add_argument("--seq-lens", type=cli.positive_int, nargs="+", default=None, help="default: the 16 public workloads")
    parser.add_argument("--calls", type=cli.positive_int, default=40, help="timed calls per workload")
    parser.add_argument("--seed", type=int, default=0)


def _plot(rows, path, on_gpu) -> bool:
    """Draws demo.png; False where matplotlib is missing."""
    plt = cli.pyplot("demo", path)
    if plt is None:
        return False
    S = [r["S"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(S, [r["time_us"] for r in rows], "o-", label="rope_bwd (ours)")
    if on_gpu:
        ax.plot(S, [r["floor_us"] for r in rows], "k--", label="byte floor (bytes / copy bandwidth)")
    ax.set(xlabel="S (tokens), H=16, D=128, fp32", ylabel="us per call" + (" (cold L2)" if on_gpu else " (CPU wall clock)"),
           title="rope-bwd on the SOL-ExecBench 019 workloads")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
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
        summary += f" on {gpu_name}, floor {mean_f:.1f} us ({mean_t / mean_f:.2f}x; copy bandwidth {bandwidth:.0f} GB/s)"
    else:
        summary += " (CPU wall clock of the PyTorch path; GPU figures come from `bench` on a GPU)"
    ok = all(r["ok"] for r in rows)
    return lines + [summary, f"verification: {'all workloads pass' if ok else 'FAILURES'} "
                    f"(rel err <= {suite.TOLERANCE['float32']:g} vs float64, and the SOL-ExecBench rule on >= {suite.SOL_MIN_PASS:.0%} of elements)"]


def main(args) -> int:
    import torch
    import triton
    from tqdm import tqdm

    from . import suite
    from .load import load_kernel
    from .runmeta import run_meta
    from .timing import ColdL2Timer, bandwidth_GBps, copy_bandwidth, time_us

    kernel = load_kernel()
    on_gpu = torch.cuda.is_available()
    device = "cuda" if on_gpu else "cpu"
    where = torch.cuda.get_device_name() if on_gpu else "CPU (no GPU here: the package's PyTorch path runs)"
    print(f"loaded {kernel.__name__} from {Path(kernel.__file__).parent} through kernels.get_kernel")
    print(f"device: {where}; torch {torch.__version__}, triton {triton.__version__}")

    timer = ColdL2Timer(device, calls=args.calls)
    bandwidth = copy_bandwidth(timer)["GBps"] if on_gpu else None
    gen = torch.Generator().manual_seed(args.seed)
    rows, ok = [], True
    for S in tqdm(args.seq_lens or suite.SEQ_LENS, desc="workloads", unit="wl", file=sys.stderr):
        x = suite.make_inputs(S, device=device, generator=gen)
        out = tuple(torch.full_like(x[n], float("nan")) for n in ("q", "k", "embeddings"))
        got = kernel.rope_bwd(**x, out=out)
        ref = suite.reference_backward(**x)
        err = max(suite.rel_err(o, r) for o, r in zip(got, ref))
        passed = min(suite.sol_pass_fraction(o, r) for o, r in zip(got, ref))
        t = timer(lambda: kernel.rope_bwd(**x, out=out)).mean_us
        row = {"S": S, "rel_err": err, "sol_pass": passed, "ok": err <= suite.TOLERANCE["float32"] and passed >= suite.SOL_MIN_PASS,
               "time_us": t}
        if on_gpu:
            nbytes = suite.floor_bytes(S)
            row.update(floor_us=time_us(nbytes, bandwidth), GBps=bandwidth_GBps(nbytes, t))
        ok &= row["ok"]
        rows.append(row)

    for line in table(rows, where if on_gpu else None, bandwidth):
        print(line)

    args.out.mkdir(parents=True, exist_ok=True)
    meta = run_meta(device, kernel=kernel, timer=timer, copy_GBps=bandwidth)
    (args.out / "demo.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    plotted = _plot(rows, args.out / "demo.png", on_gpu)
    print(f"wrote {args.out / 'demo.json'}" + (f" and {args.out / 'demo.png'}" if plotted else ""))
    return 0 if ok else 1
