"""`python -m rope_bwd_triton crosstriton`: our kernel as another Triton version compiles it, run
on a GPU beside that machine's own Triton. The kernel's tile layouts, and so its speed, depend on
the Triton version (rotary_triton._REGS_FIRST), and a GPU machine has one Triton; the other one
compiles anywhere, no GPU needed:

    pip install --target /tmp/triton39 triton==3.9.0
    PYTHONPATH=/tmp/triton39 python -m rope_bwd_triton crosstriton compile --out .cubins/3.9
    # on the GPU machine, with .cubins/ copied there (bash scripts/h200.sh crosstriton):
    python -m rope_bwd_triton crosstriton run .cubins/3.9 --json results/crosstriton.json

`compile` writes one cubin per case (CASES: the real call, the suite's backward and forward;
for sm_90a, with the launch configuration that --gpu's tuned table gives) and meta.json. `run`
checks the results of each cubin and of this Triton's own launch of the same case against
float64, then times both in interleaved rounds (kernel span, cold L2)."""

import json
from pathlib import Path

from . import cli

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


def compile_cases(rt, tuning, gpu: str, n_sm: int, out: Path) -> list:
    """Each case compiled by the installed Triton for sm_90a into out/<tag>.cubin; the list that
    meta.json holds."""
    import torch
    import triton
    from triton.backends.compiler import GPUTarget

    meta = []
    for case in CASES:
        task, D, S, dtype, layout = case
        ts, adjoint, _ = tensors(case, torch.device("cpu"))
        mode = {"real_fwd": "fwd", "real_bwd": "bwd_qk"}.get(task, task)
        elem = getattr(torch, dtype).itemsize
        cfg = tuning.gpu_config(gpu, n_sm, mode, tuning.s_bucket(S), H, H, D, elem, layout)
        _, key = rt._key(ts, S)
        consts = {
            n: v for n, v in rt._constexprs(H, D, H, adjoint, key, tuple(cfg.items())).items() if n != "num_warps"
        }
        args = dict(zip(("X_q", "X_k", "Y_q", "Y_k", "P_q", "P_k", "T0", "T1", "G0", "G1"), rt._pointer_args(*ts)))
        kernel = rt.rotary_kernel
        sig = {
            n: "constexpr" if n in consts else "i32" if n == "S" else "*" + PTX_TYPES[str(args[n].dtype)[6:]]
            for n in kernel.arg_names
        }
        attrs = {(kernel.arg_names.index(n),): [["tt.divisibility", 16]] for n in args}  # 16-byte aligned
        src = triton.compiler.ASTSource(fn=kernel, signature=sig, constexprs=consts, attrs=attrs)
        compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": cfg["num_warps"]})
        (out / f"{tag(case)}.cubin").write_bytes(compiled.asm["cubin"])
        md = compiled.metadata
        scratch = [getattr(md, n, None) for n in ("global_scratch_size", "profile_scratch_size")]
        meta.append(
            dict(case=case, name=compiled.name, shared=md.shared, num_warps=md.num_warps, config=cfg, scratch=scratch)
        )
    return meta


