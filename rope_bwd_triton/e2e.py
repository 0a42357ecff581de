"""End to end: one training step (forward + backward) of a transformers vision encoder.

A random-init Qwen3-Omni vision encoder at real width (hidden 1152, 16 heads of
72, MLP 4304), depth 8, bf16, sdpa attention, one image of 4096 and of 9216
tokens; three variants in one process, same weights and inputs, all warmed up and
then timed in interleaved rounds (so that drift hits all alike); median step time
over CUDA events, plus the host time per step (is the step host-bound?):
    eager        transformers as shipped
    kernelized   the kernel loaded with kernels.get_kernel(<repo-id>, version=1) and
                 its integrations.kernelize_vision_rotary(model, mode=Mode.TRAINING)
    identity     the rotary replaced by (q, k) -> (q, k): the bound a perfect rotary
                 kernel could reach
The kernel resolves like a user's: from the Hub, or offline from a cache installed
with `python -m rope_bwd_triton publish --to-cache DIR` and run with
HF_HUB_OFFLINE=1 KERNELS_CACHE=DIR.
With --compile, every variant runs torch.compile'd (the kernel kernelized with
Mode.TORCH_COMPILE too), so our ops' Python dispatch leaves the step; the compiled
regions keep host time of their own (guards, wrappers), which the bound pays too.
With --profile, one more step per variant runs under torch.profiler: operator table,
chrome trace and a kernel summary (time, launches, rotary kernels) per variant.

The encoder comes from models.py; --varres (varres.py) trains on images of varying size.

--decoder trains a decoder instead: a random-init LlamaModel at Llama-3-8B's width (hidden 4096,
32 query heads and 8 key/value heads of 128, MLP 14336), --layers layers, bf16, sdpa, --batch
sequences of each --tokens length; the same variants, the rotary being transformers' decoder
apply_rotary_pos_emb and the kernelized one that of integrations.kernelize_rotary.
"""

import argparse
import copy
import json
import statistics
import time
from pathlib import Path
from typing import NamedTuple

import torch

from . import REPO_ROOT, cli, varres
from .build import repo_id
from .fresh import add_result_argument
from .models import (
    LLAMA3_8B,
    OMNI,
    QUICK_DECODER,
    QUICK_OMNI,
    REAL_OMNI,
    TRAINED,
    identity_rotary,
    make_config,
    make_decoder,
    make_images,
    make_tokens,
    make_vision_model,
    modeling_module,
    plain_function,
    square_grid,
    step,
    sync,
)


def timed_step(model, *inputs):
    """One training step from an idle device: (step ms, enqueue ms, wall ms).
    step: CUDA events around it (on CPU, the wall time); enqueue: host time until
    backward() returns, before the final synchronize (it includes the syncs inside the
    step: transformers' sdpa vision attention calls .tolist() in every layer);
    wall: host time until the device is done. enqueue close to step means host-bound."""
    cuda = inputs[0].is_cuda
    model.zero_grad(set_to_none=True)
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
    t0 = time.perf_counter()
    step(model, *inputs)[1].backward()
    t1 = time.perf_counter()
    if cuda:
        end.record()
    sync(inputs[0].device)
    t2 = time.perf_counter()
    wall = (t2 - t0) * 1e3
    return (start.elapsed_time(end) if cuda else wall), (t1 - t0) * 1e3, wall


def time_variants(variants, install, inputs, *, warmup, rounds, per_round, after_warmup=None):
    """Every variant warmed up first, then `rounds` rounds of `per_round` steps of each
    variant in turn, the order rotated each round, so that drift (clocks, temperature,
    allocator) is shared by all variants. {variant: [(step, enqueue, wall) ms, ...]}.
    after_warmup() is called between the two."""
    from .timing import interleave

    for name in variants:
        install(name)
        for _ in range(warmup):
            timed_step(variants[name], *inputs)
    if after_warmup:
        after_warmup()

    def turn(name):
        install(name)
        return [timed_step(variants[name], *inputs) for _ in range(per_round)]

    turns = interleave(variants, turn, rounds, rotate=True)
    return {name: [s for steps in each for s in steps] for name, each in turns.items()}


