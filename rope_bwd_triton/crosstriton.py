"""`python -m rope_bwd_triton crosstriton`: our kernel as another Triton version compiles it, run
on a GPU beside that machine's own Triton. The kernel's tile layouts, and so its speed, depend on
the Triton version (rotary_triton._REGS_FIRST), and a GPU machine has one Triton; the other one
compiles anywhere, no GPU needed:

    pip install --target /tmp/triton39 triton==3.9.0
    PYTHONPATH=/tmp/triton39 python -m rope_bwd_triton crosstriton compile --out .cubins/3.9
    # on the GPU machine, with .cubins/ copied there (bash scripts/h200.sh crosstriton):
    python -m rope_bwd_triton crosstriton run .cubins/3.9 --json results/crosstriton.json

`compile` writes one cubin per case (CASES: the real call, the suite's backward and forward;
for sm_90a, with the launch configuration that --gpu's tuned table gives to the compiling
Triton) and meta.json. `run` checks the results of each cubin and of this Triton's own launch
of the same case (with this Triton's configuration) against float64, then times both in
interleaved rounds (kernel span, cold L2).

With --tune, `compile` writes a cubin per candidate configuration of TUNE_KINDS instead, and
`run` searches them as `tune` does on a GPU (every candidate checked, then timed on each S
bucket's sizes) and writes the winners to the table for the compiling Triton's versions
(tuning.device_file): the way to tune for a Triton that the GPU machine does not have."""

import json
from pathlib import Path

from . import REPO_ROOT, cli

H = 16
# (task, head_dim, S, dtype, gradient layout): "real_fwd" rotates q/k views of one qkv with fp32
# cos/sin, "real_bwd" takes the upstream gradient in sdpa's or flash's layout; "bwd", "bwd_qk",
# "fwd" are the suite's calls (angles in fp32; "bwd" with their gradient).
CASES = (
    ("real_fwd", 72, 1024, "bfloat16", ""),
    ("real_fwd", 72, 4096, "bfloat16", ""),
    ("real_bwd", 72, 1024, "bfloat16", "sdpa"),
    ("real_bwd", 72, 4096, "bfloat16", "sdpa"),
    ("real_bwd", 72, 4096, "bfloat16", "flash"),
    ("bwd", 128, 128, "bfloat16", ""),
    ("bwd", 128, 1024, "bfloat16", ""),
    ("bwd", 128, 4096, "bfloat16", ""),
    ("bwd", 72, 4096, "bfloat16", ""),
    ("bwd", 80, 4096, "bfloat16", ""),
    ("bwd", 128, 128, "float32", ""),
    ("bwd", 128, 4096, "float32", ""),
    ("bwd_qk", 128, 4096, "float32", ""),
    ("fwd", 128, 4096, "float32", ""),
    ("fwd", 128, 4096, "bfloat16", ""),
)
PTX_TYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
# What --tune searches: (task, head_dim, dtype, gradient layout). The real call's backward on sdpa's
# gradient is where Triton 3.6's tune chose a configuration of its own for the layout, and where
# Triton 3.9 ran slowest against 3.6 (benchmarks/NOTES.md).
TUNE_KINDS = (("real_bwd", 72, "bfloat16", "sdpa"), ("real_bwd", 80, "bfloat16", "sdpa"))


def tag(case) -> str:
    task, D, S, dtype, layout = case
    return f"{task}{'-' + layout if layout else ''}-D{D}-S{S}-{dtype}"


def tensors(case, device, generator=None):
    """The kernel's ten tensor arguments (rotary_triton's order: x_q, x_k, y_q, y_k, p_q, p_k,
    t0, t1, g0, g1; None where unused), whether it runs the adjoint, and which are outputs
    (NaN-filled). Inputs are random with a generator, else left unset (compile needs strides)."""
    import torch

    task, D, S, dtype, layout = case
    dt = getattr(torch, dtype)

    def rnd(*shape, d=dt):
        if generator is None:
            return torch.empty(shape, dtype=d, device=device)
        return torch.randn(shape, generator=generator, device=device).to(d)

    def out(*shape, d=dt):
        return torch.full(shape, float("nan"), dtype=d, device=device)

    tab = rnd(S, D, d=torch.float32)
    if task == "real_fwd":
        qkv = rnd(S, 3, H, D)
        return (
            (qkv[:, 0], qkv[:, 1], out(S, H, D), out(S, H, D), None, None, tab.cos(), tab.sin(), None, None),
            False,
            (2, 3),
        )
    if task == "real_bwd":
        gq, gk = (rnd(1, H, S, D).transpose(1, 2)[0] if layout == "sdpa" else rnd(S, H, D) for _ in "qk")
        return (gq, gk, out(S, H, D), out(S, H, D), None, None, tab.cos(), tab.sin(), None, None), True, (2, 3)
    x = (rnd(S, H, D), rnd(S, H, D), out(S, H, D), out(S, H, D))
    if task == "bwd":
        return (*x, rnd(S, H, D), rnd(S, H, D), tab, None, out(S, D, d=torch.float32), None), True, (2, 3, 8)
    return (*x, None, None, tab, None, None, None), task == "bwd_qk", (2, 3)