def cubin_launch(rt, path: Path, m: dict, ts, S: int):
    """A launch of the cubin at `path` (meta entry m) on the tensors ts, through torch's launcher
    of compiled Triton kernels, loaded as rotary_triton._static loads its own: pointers, S, then
    a null pointer for each scratch buffer that the compiling Triton's kernels take."""
    import torch
    from torch._C import _StaticCudaLauncher

    function = rt._load(str(path), m["name"], m["shared"], torch.cuda.current_device())
    scratch = tuple(None for size in m["scratch"] if size is not None)
    args = (*(t.data_ptr() for t in ts), S, *scratch)
    types = "O" * len(ts) + "i" + "O" * len(scratch)
    cfg = m["config"]
    grid = (-(-S // cfg["BLOCK_S"]), -(-(m["case"][1] // 2) // cfg["BLOCK_D"]))

    def launch():
        stream = torch.cuda.current_stream().cuda_stream
        _StaticCudaLauncher._launch_kernel(function, *grid, 1, m["num_warps"], m["shared"], types, args, stream)

    return launch


def run(rt, folder: Path, calls: int, rounds: int) -> dict:
    import torch

    from . import suite
    from .runmeta import run_meta
    from .timing import ColdL2Timer, interleave

    saved = json.loads((folder / "meta.json").read_text())
    device = torch.device("cuda")
    timer = ColdL2Timer(device, calls=calls, warmup=2, primary="span", profile=True)
    generator = torch.Generator(device=device).manual_seed(0)
    rows = []
    for m in saved["cases"]:
        case = tuple(m["case"])
        ts, adjoint, outs = tensors(case, device, generator)
        ref = reference(case, ts)
        S = case[2]
        launches = {
            "this": lambda: rt._launch(ts, adjoint, m["config"]),
            "other": cubin_launch(rt, folder / f"{tag(case)}.cubin", m, rt._pointer_args(*ts), S),
        }
        errs = {}
        for name, launch in launches.items():
            for i in outs:
                ts[i].fill_(float("nan"))
            launch()
            errs[name] = max(suite.rel_err(ts[i], r) for i, r in zip(outs, ref))
        bad = {n: e for n, e in errs.items() if not e <= suite.TOLERANCE[case[3]]}
        if bad:
            raise AssertionError(f"{tag(case)}: relative error {bad} against float64")
        times = interleave(launches, lambda name: timer(launches[name]).mean_us, rounds)
        rows.append(
            dict(case=case, config=m["config"], rel_err=errs, us={n: sum(t) / len(t) for n, t in times.items()})
        )
    return dict(
        meta=run_meta(device, timer=timer, this_triton=_version(), other_triton=saved["triton"], rounds=rounds),
        rows=rows,
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
    r = sub.add_parser("run", help="on a CUDA GPU: check and time the cubins beside this machine's Triton")
    r.add_argument("folder", type=Path, help="what `compile --out` wrote")
    r.add_argument("--json", type=Path, default=Path("results") / "crosstriton.json")
    r.add_argument("--calls", type=cli.positive_int, default=30)
    r.add_argument("--rounds", type=cli.positive_int, default=2)


def main(args) -> int:
    from .load import load_kernel, submodule

    if args.step == "compile":
        if args.out.exists():
            raise cli.UsageError(f"--out: {args.out} exists; give a new folder")
        kernel = load_kernel()
        rt, tuning = submodule(kernel, "rotary_triton"), submodule(kernel, "tuning")
        args.out.mkdir(parents=True)
        cases = compile_cases(rt, tuning, args.gpu, args.sms, args.out)
        (args.out / "meta.json").write_text(json.dumps(dict(triton=_version(), gpu=args.gpu, cases=cases), indent=1))
        print(
            f"{len(cases)} cubins compiled by Triton {_version()} for sm_90a ({args.gpu}'s configurations): {args.out}"
        )
        return 0
    import torch

    if not (args.folder / "meta.json").is_file():
        raise cli.UsageError(f"folder: no meta.json in {args.folder} (write it with `crosstriton compile --out`)")
    if not torch.cuda.is_available():
        raise cli.UsageError("crosstriton run launches cubins: it needs a CUDA GPU")
    kernel = load_kernel()
    result = run(submodule(kernel, "rotary_triton"), args.folder, args.calls, args.rounds)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    this, other = result["meta"]["this_triton"], result["meta"]["other_triton"]
    print(f"kernel span, cold L2, us; {result['meta']['gpu']}; Triton {this} (this machine) and {other} (cubins)")
    for row in result["rows"]:
        us = row["us"]
        print(f"{tag(row['case']):32s} {us['this']:8.2f} {us['other']:8.2f}  {us['other'] / us['this']:.3f}x")
    print(f"wrote {args.json}")
    return 0