def _mentions_rotary(event):
    """Whether the event or an operator (or autograd.Function) it runs inside has "rotary" in
    its name, in any case."""
    while event is not None:
        if "rotary" in event.name.lower():
            return True
        event = event.cpu_parent
    return False


def profile_summary(events, cuda):
    """What one profiled step ran. On CUDA: the GPU kernels (time, count; memcpy/memset
    counted apart) and those whose name mentions rotary (ours is rotary_kernel). On CPU,
    which has no kernels, the leaf operators stand in for them (their CPU time), and the
    rotary ones are those inside an operator whose name mentions rotary."""
    from torch.autograd import DeviceType

    if cuda:
        # record_function ranges also appear on the GPU timeline (user annotations): not kernels
        device = [e for e in events if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)]
        copies = [e for e in device if e.name.startswith(("Memcpy", "Memset"))]
        kernels = [e for e in device if not e.name.startswith(("Memcpy", "Memset"))]
        rotary = [e for e in kernels if "rotary" in e.name]
        ms = lambda evs: sum(e.time_range.elapsed_us() for e in evs) / 1e3  # noqa: E731
    else:
        ops = [e for e in events if e.device_type == DeviceType.CPU and not e.is_async]
        kernels, copies = [e for e in ops if not e.cpu_children], []
        rotary = [e for e in kernels if _mentions_rotary(e)]
        ms = lambda evs: sum(e.cpu_time_total for e in evs) / 1e3  # noqa: E731
    return {
        "kernel_ms": ms(kernels),
        "launches": len(kernels),
        "rotary_ms": ms(rotary),
        "rotary_launches": len(rotary),
        "memcpy_memset": len(copies),
        "copy_ms": ms(copies),
    }


def profile_step(model, inputs, path_stem: Path):
    """One step under torch.profiler: writes <stem>.txt (operator table) and
    <stem>.json.gz (chrome trace); returns profile_summary."""
    from torch.profiler import ProfilerActivity, profile

    cuda = inputs[0].is_cuda
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        model.zero_grad(set_to_none=True)
        step(model, *inputs)[1].backward()
        sync(inputs[0].device)
    sort_by = "device_time_total" if cuda else "cpu_time_total"
    path_stem.with_suffix(".txt").write_text(prof.key_averages().table(sort_by=sort_by, row_limit=25) + "\n")
    prof.export_chrome_trace(str(path_stem) + ".json.gz")
    summary = profile_summary(prof.events(), cuda)
    summary.update(table=path_stem.name + ".txt", trace=path_stem.name + ".json.gz")
    return summary


def _compiled_frames() -> int:
    """Frames dynamo has compiled in this process (it counts cache misses, not calls)."""
    from torch._dynamo.utils import counters

    return counters["frames"]["total"]


class Target(NamedTuple):
    """What a run trains: the modeling module whose rotary global (`name`) each variant sets, the
    eager model, its inputs for n tokens, and kernelize(model, mode) -> the kernelized model."""

    modeling: object
    name: str
    eager: torch.nn.Module
    inputs: object
    kernelize: object


def vision_target(rope, *, dtype, device, model_config, repo_id) -> Target:
    """Qwen3-Omni's vision encoder, one square image of n tokens."""
    eager = make_vision_model(OMNI, dtype=dtype, device=device, **model_config)

    def kernelize(model, mode):
        return rope.integrations.kernelize_vision_rotary(model, mode=mode, device=device.type, repo_id=repo_id)

    def inputs(n):
        return make_images(eager, [square_grid(n, eager.config.spatial_merge_size)])

    return Target(modeling_module(OMNI), "apply_rotary_pos_emb_vision", eager, inputs, kernelize)


