"""`python -m rope_bwd_triton bench --preset suite|realcall|decoder|decode|families|copybound`: verify, then time.

Presets (each a set of defaults; an option given on the command line wins):
    suite      ours and the peers against the byte floor, per task, on the 16 public
               workloads and the scaling sizes (measure.py, report.py); the demo is this
               preset with --set suite --tasks bwd,bwd_bf16 --peers "" (scripts/demo.sh)
    realcall   the call a training step makes: q/k views of one qkv, the attention's
               gradient layouts, against a copy of its bytes and the peers (realcall.py)
    decoder    the same for the decoders' apply_rotary_pos_emb: q/k views of the q and k
               projections of Llama-3-8B and Qwen3-Omni's Thinker, batches 1 and 4 (realcall.py)
    decode     the decoders' call of a generation step, forward only under no grad: S = 1 at
               B 1, 8 and 64, and a prefill at B = 1, S = 2048; GPU time and wall time per call
               in a loop (host-bound), against transformers and torch.compile (realcall.py)
    copybound  the suite's calls against the best plain Triton copy of each task's bytes
               (copybound.py)

The kernel loads as users load it (the Hub variants built into build/, kernels.get_kernel);
--ab adds other builds of it (checkouts with build/) to the same run, for A/B comparisons
in one process; --untuned sets the tuned tables aside (ROPE_BWD_TUNED=0: default_config
everywhere). Every implementation is verified against float64 before it is timed; a
workload's implementations are then timed in turns, over --rounds rounds that each start
one implementation later, so that none gains from its place in the order.
Each call is timed by two methods at once (timing.py): the kernel span (CUPTI) and CUDA
events; --timer picks the primary figure, the JSON carries both. Writes JSON (everything
measured), markdown and a plot, and prints a table; the exit status is 1 if ours failed.

On a machine without CUDA it runs the package's CPU path (--quick: tiny sizes): wall clock,
no cold L2, no second figure, Liger skipped, 3 calls; the numbers mean nothing, so the table and
plot show the verification and the figures recorded on the H200 instead (nogpu.py).
"""

import json
import os
import sys
from pathlib import Path

from . import REPO_ROOT, cli, copybound, measure, models, realcall, suite

PRESETS = {
    "suite": dict(set="all", heads=16, head_dims=[128], calls=40, rounds=6, timer="span", tasks=list(measure.TASKS),
                  peers=list(measure.PEERS), copy_mib=1024, verify_tokens=4096),
    "realcall": dict(seq_lens=list(realcall.SEQ_LENS), heads=16, head_dims=list(realcall.HEAD_DIMS), calls=40, rounds=6,
                     timer="span", dtypes=["bfloat16"], layouts=list(realcall.LAYOUTS), peers=list(realcall.PEERS),
                     variants=["halves"], verify_tokens=2048),
    "decoder": dict(seq_lens=list(realcall.DECODER_SEQ_LENS), models=list(models.DECODER_NAMES),
                    batches=list(realcall.BATCHES), calls=40, rounds=6, timer="span", dtypes=["bfloat16"],
                    layouts=["sdpa"], peers=list(realcall.PEERS), verify_tokens=2048),
    "decode": dict(seq_lens=[1, 2048], models=list(models.DECODER_NAMES), batches=[1, 8, 64], calls=40, rounds=6,
                   timer="span", dtypes=["bfloat16"], layouts=["none"], peers=["compile", "transformers"],
                   verify_tokens=2048),
    "families": dict(models=list(realcall.FAMILY_CALLS), calls=40, rounds=6, timer="span", dtypes=["bfloat16"],
                     peers=["copy", "compile", "transformers"], verify_tokens=2048),
}  # fmt: skip
PRESETS["copybound"] = dict(PRESETS["suite"], set="suite", peers=["copy"], calls=20)
QUICK = dict(seq_lens=[8, 33], heads=2, head_dims=[16], calls=3, copy_mib=16)
QUICK_COPYBOUND = dict(QUICK, seq_lens=[8], calls=2, copy_mib=1)  # Triton's interpreter is slow
QUICK_DECODER = dict(seq_lens=[8, 33], batches=[1, 2], calls=3)  # the models' real heads
QUICK_DECODE = dict(seq_lens=[1, 8], batches=[1, 2], calls=3, rounds=2)
# Timings mean nothing on the CPU (nor does its copy bandwidth): a few calls and a small buffer
# exercise the path; the demo shows the verification and the recorded H200 figures there (nogpu.py).
CPU_COPY_MIB, CPU_CALLS = 16, 3
SUITE_ENGINE = ("suite", "copybound")
REAL_CALLS = ("realcall", "decoder", "decode", "families")  # realcall.py measures them
ONLY = {"set": SUITE_ENGINE, "tasks": SUITE_ENGINE, "copy_mib": SUITE_ENGINE, "dtypes": REAL_CALLS,
        "layouts": REAL_CALLS, "variants": ("realcall",), "heads": ("suite", "realcall", "copybound"),
        "head_dims": ("suite", "realcall", "copybound"), "models": ("decoder", "decode", "families"),
        "batches": ("decoder", "decode")}  # fmt: skip


