"""`python -m rope_bwd_triton ncu`: hardware counters (Nsight Compute) for our kernel and for an
elementwise kernel that moves the same bytes, on the workloads whose ratios RESULTS.md discusses:
why a ratio is what it is.

    ncu --clock-control none --nvtx --nvtx-include "profile/" \
        --metrics $(python -m rope_bwd_triton ncu metrics) --csv --page raw \
        python -m rope_bwd_triton ncu run --labels labels.json > ncu.csv
    python -m rope_bwd_triton ncu report ncu.csv --labels labels.json --markdown ncu.md

(`bash scripts/h200.sh ncu` runs both.) `run` launches, inside one NVTX range per workload,
our kernel through the loaded package (the bench's calls, shipped launch configurations) and
then `torch.neg` over a float32 buffer of the task's floor bytes (half read, half written): a
streaming kernel of PyTorch's, the profiled stand-in for the bench's device copy (a copy engine
transfer has no counters). ncu flushes the caches before each kernel (cold L2, as the bench).
"""

import csv
import json
from pathlib import Path

from . import cli

# (bench task, S, H, D, head_dim whose shipped launch configuration to use; None: D's own)
WORKLOADS = [
    ("bwd", 128, 16, 128, None),
    ("bwd", 1024, 16, 128, None),
    ("bwd", 2213, 16, 128, None),
    ("bwd", 4096, 16, 128, None),
    ("bwd", 16384, 16, 128, None),
    ("bwd", 16384, 16, 72, None),
    ("bwd_qk", 128, 16, 128, None),
    ("bwd_qk", 4096, 16, 128, None),
    ("fwd", 4096, 16, 128, None),
    ("bwd_bf16", 613, 16, 128, None),
    ("bwd_bf16", 4096, 16, 128, None),
    ("bwd_bf16", 16384, 16, 128, None),
    ("bwd_bf16", 16384, 16, 72, None),
    ("bwd_bf16", 16384, 16, 80, None),
    # head_dim 128 launched as head_dim 72 is: what the head size changes at one configuration
    ("bwd_bf16", 16384, 16, 128, 72),
    ("fwd_bf16", 16384, 16, 72, None),
]
# The real model's call (realcall.py: bf16, 16 heads, q/k views of one qkv, cos/sin without
# gradient), each of its two kernels: (part, gradient layout, S, D). The forward reads the views;
# the q/k backward reads the upstream gradient in sdpa's layout (head stride S*D) or flash's.
REALCALL_WORKLOADS = [
    ("fwd", "sdpa", 4096, 72),
    ("bwd_qk", "sdpa", 4096, 72),
    ("bwd_qk", "flash", 4096, 72),
    ("fwd", "sdpa", 4096, 80),
    ("bwd_qk", "sdpa", 4096, 80),
    ("bwd_qk", "flash", 4096, 80),
    ("bwd_qk", "sdpa", 16384, 72),
]
# column: (ncu metric, scale, format)
COLUMNS = {
    "us": ("gpu__time_duration.sum", 1e-3, "{:.1f}"),
    "DRAM busy %": ("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed", 1, "{:.0f}"),
    "DRAM MB read": ("dram__bytes_read.sum", 1e-6, "{:.1f}"),
    "DRAM MB written": ("dram__bytes_write.sum", 1e-6, "{:.1f}"),
    "warps active %": ("sm__warps_active.avg.pct_of_peak_sustained_active", 1, "{:.0f}"),
    "occupancy limit %": ("sm__maximum_warps_per_active_cycle_pct", 1, "{:.0f}"),
    "registers": ("launch__registers_per_thread", 1, "{:.0f}"),
    "programs": ("launch__grid_size", 1, "{:.0f}"),
    "issue active %": ("sm__inst_executed.avg.pct_of_peak_sustained_elapsed", 1, "{:.0f}"),
    "M instructions": ("smsp__inst_executed.sum", 1e-6, "{:.1f}"),
    "M load requests": ("l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum", 1e-6, "{:.2f}"),
    "sectors per load request": ("l1tex__average_t_sectors_per_request_pipe_lsu_mem_global_op_ld.ratio", 1, "{:.1f}"),
    # what the L1 sends on to the L2: more than the bytes when accesses share 32-byte sectors
    "M L2 sectors read": ("lts__t_sectors_srcunit_tex_op_read.sum", 1e-6, "{:.2f}"),
    "M L2 sectors written": ("lts__t_sectors_srcunit_tex_op_write.sum", 1e-6, "{:.2f}"),
    "L2 busy %": ("lts__throughput.avg.pct_of_peak_sustained_elapsed", 1, "{:.0f}"),
}