def decoder_target(rope, *, dtype, device, model_config, repo_id, batch, layers) -> Target:
    """A LlamaModel of `layers` layers, `batch` random sequences of n tokens."""
    eager = make_decoder(dtype=dtype, device=device, layers=layers, **model_config)

    def kernelize(model, mode):
        return rope.integrations.kernelize_rotary(model, mode=mode, device=device.type, repo_id=repo_id)

    def inputs(n):
        return (make_tokens(eager, batch, n),)

    return Target(modeling_module("llama"), "apply_rotary_pos_emb", eager, inputs, kernelize)


def run(target: Target, rope, *, tokens, warmup, rounds, per_round, profile_dir=None, compile=None):
    """({tokens: {variant: {"steps": [(step, enqueue, wall) ms, ...], "profile": summary}}},
    {tokens: {"warm-up": frames, "timed": frames}} compiled by dynamo when compile else {})
    ("profile" only with profile_dir); transformers' rotary is restored afterwards.
    compile (a torch.compile backend, or None): kernelize with Mode.TORCH_COMPILE too, then every
    model compiled in place (nn.Module.compile); its warm-up steps compile each variant."""
    import kernels

    modeling, eager = target.modeling, target.eager
    shipped = getattr(modeling, target.name)
    # The plain function: kernelize may swap the forward of transformers' own layer in place.
    original = plain_function(shipped)
    mode = kernels.Mode.TRAINING | kernels.Mode.TORCH_COMPILE if compile else kernels.Mode.TRAINING
    kernelized = target.kernelize(copy.deepcopy(eager), mode)
    layer = getattr(modeling, target.name)
    try:
        runs = rope.integrations.kernelized_layers(kernelized)
        if not runs or None in runs:
            raise RuntimeError(f"kernelize kept transformers' rotary ({runs}): no kernel would be timed")
        if compile:
            # dynamo guards on the rotary global, so each variant gets its own graphs (made in
            # its warm-up) and the rounds switch between them without recompiling.
            from .peers import raise_recompile_limit

            raise_recompile_limit()
            eager.compile(backend=compile)
            kernelized.compile(backend=compile)
        # The rotary is a module global shared by every model of the family: each
        # variant installs its own before its steps.
        models = {"eager": eager, "kernelized": kernelized, "identity": eager}
        rotaries = {"eager": original, "kernelized": layer, "identity": identity_rotary}

        def install(name):
            setattr(modeling, target.name, rotaries[name])

        results, frames = {}, {}
        for n in tokens:
            inputs = target.inputs(n)
            start = _compiled_frames()
            warm = []
            steps = time_variants(
                models,
                install,
                inputs,
                warmup=warmup,
                rounds=rounds,
                per_round=per_round,
                after_warmup=lambda: warm.append(_compiled_frames()),
            )
            if compile:
                frames[n] = {"warm-up": warm[0] - start, "timed": _compiled_frames() - warm[0]}
            results[n] = {name: {"steps": s} for name, s in steps.items()}
            if profile_dir is not None:
                for name in models:
                    install(name)
                    results[n][name]["profile"] = profile_step(
                        models[name], inputs, profile_dir / f"profile-{n}-{name}"
                    )
        return results, frames
    finally:
        rope.integrations.restore_transformers()
        setattr(modeling, target.name, shipped)


def summarize(results, rounds):
    """JSON-ready: medians per variant over all timed steps, and per round (drift)."""
    med = statistics.median
    out = {"results_ms": {}, "host_ms": {}, "round_medians_ms": {}}
    for n, row in results.items():
        out["results_ms"][n] = {v: med(s[0] for s in r["steps"]) for v, r in row.items()}
        out["host_ms"][n] = {
            v: {"enqueue": med(s[1] for s in r["steps"]), "wall": med(s[2] for s in r["steps"])} for v, r in row.items()
        }
        out["round_medians_ms"][n] = {}
        for v, r in row.items():
            k = len(r["steps"]) // rounds
            out["round_medians_ms"][n][v] = [med(s[0] for s in r["steps"][i * k : (i + 1) * k]) for i in range(rounds)]
        if any("profile" in r for r in row.values()):
            out.setdefault("profile", {})[n] = {v: r["profile"] for v, r in row.items()}
    return out


