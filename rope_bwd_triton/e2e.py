"""End to end: one training step (forward + backward) of a transformers vision encoder.

A random-init Qwen3-Omni vision encoder at real width (hidden 1152, 16 heads of
72, MLP 4304), depth 8, bf16, sdpa attention, one image of 4096 and of 9216
tokens; median step time over CUDA events after warm-up, three variants in one
process, same weights and inputs:
    eager        transformers as shipped
    kernelized   the kernel loaded with kernels.get_kernel(<repo-id>, version=1) and
                 its integrations.kernelize_vision_rotary(model, mode=Mode.TRAINING)
    identity     the rotary replaced by (q, k) -> (q, k): the bound a perfect rotary
                 kernel could reach
The kernel resolves like a user's: from the Hub, or offline from a cache installed
with `python -m rope_bwd_triton publish --to-cache DIR` and run with
HF_HUB_OFFLINE=1 KERNELS_CACHE=DIR.

The model factory here is shared with the parity tests (tests/test_kernelize.py).
"""

import copy
import importlib
import json
import math
import statistics
import time
from pathlib import Path

import torch

from . import REPO_ROOT

# family -> (configuration class, vision model class), in transformers.models.<family>
FAMILIES = {
    "qwen3_omni_moe": ("Qwen3OmniMoeVisionEncoderConfig", "Qwen3OmniMoeVisionEncoder"),
    "qwen2_5_vl": ("Qwen2_5_VLVisionConfig", "Qwen2_5_VisionTransformerPretrainedModel"),
    "qwen3_vl": ("Qwen3VLVisionConfig", "Qwen3VLVisionModel"),
}
REAL_OMNI = dict(hidden_size=1152, num_heads=16, intermediate_size=4304, depth=8)
QUICK_OMNI = dict(hidden_size=32, num_heads=2, intermediate_size=64, depth=2, patch_size=4,
                  num_position_embeddings=16, deepstack_visual_indexes=[0], out_hidden_size=48)


def make_vision_model(family: str, *, dtype=torch.float32, device="cpu", seed=0, **config):
    """A random-init vision model of `family`; `config` overrides the configuration's
    defaults (which are the released models' values where transformers has them)."""
    cfg_name, model_name = FAMILIES[family]
    cfg = getattr(importlib.import_module(f"transformers.models.{family}.configuration_{family}"), cfg_name)(**config)
    cfg._attn_implementation = "sdpa"
    model_cls = getattr(importlib.import_module(f"transformers.models.{family}.modeling_{family}"), model_name)
    torch.manual_seed(seed)
    return model_cls(cfg).to(device=device, dtype=dtype)


def make_images(model, grids, *, seed=0):
    """Patch inputs for images of grid (t, h, w) patches each: (pixel_values, grid_thw)."""
    cfg = model.config
    tokens = sum(t * h * w for t, h, w in grids)
    width = cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size ** 2
    gen = torch.Generator().manual_seed(seed)
    pixels = torch.randn(tokens, width, generator=gen).to(device=model.device, dtype=model.dtype)
    return pixels, torch.tensor(grids, device=model.device)


def square_grid(tokens: int, merge: int):
    """(1, h, w) with h = w, a multiple of the spatial merge, and h*w = tokens."""
    side = math.isqrt(tokens)
    if side * side != tokens or side % merge:
        raise ValueError(f"{tokens} tokens is not a square image of side divisible by {merge}")
    return [1, side, side]


def output_tensors(out):
    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, (tuple, list)) or hasattr(out, "to_tuple"):
        for item in (out.to_tuple() if hasattr(out, "to_tuple") else out):
            yield from output_tensors(item)


def step(model, pixels, grid_thw):
    """Forward and a loss on every output tensor (so every used parameter gets a gradient)."""
    out = model(pixels, grid_thw)
    loss = sum(t.float().square().mean() for t in output_tensors(out))
    return out, loss


def _identity_rotary(q, k, cos, sin):
    return q, k


def _median_ms(model, pixels, grid_thw, *, warmup, iters):
    cuda = pixels.is_cuda

    def once():
        model.zero_grad(set_to_none=True)
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        else:
            t0 = time.perf_counter()
        step(model, pixels, grid_thw)[1].backward()
        if cuda:
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end)
        return (time.perf_counter() - t0) * 1e3

    for _ in range(warmup):
        once()
    return statistics.median(once() for _ in range(iters))