def run(args):
    from . import bench
    from .load import load_kernel
    from .runmeta import run_meta
    from .suite import floor_bytes

    kernel = load_kernel()
    impls = {i.task: i for i in bench.IMPLS if i.peer is None}
    labels = []
    for task, S, H, D, config_of in WORKLOADS:
        _, mode, dtype = bench.TASKS[task]
        x = bench.Data(S, H, D, "cuda", seed=S).inputs(mode, dtype)
        if config_of is None:
            call = impls[task].make(kernel, x)
        else:
            call = _backward_with_config_of(kernel, x, config_of)
        _profile(call, floor_bytes(S, H, D, elem=x[0].element_size(), mode=mode))  # as the bench's copy reference
        name = f"{task} S={S} D={D}" + (f", launched as D={config_of}" if config_of else "")
        labels += [(name, "ours"), (name, "torch.neg, same bytes")]
    for part, layout, S, D in REALCALL_WORKLOADS:
        _profile(*_real_call_part(kernel, part, layout, S, 16, D))
        name = f"real call {part} S={S} D={D}" + (f", {layout} gradient" if part != "fwd" else ", q/k views of qkv")
        labels += [(name, "ours"), (name, "torch.neg, same bytes")]
    meta = run_meta("cuda", kernel=kernel)
    args.labels.parent.mkdir(parents=True, exist_ok=True)
    args.labels.write_text(json.dumps({"meta": meta, "kernels": labels}, indent=1) + "\n")


def _profile(call, nbytes):
    """call(), then torch.neg over nbytes (half read, half written), inside the NVTX range that
    ncu profiles; each warmed up (compiled) outside it."""
    import torch

    src = torch.randn(nbytes // 8, device="cuda")
    dst = torch.empty_like(src)
    call()
    torch.neg(src, out=dst)
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("profile")
    call()
    torch.neg(src, out=dst)
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()


def _real_call_part(kernel, part, layout, S, H, D):
    """One kernel of the real call (realcall.py's inputs, bf16) as the package launches it: the
    forward, or the op that autograd calls for the q/k backward; and the bytes that part moves."""
    import torch

    from .load import submodule
    from .realcall import floor_bytes, make_inputs

    x = make_inputs(S, H, D, torch.bfloat16, layout, "cuda", torch.Generator().manual_seed(S))
    q, k, cos, sin = (x[n].detach() for n in ("q", "k", "cos", "sin"))
    if part == "fwd":
        call = lambda: kernel.apply_rotary_pos_emb_vision(q, k, cos, sin)  # noqa: E731
    else:
        op = submodule(kernel, "ops").rotary_bwd
        call = lambda: op(x["gq"], x["gk"], None, None, cos, sin, True, True)  # noqa: E731
    return call, floor_bytes(S, H, D, 2)[part[:3]]


def _backward_with_config_of(kernel, x, head_dim):
    """The full backward (x: gq, gk, q, k, embeddings) launched with the shipped configuration
    of another head_dim."""
    import torch

    from .load import submodule

    gq, gk, q, k, emb = x
    S, H, _ = gq.shape
    config = submodule(kernel, "tuning").config_for("bwd", S, H, H, head_dim, gq.element_size(), gq.device)
    out = [torch.empty_like(t) for t in (gq, gk, emb)]
    rt = submodule(kernel, "rotary_triton")
    return lambda: rt.launch_bwd(gq, gk, emb, None, dq=out[0], dk=out[1], q=q, k=k, dtable=out[2], config=config)


def report(args):
    from .output import markdown_table
    from .runmeta import recorded_versions

    labels = json.loads(args.labels.read_text())
    # ncu's CSV: its own log lines, then a header row, a units row and one row per kernel in launch order
    lines = [line for line in args.csv.read_text().splitlines() if line.startswith('"')]
    table = list(csv.reader(lines))
    header, kernels = table[0], table[2:]
    if len(kernels) != len(labels["kernels"]):
        raise cli.UsageError(
            f"{args.csv}: {len(kernels)} profiled kernels for {len(labels['kernels'])} labels in {args.labels}"
        )
    col = {name: header.index(metric) for name, (metric, _, _) in COLUMNS.items()}
    rows = [
        [
            workload,
            what,
            *(fmt.format(float(row[col[name]].replace(",", "")) * scale) for name, (_, scale, fmt) in COLUMNS.items()),
        ]
        for (workload, what), row in zip(labels["kernels"], kernels)
    ]
    meta = labels["meta"]
    text = (
        f"Device: {meta['gpu']}; torch {recorded_versions(meta)['torch']}; "
        f"kernel variant `{meta['kernel_variant']}`\n\n" + markdown_table(["workload", "kernel", *COLUMNS], rows) + "\n"
    )
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text)
    print(text)


def add_arguments(parser):
    actions = parser.add_subparsers(dest="action", required=True, metavar="{metrics,run,report}")
    actions.add_parser("metrics", help="print the --metrics list for ncu")
    p = actions.add_parser("run", help="launch the workloads (run it under ncu)")
    p.add_argument("--labels", type=Path, required=True, help="write the profiled kernels' labels here (JSON)")
    p = actions.add_parser("report", help="ncu's CSV and the labels -> markdown table")
    p.add_argument("csv", type=cli.existing_file)
    p.add_argument("--labels", type=cli.existing_file, required=True, help="what `run` wrote")
    p.add_argument("--markdown", type=Path, help="also write the table here")


def main(args) -> int:
    if args.action == "metrics":
        print(",".join(metric for metric, _, _ in COLUMNS.values()))
    elif args.action == "run":
        import torch

        if not torch.cuda.is_available():
            raise cli.UsageError("ncu run launches our kernel on a CUDA GPU (under Nsight Compute)")
        run(args)
    else:
        report(args)
    return 0