def add_arguments(parser):
    parser.add_argument("--preset", choices=list(PRESETS), default="suite", help="what to measure (default: suite)")
    parser.add_argument("--set", choices=("suite", "scaling", "all"), help="suite: the 16 public workloads; scaling: S "
                        "16384/65536 and head_dim 72/80 (suite default: all)")  # fmt: skip
    parser.add_argument("--seq-lens", type=cli.positive_int, nargs="+",
                        help="sizes to measure (suite: instead of --set; decode: S > 1 at B = 1 alone)")  # fmt: skip
    parser.add_argument("--head-dims", type=cli.head_dim, nargs="+")
    parser.add_argument("--heads", type=cli.positive_int, help="heads of q and of k (default 16)")
    parser.add_argument("--dtypes", nargs="+", choices=("bfloat16", "float16"), help="realcall, decoder, decode "
                        "(default bfloat16)")  # fmt: skip
    parser.add_argument("--layouts", nargs="+", choices=realcall.LAYOUTS, help="realcall, decoder: the upstream "
                        "gradient, sdpa's [B, H, S, D] (realcall: seen as [S, H, D]) or flash-attention's [B, S, H, D] "
                        "(decoder default: sdpa)")  # fmt: skip
    parser.add_argument("--models", nargs="+", choices=(*models.DECODER_NAMES, *realcall.FAMILY_CALLS),
                        help="decoder, decode: whose heads; families: whose call (all)")  # fmt: skip
    parser.add_argument("--batches", type=cli.positive_int, nargs="+", help="decoder, decode: batches (1 4; 1 8 64)")
    parser.add_argument("--untuned", action="store_true", help="default_config, not the GPU's tuned table")
    parser.add_argument("--variants", nargs="+", choices=realcall.VARIANTS, help="realcall: the rotary forms families "
                        "use (default halves; the peers serve halves alone)")  # fmt: skip
    parser.add_argument("--tasks", type=cli.subset_of(measure.TASKS, "tasks"), help=f"of {','.join(measure.TASKS)}")
    peers = tuple(dict.fromkeys(measure.PEERS + realcall.PEERS))
    parser.add_argument("--peers", type=cli.subset_of(peers, "peers"), help=f"comma-separated; suite: "
                        f"{','.join(measure.PEERS)}; realcall, decoder(s): {','.join(realcall.PEERS)}")  # fmt: skip
    parser.add_argument("--compile-backend", default="inductor", metavar="BACKEND",
                        help="the compile peer's torch.compile backend (default inductor)")  # fmt: skip
    parser.add_argument("--ab", type=Path, nargs="+", help="also time other builds of ours: checkouts with build/")
    parser.add_argument("--calls", type=cli.positive_int, help="timed calls per workload (default 40)")
    parser.add_argument("--rounds", type=cli.positive_int, help="the calls split over rounds in which a workload's "
                        "implementations take turns (default 6)")  # fmt: skip
    parser.add_argument("--timer", choices=("events", "span"), help="primary figure: kernel span (CUPTI) or CUDA "
                        "events; both are recorded (default: span)")  # fmt: skip
    parser.add_argument("--copy-mib", type=cli.positive_int, help="copy-bandwidth buffer (default 1024)")
    parser.add_argument("--verify-tokens", type=cli.positive_int, help="token rows verified per workload")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", type=cli.device, help="default: cuda if available, else cpu")
    parser.add_argument("--quick", action="store_true", help=f"tiny sizes that exercise the code path ({QUICK})")
    parser.add_argument("--json", type=Path, help="default: results/bench-<preset>.json")
    parser.add_argument("--markdown", type=Path, help="default: results/bench-<preset>.md")
    parser.add_argument("--plot", type=Path, help="default: results/bench-<preset>.png")
    parser.add_argument("--from-json", type=cli.existing_file, nargs="+", help="measure nothing: render the markdown "
                        "and plot from saved JSON runs of the preset")  # fmt: skip