def run(*, tokens, repo_id, device, dtype, model_config, warmup, iters):
    """{tokens: {variant: median ms}}; transformers' rotary is restored afterwards."""
    import kernels

    rope = kernels.get_kernel(repo_id, version=1, trust_remote_code=True)
    family = "qwen3_omni_moe"
    modeling = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    original = modeling.apply_rotary_pos_emb_vision
    eager = make_vision_model(family, dtype=dtype, device=device, **model_config)
    kernelized = rope.integrations.kernelize_vision_rotary(
        copy.deepcopy(eager), mode=kernels.Mode.TRAINING, device=device.type, repo_id=repo_id)
    layer = modeling.apply_rotary_pos_emb_vision
    try:
        if layer.forward.__func__ is not rope.layers.ApplyRotaryPosEmbVision.forward:
            raise RuntimeError("kernelize kept transformers' rotary: no kernel would be timed")
        # The rotary is a module global shared by every model of the family: each
        # variant installs its own just for its timing.
        variants = {"eager": (eager, original), "kernelized": (kernelized, layer), "identity": (eager, _identity_rotary)}
        results = {}
        for n in tokens:
            inputs = make_images(eager, [square_grid(n, eager.config.spatial_merge_size)])
            results[n] = {}
            for name, (model, fn) in variants.items():
                modeling.apply_rotary_pos_emb_vision = fn
                results[n][name] = _median_ms(model, *inputs, warmup=warmup, iters=iters)
        return results
    finally:
        rope.integrations.restore_transformers()


def markdown(results, meta) -> str:
    lines = [
        f"Qwen3-Omni vision encoder training step (fwd+bwd), {meta['device']}, {meta['dtype']}, "
        f"{meta['model']}; median of {meta['iters']} steps after {meta['warmup']} warm-up "
        f"(torch {meta['torch']}, triton {meta['triton']}, transformers {meta['transformers']}).",
        "",
        "| tokens | eager rotary | kernelized (rope-bwd) | identity rotary (bound) | kernelized vs bound | speedup vs eager |",
        "|---|---|---|---|---|---|",
    ]
    for n, r in results.items():
        lines.append(
            f"| {n} | {r['eager']:.2f} ms | {r['kernelized']:.2f} ms | {r['identity']:.2f} ms "
            f"| {100 * (r['kernelized'] / r['identity'] - 1):+.1f}% | {r['eager'] / r['kernelized']:.3f}x |"
        )
    return "\n".join(lines) + "\n"


def add_arguments(parser):
    parser.add_argument("--tokens", type=int, nargs="+", default=[4096, 9216], help="tokens per image (square)")
    parser.add_argument("--repo-id", default=None, help="the kernel to load (default: build.toml's repo-id)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "results", help="folder for e2e.json and e2e.md")
    parser.add_argument("--quick", action="store_true",
                        help="tiny encoder, 64 tokens, 1+2 steps, on CPU without a GPU: exercises the code path only")


def main(args) -> int:
    import transformers
    import triton

    from .build import repo_id

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16
    if args.quick:
        config, tokens, warmup, iters = QUICK_OMNI, [64], 1, 2
    else:
        config, tokens, warmup, iters = REAL_OMNI, args.tokens, args.warmup, args.iters
    args.repo_id = args.repo_id or repo_id()
    results = run(tokens=tokens, repo_id=args.repo_id, device=device, dtype=dtype, model_config=config,
                  warmup=warmup, iters=iters)
    meta = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU",
        "dtype": str(dtype).removeprefix("torch."), "warmup": warmup, "iters": iters,
        "model": ", ".join(f"{k} {v}" for k, v in config.items()) + ", sdpa attention, one image",
        "torch": torch.__version__, "triton": triton.__version__, "transformers": transformers.__version__,
        "repo_id": args.repo_id,
    }
    md = markdown(results, meta)
    print(md)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "e2e.json").write_text(json.dumps({"meta": meta, "results_ms": results}, indent=2) + "\n")
    (args.out / "e2e.md").write_text(md)
    print(f"wrote {args.out / 'e2e.json'} and {args.out / 'e2e.md'}")
    return 0
