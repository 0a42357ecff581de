"""`python -m rope_bwd_triton e2e --varres`: training on images of varying resolution.

Each variant of the rotary runs in a fresh process with empty Triton and inductor caches,
as a new training run starts: a random-init vision encoder (models.TRAINED: Qwen3-Omni's, or
--family qwen2_5_vl or glm4v) takes one training step (forward + backward) per image over a list of
image sizes, twice.
The first pass pays every compilation a variant needs; the second shows the steady state.
Wall time per step, until the device is done.

Variants: eager (transformers), identity (the rotary replaced by (q, k) -> (q, k): the
bound), liger (Liger-Kernel's vision rotary), kernelized (ours, through kernelize),
compiled (the eager model under torch.compile, which goes dynamic after its first
recompilation).
"""

import statistics
import tempfile
import time
from pathlib import Path

from . import models
from .fresh import run_fresh

VARIANTS = ("eager", "identity", "liger", "kernelized", "compiled")
# Sides in patches (multiples of the spatial merge 2): 400 to 5184 tokens, in no order.
SIDES = (32, 48, 24, 64, 40, 56, 28, 72, 36, 20)


def _install(variant, model, repo_id, device, family):
    """Puts `variant`'s rotary into the model (or compiles it); returns the model to step."""
    import kernels

    modeling = models.modeling_module(family)
    if variant == "identity":
        modeling.apply_rotary_pos_emb_vision = models.identity_rotary
    elif variant == "liger":
        from liger_kernel.transformers.rope import liger_rotary_pos_emb_vision

        modeling.apply_rotary_pos_emb_vision = liger_rotary_pos_emb_vision
    elif variant == "kernelized":
        rope = kernels.get_kernel(repo_id, version=1, trust_remote_code=True)
        rope.integrations.kernelize_vision_rotary(model, mode=kernels.Mode.TRAINING, device=device, repo_id=repo_id)
    elif variant == "compiled":
        from .peers import raise_recompile_limit

        raise_recompile_limit()
        model.compile()
    return model


def child(variant, sides, repo_id, config, family) -> dict:
    """In the fresh process: {"passes": [[step ms per image], [...]], "tokens": [...]}. On a
    machine without CUDA it runs on the CPU (a code-path check: the times mean nothing)."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = models.make_vision_model(family, dtype=torch.bfloat16, device=device, **config)
    model = _install(variant, model, repo_id, device, family)
    images = [models.make_images(model, [[1, s, s]], seed=i) for i, s in enumerate(sides)]
    passes = []
    for _ in range(2):
        times = []
        for pixels, grid in images:
            model.zero_grad(set_to_none=True)
            models.sync(pixels.device)
            t0 = time.perf_counter()
            models.step(model, pixels, grid)[1].backward()
            models.sync(pixels.device)
            times.append((time.perf_counter() - t0) * 1e3)
        passes.append(times)
    return {"variant": variant, "passes": passes, "tokens": [s * s for s in sides]}


def run(args, save=None) -> dict:
    """Every variant in its own fresh process; {"meta", "runs"}. save(report) after each
    variant, so that a run stopped midway keeps what it measured."""
    runs, meta = [], _meta(args)
    with tempfile.TemporaryDirectory() as tmp:
        for variant in args.variants:
            argv = [
                "e2e",
                "--varres-child",
                variant,
                "--varres-sides",
                *map(str, args.varres_sides),
                "--depth",
                str(args.depth),
                "--family",
                args.family,
            ]
            if args.quick:
                argv.append("--quick")
            if args.repo_id:
                argv += ["--repo-id", args.repo_id]
            runs.append({"variant": variant, **run_fresh(argv, Path(tmp), variant)})
            if save:
                save({"meta": meta, "runs": runs})
    return {"meta": meta, "runs": runs}


def model_config(args) -> dict:
    """The encoder of --family: the released width at --depth, or the tiny one with --quick."""
    real, quick = models.TRAINED[args.family]
    return quick if args.quick else {**real, "depth": args.depth}


def _meta(args) -> dict:
    import torch

    from .output import run_meta

    model = ", ".join(f"{k} {v}" for k, v in model_config(args).items()) + ", bf16, sdpa, one image per step"
    return run_meta("cuda" if torch.cuda.is_available() else "cpu", model=model, family=args.family)


def markdown(report) -> str:
    from .output import markdown_table

    meta = report["meta"]
    v = meta["versions"]
    rows = []
    for r in report["runs"]:
        if "error" in r:
            rows.append([r["variant"], "—", "—", "—", r["error"]])
            continue
        first, second = (sum(p) for p in r["passes"])
        rows.append([r["variant"], f"{first:.0f}", f"{second:.0f}", f"{statistics.median(r['passes'][1]):.1f}", ""])
    tokens = next((r["tokens"] for r in report["runs"] if "tokens" in r), [])
    return (
        f"Training on images of varying resolution: {meta['family']} vision encoder "
        f"({meta['model']}); one "
        f"forward + backward per image, {len(tokens)} images of {', '.join(map(str, tokens))} tokens, two passes; "
        f"each variant in a fresh process with empty Triton/inductor caches; wall time until the GPU is done. "
        f"{meta['gpu'] or 'CPU (code-path check only)'}, torch {v['torch']}, triton {v['triton']}, "
        f"transformers {v['transformers']}; {meta['date']}. Command: `{meta['command']}`\n\n"
        + markdown_table(["variant", "first pass ms", "second pass ms", "second pass, median step ms", "note"], rows)
        + "\n"
    )