TARGET = 0.03  # the kernelized step within 3% of the identity bound


def paired_vs_bound(report, tokens):
    """Kernelized over identity round by round (a round times the variants back to back, so
    drift of the machine cancels): (median of kernelized / identity - 1, rounds within TARGET,
    rounds)."""
    rounds = report["round_medians_ms"][tokens]
    ratios = [k / i - 1 for k, i in zip(rounds["kernelized"], rounds["identity"])]
    return statistics.median(ratios), sum(r <= TARGET for r in ratios), len(ratios)


def markdown(report, meta) -> str:
    from .output import markdown_table, recorded_versions

    # e2e.json files written before run_meta hold no "gpu": their "device" is the GPU's name or CPU
    where = meta.get("gpu", meta["device"]) or "CPU"
    versions = recorded_versions(meta)
    timer = "CUDA events" if where != "CPU" else "wall clock"
    backend = meta.get("compile")  # True in records made before the backend was an option
    compiled = (
        (
            ", every variant torch.compile'd (kernelize with Mode.TRAINING | Mode.TORCH_COMPILE, "
            f"then nn.Module.compile{'' if backend in (True, 'inductor') else f' with {backend}'}; "
            "the warm-up steps compile)"
        )
        if backend
        else ""
    )
    rows = []
    for n, r in report["results_ms"].items():
        paired, within, rounds = paired_vs_bound(report, n)
        rows.append(
            [
                n,
                f"{r['eager']:.2f} ms",
                f"{r['kernelized']:.2f} ms",
                f"{r['identity']:.2f} ms",
                f"{100 * (r['kernelized'] / r['identity'] - 1):+.1f}%",
                f"{100 * paired:+.1f}% ({within} of {rounds})",
                f"{r['eager'] / r['kernelized']:.3f}x",
            ]
        )
    what = meta.get("target", "Qwen3-Omni vision encoder")  # e2e.json files from before --decoder name none
    lines = [
        f"{what} training step (fwd+bwd){compiled}, {where}, {meta['dtype']}, "
        f"{meta['model']}; median of {meta['iters']} steps per variant ({timer}), taken as "
        f"{meta['rounds']} interleaved rounds of {meta['steps_per_round']} after {meta['warmup']} warm-up "
        f"(torch {versions['torch']}, triton {versions['triton']}, transformers {versions['transformers']}).",
        "",
        markdown_table(
            [
                "tokens",
                "eager rotary",
                "kernelized (rope-bwd)",
                "identity rotary (bound)",
                "kernelized vs bound",
                f"same, paired by round: median (rounds within {100 * TARGET:.0f}%)",
                "speedup vs eager",
            ],
            rows,
        ),
    ]
    frames = report.get("compiled_frames", {})
    if frames:
        lines += [
            "",
            "Frames compiled by dynamo, all variants: "
            + "; ".join(
                f"{n} tokens {f['warm-up']} in the warm-up, {f['timed']} while timed" for n, f in frames.items()
            )
            + ".",
        ]
    profile = report.get("profile", {})
    rows = []
    for n, r in report["results_ms"].items():
        for v, ms in r.items():
            host, rm = report["host_ms"][n][v], report["round_medians_ms"][n][v]
            row = [
                n,
                v,
                f"{ms:.2f} ms",
                f"{host['enqueue']:.2f} ms",
                f"{host['wall']:.2f} ms",
                f"{min(rm):.2f}-{max(rm):.2f} ms",
            ]
            if n in profile:
                p = profile[n][v]
                row += [
                    f"{p['kernel_ms']:.2f} ms",
                    f"{ms - p['kernel_ms']:.2f} ms",
                    p["launches"],
                    f"{p['rotary_ms']:.3f} ms ({p['rotary_launches']})",
                ]
            rows.append(row)
    kernel_columns = ["kernel time", "idle", "kernels", "rotary kernels (count)"] if profile else []
    lines += [
        "",
        "Per variant: host enqueue = time until backward() returns, before the final synchronize "
        "(it includes the syncs inside the step"
        + (
            ""
            if "target" in meta and "vision" not in meta["target"]
            else ": the sdpa vision attention calls .tolist() in every layer"
        )  # fmt: skip
        + "; close to the step time means host-bound), host wall = until the device is done; "
        "rounds = the lowest and highest per-round median."
        + (
            " Kernels: one more step under torch.profiler"
            + (
                " (on CPU: the leaf operators, rotary = inside a rotary operator)"
                if where == "CPU"
                else " (memcpy/memset not counted), rotary = kernels whose name mentions rotary"
            )
            + "; idle = step - kernel time, the device waiting for the host."
            if profile
            else ""
        ),
        "",
        markdown_table(["tokens", "variant", "step", "host enqueue", "host wall", "rounds", *kernel_columns], rows),
    ]
    return "\n".join(lines) + "\n"