def resolve(args):
    """Fills in what the command line left out: the option given, else --quick's, else the
    preset's; refuses options of another preset."""
    import torch

    for name, owners in ONLY.items():
        if getattr(args, name) is not None and args.preset not in owners:
            flag = "--" + name.replace("_", "-")
            presets = " and ".join([", ".join(owners[:-1]), owners[-1]] if len(owners) > 1 else owners)
            raise cli.UsageError(f"{flag} is an option of --preset {presets}, not of {args.preset}")
    wrong = sorted(set(args.peers or ()) - set(realcall.PEERS if args.preset in REAL_CALLS else measure.PEERS))
    if wrong:
        raise cli.UsageError(f"--peers: {','.join(wrong)} is not a peer of --preset {args.preset}")
    missing = [str(p) for p in args.ab or () if not (p / "build").is_dir()]
    if missing:
        raise cli.UsageError(f"--ab: no build/ in {', '.join(missing)} (run `python -m rope_bwd_triton build` there)")
    if args.preset == "copybound" and args.quick:  # Triton's interpreter, on CPU tensors
        args.device = args.device or "cpu"
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.preset == "copybound":
        if args.quick and os.environ.get("TRITON_INTERPRET") != "1":
            raise cli.UsageError("--quick runs Triton's copies on the CPU: it needs TRITON_INTERPRET=1")
        if not args.quick and args.device == "cpu":
            raise cli.UsageError(
                "copybound times Triton kernels: it needs a CUDA GPU (or --quick with TRITON_INTERPRET=1)"
            )
    quick = {"copybound": QUICK_COPYBOUND, "decoder": QUICK_DECODER, "decode": QUICK_DECODE}.get(args.preset, QUICK)
    quick = quick if args.quick else {}
    defaults = {**PRESETS[args.preset], **quick}
    if args.device == "cpu" and not args.quick:
        defaults.update(copy_mib=CPU_COPY_MIB, calls=CPU_CALLS)
    for name, value in defaults.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    for flag, ext in (("json", "json"), ("markdown", "md"), ("plot", "png")):
        if getattr(args, flag) is None:
            setattr(args, flag, REPO_ROOT / "results" / f"bench-{args.preset}.{ext}")
    if args.calls < 30 and not args.quick and args.device != "cpu":
        print(f"bench: {args.calls} calls per workload; docs/design.md (section 7) asks for >= 30", file=sys.stderr)
    return args


def header(kernel, device) -> str:
    """Where the kernel came from and what runs it (on the CPU: which of its paths)."""
    import torch
    import triton

    if device == "cpu":
        path = "Triton's interpreter" if os.environ.get("TRITON_INTERPRET") == "1" else "the package's PyTorch path"
        where = f"CPU ({path} runs; the timings mean nothing)"
    else:
        where = torch.cuda.get_device_name(device)
    return (
        f"loaded {kernel.__name__} from {Path(kernel.__file__).parent} through kernels.get_kernel\n"
        f"device: {where}; torch {torch.__version__}, triton {triton.__version__}"
    )


def run(args) -> dict:
    """Loads the kernel (and the --ab builds) and measures the preset."""
    from . import peers
    from .load import load_kernel, load_other

    if args.untuned:  # read by tuning.py when the kernel is imported
        os.environ["ROPE_BWD_TUNED"] = "0"
    peers.COMPILE_BACKEND = args.compile_backend
    kernel = load_kernel()
    others = [load_other(path) for path in args.ab or ()]
    print(header(kernel, args.device), flush=True)
    if args.preset in REAL_CALLS:
        return realcall.measure(args, kernel, others)
    after = copybound.triton_copies if args.preset == "copybound" else None
    result = measure.measure(args, kernel, others, after_workload=after)
    if after:
        result["configs"] = copybound.CONFIGS
    return result


def main(args) -> int:
    from . import report

    args = resolve(args)
    if args.from_json:
        runs = [json.loads(p.read_text()) for p in args.from_json]
    else:
        runs = [run(args)]
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(runs[0], indent=1) + "\n")
    args.markdown.parent.mkdir(parents=True, exist_ok=True)
    if args.preset in REAL_CALLS:
        plotted = realcall.render_plot(runs, args.plot)
        text = table = realcall.render_markdown(runs)
        failed = suite.failures(runs, realcall.workload_name)
    else:
        plotted = report.render_plot(runs, args.plot)
        text = report.render_markdown(runs, args.plot if plotted else None, args.markdown)
        table = report.terminal_table(runs[-1])
        if args.preset == "copybound":
            text += "\n" + "\n".join(copybound.markdown(r) for r in runs)
            table = copybound.markdown(runs[-1])
        failed = suite.failures(runs, measure.workload_name)
    args.markdown.write_text(text)
    print(table)
    rule = "within its dtype's tolerance, with SOL-ExecBench's rule met on >= 99% of the elements"
    print(f"verification against float64 ({rule}): " + (f"FAILED: {'; '.join(failed)}" if failed else "all pass"))
    written = ([] if args.from_json else [args.json]) + [args.markdown] + ([args.plot] if plotted else [])
    print("wrote " + ", ".join(map(str, written)))
    return 1 if failed else 0