def reference(case, ts):
    """float64 results of the case's outputs, in `tensors`' output order."""
    import torch

    from . import suite

    task = case[0]
    d = [None if t is None else t.detach().cpu().double() for t in ts]
    if task == "real_fwd":
        return suite.reference_vision_forward(d[0], d[1], d[6], d[7])
    if task == "real_bwd":  # the rotation is linear: the adjoint is autograd's gradient at any q, k
        leaves = [d[0].clone().requires_grad_(), d[1].clone().requires_grad_()]
        return torch.autograd.grad(suite.reference_vision_forward(*leaves, d[6], d[7]), leaves, (d[0], d[1]))
    if task == "fwd":
        return suite.reference_forward(d[0], d[1], d[6])
    ref = suite.reference_backward(d[0], d[1], d[4] if task == "bwd" else d[0], d[5] if task == "bwd" else d[1], d[6])
    return ref if task == "bwd" else ref[:2]


def _mode(task):
    return {"real_fwd": "fwd", "real_bwd": "bwd_qk"}.get(task, task)


def compile_one(rt, case, cfg: dict, path: Path) -> dict:
    """The case's kernel at launch configuration cfg, compiled by the installed Triton for
    sm_90a into path; what cubin_launch needs of it. S is a runtime argument and a stride that
    grows with S is encoded as its multiple of S (rotary_triton._encode): one cubin serves every S."""
    import torch
    import triton
    from triton.backends.compiler import GPUTarget

    task, D, S, dtype, layout = case
    ts, adjoint, _ = tensors(case, torch.device("cpu"))
    _, key = rt._key(ts, S)
    consts = {n: v for n, v in rt._constexprs(H, D, H, adjoint, key, tuple(cfg.items())).items() if n != "num_warps"}
    args = dict(zip(("X_q", "X_k", "Y_q", "Y_k", "P_q", "P_k", "T0", "T1", "G0", "G1"), rt._pointer_args(*ts)))
    kernel = rt.rotary_kernel
    sig = {
        n: "constexpr" if n in consts else "i32" if n == "S" else "*" + PTX_TYPES[str(args[n].dtype)[6:]]
        for n in kernel.arg_names
    }
    attrs = {(kernel.arg_names.index(n),): [["tt.divisibility", 16]] for n in args}  # 16-byte aligned
    src = triton.compiler.ASTSource(fn=kernel, signature=sig, constexprs=consts, attrs=attrs)
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": cfg["num_warps"]})
    path.write_bytes(compiled.asm["cubin"])
    md = compiled.metadata
    scratch = [getattr(md, n, None) for n in ("global_scratch_size", "profile_scratch_size")]
    return dict(
        file=path.name, name=compiled.name, shared=md.shared, num_warps=md.num_warps, config=cfg, scratch=scratch
    )


def _table_config(tuning, gpu, n_sm, case):
    import torch

    task, D, S, dtype, layout = case
    elem = getattr(torch, dtype).itemsize
    return tuning.gpu_config(gpu, n_sm, _mode(task), tuning.s_bucket(S), H, H, D, elem, layout)


def compile_cases(rt, tuning, gpu: str, n_sm: int, out: Path) -> list:
    """Each case compiled for sm_90a into out/<tag>.cubin with the configuration --gpu's table
    gives this Triton; the list that meta.json holds."""
    return [
        dict(case=case, **compile_one(rt, case, _table_config(tuning, gpu, n_sm, case), out / f"{tag(case)}.cubin"))
        for case in CASES
    ]