def add_arguments(parser):
    parser.add_argument(
        "--tokens",
        type=cli.positive_int,
        nargs="+",
        help="tokens per image (square; default 4096 9216), with --decoder per sequence (default 2048 8192)",
    )
    parser.add_argument(
        "--decoder",
        action="store_true",
        help="train a decoder (LlamaModel at Llama-3-8B's width, --layers layers, --batch sequences) instead",
    )
    parser.add_argument("--layers", type=cli.positive_int, default=2, help="decoder layers for --decoder")
    parser.add_argument("--batch", type=cli.positive_int, default=1, help="sequences per step for --decoder")
    parser.add_argument(
        "--repo-id", type=cli.repo_id, default=None, help="the kernel to load (default: build.toml's repo-id)"
    )
    parser.add_argument(
        "--warmup", type=cli.nonnegative_int, default=5, help="warm-up steps per variant, before any timing"
    )
    parser.add_argument(
        "--iters", type=cli.positive_int, default=20, help="timed steps per variant in all (a multiple of --rounds)"
    )
    parser.add_argument(
        "--rounds",
        type=cli.positive_int,
        default=5,
        help="interleaved rounds: each times iters/rounds steps of every variant in turn",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="after the timing, one more step per variant under torch.profiler: "
        "profile-<tokens>-<variant>.txt and .json.gz under --out, summary in e2e.json",
    )
    parser.add_argument(
        "--compile",
        nargs="?",
        const="inductor",
        metavar="BACKEND",
        help="torch.compile every variant (kernelize with Mode.TORCH_COMPILE too) with BACKEND "
        "(default inductor; aot_eager: dynamo's and autograd's graphs without inductor's code, "
        "a quick check on the CPU); the warm-up steps compile, so give at least one",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=REPO_ROOT / "results",
        help="folder for e2e.json and e2e.md (--decoder: e2e-decoder.*)",
    )
    parser.add_argument(
        "--from-json", type=cli.existing_file, metavar="E2E_JSON", help="print the tables of a saved e2e.json (no run)"
    )
    parser.add_argument(
        "--varres",
        action="store_true",
        help="training on images of varying resolution: each variant in a fresh process, "
        "one step per image over --varres-sides, two passes (varres.py)",
    )
    parser.add_argument(
        "--varres-sides",
        type=cli.positive_int,
        nargs="+",
        default=list(varres.SIDES),
        help="image sides in patches for --varres",
    )
    parser.add_argument(
        "--variants",
        type=cli.subset_of(varres.VARIANTS, "variants"),
        default=list(varres.VARIANTS),
        help=f"variants for --varres, of {','.join(varres.VARIANTS)}",
    )
    parser.add_argument("--depth", type=cli.positive_int, default=4, help="encoder depth for --varres")
    parser.add_argument(
        "--family",
        choices=list(TRAINED),
        default=OMNI,
        help="the vision encoder --varres trains (default: Qwen3-Omni's)",
    )
    parser.add_argument("--varres-child", help=argparse.SUPPRESS)  # the parent's call of each fresh process
    add_result_argument(parser)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny encoder, 64 tokens, 1 warm-up, 2 rounds of 2 steps, on CPU without a GPU: "
        "exercises the code path only",
    )


def main(args) -> int:
    if args.varres_child:
        result = varres.child(
            args.varres_child, args.varres_sides, args.repo_id or repo_id(), varres.model_config(args), args.family
        )
        args.child_result.write_text(json.dumps(result))
        return 0
    if args.varres:
        args.out.mkdir(parents=True, exist_ok=True)

        def save(report):
            (args.out / "e2e-varres.json").write_text(json.dumps(report, indent=1) + "\n")
            (args.out / "e2e-varres.md").write_text(varres.markdown(report))

        report = varres.run(args, save)
        print(varres.markdown(report))
        return 1 if any("error" in r for r in report["runs"]) else 0
    if args.from_json:  # printing a saved run needs none of the imports below
        saved = json.loads(args.from_json.read_text())
        print(markdown({k: v for k, v in saved.items() if k != "meta"}, saved["meta"]))
        return 0
    import kernels

    from .output import run_meta

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16
    real, quick = (LLAMA3_8B, QUICK_DECODER) if args.decoder else (REAL_OMNI, QUICK_OMNI)
    if args.quick:
        config, tokens, warmup, iters, rounds = quick, [64], 1, 4, 2
    else:
        tokens = args.tokens or ([2048, 8192] if args.decoder else [4096, 9216])
        config, warmup, iters, rounds = real, args.warmup, args.iters, args.rounds
    if iters % rounds:
        raise cli.UsageError(f"--iters ({iters}) must be a multiple of --rounds ({rounds})")
    if args.compile and warmup < 1:
        raise cli.UsageError("--compile needs at least one warm-up step: it compiles each variant")
    merge = None if args.decoder else make_config(OMNI, **config).spatial_merge_size
    for n in tokens if merge else ():
        try:
            square_grid(n, merge)
        except ValueError as e:
            raise cli.UsageError(f"--tokens: {e}") from None
    args.repo_id = args.repo_id or repo_id()
    args.out.mkdir(parents=True, exist_ok=True)
    rope = kernels.get_kernel(args.repo_id, version=1, trust_remote_code=True)
    where = dict(dtype=dtype, device=device, model_config=config, repo_id=args.repo_id)
    if args.decoder:
        target = decoder_target(rope, **where, batch=args.batch, layers=args.layers)
        what = f"Llama decoder ({args.layers} layers, batch {args.batch})"
        described = f", {args.layers} layers, sdpa attention, batch {args.batch}"
    else:
        target, what, described = vision_target(rope, **where), None, ", sdpa attention, one image"
    results, frames = run(
        target,
        rope,
        tokens=tokens,
        warmup=warmup,
        rounds=rounds,
        per_round=iters // rounds,
        profile_dir=args.out if args.profile else None,
        compile=args.compile,
    )
    meta = run_meta(
        device,
        dtype=str(dtype).removeprefix("torch."),
        warmup=warmup,
        iters=iters,
        rounds=rounds,
        steps_per_round=iters // rounds,
        model=", ".join(f"{k} {v}" for k, v in config.items()) + described,
        repo_id=args.repo_id,
        compile=args.compile,
        target=what or "Qwen3-Omni vision encoder",
    )
    report = summarize(results, rounds)
    if frames:
        report["compiled_frames"] = frames
    md = markdown(report, meta)
    print(md)
    stem = args.out / ("e2e-decoder" if args.decoder else "e2e")
    stem.with_suffix(".json").write_text(json.dumps({"meta": meta, **report}, indent=2) + "\n")
    stem.with_suffix(".md").write_text(md)
    print(f"wrote {stem}.json and {stem}.md")
    return 0