def tune_candidates(D: int) -> list:
    """tune's grid with half rows in one channel block: narrower blocks measured 1.2-7x slower at
    head_dim 72 and 80 (benchmarks/NOTES.md)."""
    from .tune import grid

    return [cfg for cfg in grid(D, 2 * H) if cfg["BLOCK_D"] >= D // 2]


def compile_tune(rt, out: Path, current: dict) -> list:
    """Every candidate of each TUNE_KINDS kind, and the configurations its table gives now
    (`current`: {kind: [config]}), compiled into out/; the list that meta.json holds."""
    from .tune import SEARCHED

    meta = []
    for kind in TUNE_KINDS:
        task, D, dtype, layout = kind
        case = (task, D, 4096, dtype, layout)
        configs = {tuple(c[k] for k in SEARCHED): c for c in tune_candidates(D) + current[kind]}
        for cfg in configs.values():
            name = f"{task}-{layout}-D{D}-{dtype}-" + "-".join(str(cfg[k]) for k in SEARCHED) + ".cubin"
            meta.append(dict(kind=list(kind), **compile_one(rt, case, cfg, out / name)))
    return meta


def cubin_launch(rt, path: Path, m: dict, D: int, ts, S: int):
    """A launch of the cubin at `path` (meta entry m, of head_dim D) on the tensors ts, through
    torch's launcher of compiled Triton kernels, loaded as rotary_triton._static loads its own:
    pointers, S, then a null pointer for each scratch buffer that the compiling Triton's kernels take."""
    import torch
    from torch._C import _StaticCudaLauncher

    function = rt._load(str(path), m["name"], m["shared"], torch.cuda.current_device())
    scratch = tuple(None for size in m["scratch"] if size is not None)
    args = (*(t.data_ptr() for t in ts), S, *scratch)
    types = "O" * len(ts) + "i" + "O" * len(scratch)
    cfg = m["config"]
    grid = (-(-S // cfg["BLOCK_S"]), -(-(D // 2) // cfg["BLOCK_D"]))

    def launch():
        stream = torch.cuda.current_stream().cuda_stream
        _StaticCudaLauncher._launch_kernel(function, *grid, 1, m["num_warps"], m["shared"], types, args, stream)

    return launch


def _errors(launches: dict, ts, outs, ref) -> dict:
    """{name: relative error of its outputs against float64}, each launch's outputs poisoned first."""
    from . import suite

    errs = {}
    for name, launch in launches.items():
        for i in outs:
            ts[i].fill_(float("nan"))
        launch()
        errs[name] = max(suite.rel_err(ts[i], r) for i, r in zip(outs, ref))
    return errs


def _timer(calls):
    import torch

    from .timing import ColdL2Timer

    return ColdL2Timer(torch.device("cuda"), calls=calls, warmup=2, primary="span", profile=True)


def run(rt, tuning, folder: Path, saved: dict, calls: int, rounds: int) -> dict:
    """Each case: this Triton's launch with this Triton's configuration, against the cubin."""
    import torch

    from . import suite
    from .runmeta import run_meta
    from .timing import interleave

    device = torch.device("cuda")
    timer = _timer(calls)
    generator = torch.Generator(device=device).manual_seed(0)
    rows = []
    for m in saved["cases"]:
        case = tuple(m["case"])
        ts, adjoint, outs = tensors(case, device, generator)
        S = case[2]
        config = _table_config(tuning, saved["gpu"], saved["sms"], case)
        launches = {
            "this": lambda: rt._launch(ts, adjoint, config),  # noqa: B023 (called in this iteration)
            "other": cubin_launch(rt, folder / m["file"], m, case[1], rt._pointer_args(*ts), S),
        }
        errs = _errors(launches, ts, outs, reference(case, ts))
        bad = {n: e for n, e in errs.items() if not e <= suite.TOLERANCE[case[3]]}
        if bad:
            raise AssertionError(f"{tag(case)}: relative error {bad} against float64")
        times = interleave(launches, lambda name: timer(launches[name]).mean_us, rounds)
        rows.append(
            dict(
                case=case,
                config={"this": config, "other": m["config"]},
                rel_err=errs,
                us={n: sum(t) / len(t) for n, t in times.items()},
            )
        )
    return dict(
        meta=run_meta(device, timer=timer, this_triton=_version(), other_triton=saved["triton"], rounds=rounds),
        rows=rows,
    )


def shared_winner(candidates, sizes: list, base: list):
    """Of the candidates, the one of the least tune score (tune.relative_time) over all the sizes
    (sizes: [{candidate: time}] holding every candidate, base: the current configuration's time at
    each): the winner of `tune --shared`."""
    from .tune import relative_time

    return min(candidates, key=lambda i: relative_time([t[i] for t in sizes], base))


def run_tune(rt, folder: Path, saved: dict, calls: int) -> dict:
    """tune's search over the cubins of `compile --tune`: every candidate checked against float64
    on its kind's smallest S, then timed at each S bucket's sizes (tune.S_REPS). As with `tune
    --shared`, one winner per kind goes to all its buckets (shared_winner over all their sizes,
    scored against the table's current configuration), so that the Qwen call compiles one kernel
    for images of any size.
    Returns {"tuned": {table key: winner}, "buckets": {table key: the search}}."""
    import torch

    from . import suite
    from .runmeta import run_meta
    from .tune import S_REPS, relative_time

    device = torch.device("cuda")
    timer = _timer(calls)
    generator = torch.Generator(device=device).manual_seed(0)
    checked, times = {}, {}  # kind: candidates that passed; table key: [{candidate: us} per size]
    for kind, bucket, key, _ in saved["buckets"]:
        task, D, dtype, layout = kind
        entries = [m for m in saved["tune"] if m["kind"] == kind]
        times[key] = []
        for S in S_REPS[bucket]:
            case = (task, D, S, dtype, layout)
            ts, _, outs = tensors(case, device, generator)
            launches = {
                i: cubin_launch(rt, folder / m["file"], m, D, rt._pointer_args(*ts), S) for i, m in enumerate(entries)
            }
            if tuple(kind) not in checked:  # the kind's first S is its smallest
                errs = _errors(launches, ts, outs, reference(case, ts))
                checked[tuple(kind)] = [i for i, e in errs.items() if e <= suite.TOLERANCE[dtype]]
            times[key].append({i: timer(launches[i]).mean_us for i in checked[tuple(kind)]})
    tuned, buckets = {}, {}
    for kind, ok in checked.items():
        entries = [m for m in saved["tune"] if tuple(m["kind"]) == kind]
        mine = [(bucket, key, current) for k, bucket, key, current in saved["buckets"] if tuple(k) == kind]
        now = {key: next((i for i in ok if entries[i]["config"] == current), None) for _, key, current in mine}
        if None in now.values():  # the table's own configuration failed the check: nothing to score against
            raise AssertionError(f"{kind}: the table's configuration failed the check against float64")
        sizes = [t for _, key, _ in mine for t in times[key]]
        best = shared_winner(ok, sizes, [t[now[key]] for _, key, _ in mine for t in times[key]])
        for bucket, key, current in mine:
            tuned[key] = entries[best]["config"]
            buckets[key] = dict(
                sizes=S_REPS[bucket],
                best=entries[best]["config"],
                current=current,
                best_vs_current=relative_time([t[best] for t in times[key]], [t[now[key]] for t in times[key]]),
                us=[dict(config=entries[i]["config"], us=[t[i] for t in times[key]]) for i in ok],
                failed=[m["config"] for i, m in enumerate(entries) if i not in ok],
            )
    return dict(
        meta=run_meta(device, timer=timer, this_triton=_version(), other_triton=saved["triton"]),
        tuned=tuned,
        buckets=buckets,
    )


def _version() -> str:
    import triton

    return triton.__version__


def add_arguments(parser):
    sub = parser.add_subparsers(dest="step", required=True)
    c = sub.add_parser("compile", help="compile the cases with the installed Triton (no GPU needed)")
    c.add_argument("--out", type=Path, required=True, help="folder for the cubins and meta.json (must not exist)")
    c.add_argument("--gpu", default="NVIDIA H200", help="whose tuned configurations to use (its SM count: --sms)")
    c.add_argument("--sms", type=cli.positive_int, default=132)
    c.add_argument("--tune", action="store_true", help="every candidate configuration of TUNE_KINDS instead")
    r = sub.add_parser("run", help="on a CUDA GPU: check and time the cubins beside this machine's Triton")
    r.add_argument("folder", type=Path, help="what `compile --out` wrote")
    r.add_argument("--json", type=Path, default=Path("results") / "crosstriton.json")
    r.add_argument("--calls", type=cli.positive_int, default=30)
    r.add_argument("--rounds", type=cli.positive_int, default=2)
    r.add_argument(
        "--configs-out",
        type=Path,
        help="with cubins of compile --tune: the table the winners are merged into (default: the package's "
        "table of --gpu for the compiling Triton's versions, tuning.device_file)",
    )


def _compile(args, rt, tuning) -> dict:
    import torch

    from .tune import S_REPS

    meta = dict(triton=_version(), gpu=args.gpu, sms=args.sms, later_triton=tuning.later_triton())
    if not args.tune:
        return dict(meta, cases=compile_cases(rt, tuning, args.gpu, args.sms, args.out))
    buckets = []  # [kind, S bucket, table key, the table's configuration for the compiling Triton]
    for kind in TUNE_KINDS:
        task, D, dtype, layout = kind
        elem = getattr(torch, dtype).itemsize
        for bucket, sizes in S_REPS.items():
            key = tuning.bucket(_mode(task), tuning.bucket_size(bucket), 2 * H, D, elem, layout)
            config = _table_config(tuning, args.gpu, args.sms, (task, D, sizes[-1], dtype, layout))
            buckets.append([list(kind), bucket, key, config])
    current = {kind: [b[3] for b in buckets if tuple(b[0]) == kind] for kind in TUNE_KINDS}
    return dict(meta, buckets=buckets, tune=compile_tune(rt, args.out, current))


def _saved(args) -> dict:
    """The folder's meta.json, refused where `run` cannot use it."""
    if not (args.folder / "meta.json").is_file():
        raise cli.UsageError(f"folder: no meta.json in {args.folder} (write it with `crosstriton compile --out`)")
    saved = json.loads((args.folder / "meta.json").read_text())
    if not {"sms", "later_triton"} <= saved.keys():
        raise cli.UsageError(f"folder: {args.folder} was compiled by an older crosstriton: compile it again")
    if args.configs_out and "tune" not in saved:
        raise cli.UsageError(f"--configs-out: {args.folder} holds cases, not the candidates of `compile --tune`")
    return saved


def main(args) -> int:
    from .load import load_kernel, submodule

    if args.step == "compile":
        if args.out.exists():
            raise cli.UsageError(f"--out: {args.out} exists; give a new folder")
        kernel = load_kernel()
        rt, tuning = submodule(kernel, "rotary_triton"), submodule(kernel, "tuning")
        args.out.mkdir(parents=True)
        meta = _compile(args, rt, tuning)
        (args.out / "meta.json").write_text(json.dumps(meta, indent=1))
        what = f"{len(meta['tune'])} candidate" if args.tune else f"{len(meta['cases'])}"
        print(f"{what} cubins compiled by Triton {_version()} for sm_90a ({args.gpu}'s configurations): {args.out}")
        return 0
    import torch

    saved = _saved(args)
    if not torch.cuda.is_available():
        raise cli.UsageError("crosstriton run launches cubins: it needs a CUDA GPU")
    kernel = load_kernel()
    rt, tuning = submodule(kernel, "rotary_triton"), submodule(kernel, "tuning")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    if "tune" in saved:
        result = run_tune(rt, args.folder, saved, args.calls)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
        from .tune import merge_write

        table = tuning.device_file(saved["gpu"], saved["later_triton"]).name
        out = args.configs_out or REPO_ROOT / "torch-ext" / "rope_bwd" / "configs" / table
        merge_write(out, result["tuned"])
        print(f"kernel span, cold L2; {result['meta']['gpu']}; cubins of Triton {saved['triton']}")
        for key, b in result["buckets"].items():
            best, now = tuple(b["best"].values()), tuple(b["current"].values())
            print(f"{key:34s} best {best}: {b['best_vs_current']:.3f}x the time of {now}")
        print(f"wrote {out} and {args.json}")
        return 0
    result = run(rt, tuning, args.folder, saved, args.calls, args.rounds)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    this, other = result["meta"]["this_triton"], result["meta"]["other_triton"]
    print(f"kernel span, cold L2, us; {result['meta']['gpu']}; Triton {this} (this machine) and {other} (cubins)")
    for row in result["rows"]:
        us = row["us"]
        print(f"{tag(row['case']):32s} {us['this']:8.2f} {us['other']:8.2f}  {us['other'] / us['this']:.3f}x")
    print(f"wrote {args.json}")
    return 0
