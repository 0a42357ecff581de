"""The transformers vision encoders the toolkit trains and the tests kernelize: random-init
models built from configuration objects (no downloads), their image inputs, and one
training step's forward and loss."""

import importlib
import math

import torch

# family -> (configuration class, vision model class), in transformers.models.<family>
FAMILIES = {
    "qwen3_omni_moe": ("Qwen3OmniMoeVisionEncoderConfig", "Qwen3OmniMoeVisionEncoder"),
    "qwen2_5_vl": ("Qwen2_5_VLVisionConfig", "Qwen2_5_VisionTransformerPretrainedModel"),
    "qwen3_vl": ("Qwen3VLVisionConfig", "Qwen3VLVisionModel"),
    "qwen2_vl": ("Qwen2VLVisionConfig", "Qwen2VisionTransformerPretrainedModel"),
    "glm4v": ("Glm4vVisionConfig", "Glm4vVisionModel"),
    "inkling2": ("Inkling2VisionConfig", "Inkling2VisionModel"),
    "minimax_m3_vl": ("MiniMaxM3VLVisionConfig", "MiniMaxM3VLVisionModel"),
}
OMNI = "qwen3_omni_moe"
REAL_OMNI = dict(hidden_size=1152, num_heads=16, intermediate_size=4304, depth=8)
QUICK_OMNI = dict(
    hidden_size=32,
    num_heads=2,
    intermediate_size=64,
    depth=2,
    patch_size=4,
    num_position_embeddings=16,
    deepstack_visual_indexes=[0],
    out_hidden_size=48,
)
# The encoders the varied-resolution training runs (e2e --varres --family): family -> (the
# released model's width; a tiny one for --quick); --depth sets the depth. Qwen2.5-VL:
# 16 heads of 80, window attention; its merger's output narrowed (not part of the attention).
# GLM-4V (GLM-4.1V): 12 heads of 128, attention over each whole image.
TRAINED = {
    OMNI: (REAL_OMNI, QUICK_OMNI),
    "qwen2_5_vl": (
        dict(hidden_size=1280, num_heads=16, intermediate_size=3420, out_hidden_size=2048),
        dict(hidden_size=32, num_heads=2, intermediate_size=64, depth=2, patch_size=4, out_hidden_size=48),
    ),
    "glm4v": (
        dict(hidden_size=1536, num_heads=12, intermediate_size=13696, out_hidden_size=4096),
        dict(
            hidden_size=32, num_heads=2, depth=2, intermediate_size=64, patch_size=4, out_hidden_size=48, image_size=32
        ),
    ),
}


def modeling_module(family: str = OMNI):
    return importlib.import_module(f"transformers.models.{family}.modeling_{family}")


def make_config(family: str, **config):
    """The vision configuration of `family`; `config` overrides its defaults (which are the
    released models' values where transformers has them)."""
    cfg_name, _ = FAMILIES[family]
    return getattr(importlib.import_module(f"transformers.models.{family}.configuration_{family}"), cfg_name)(**config)


def make_vision_model(family: str, *, dtype=torch.float32, device="cpu", seed=0, **config):
    """A random-init vision model of `family`, its configuration from make_config."""
    _, model_name = FAMILIES[family]
    cfg = make_config(family, **config)
    cfg._attn_implementation = "sdpa"
    model_cls = getattr(modeling_module(family), model_name)
    torch.manual_seed(seed)
    return model_cls(cfg).to(device=device, dtype=dtype)


def make_images(model, grids, *, seed=0):
    """Patch inputs for images of grid (t, h, w) patches each: (pixel_values, grid_thw)."""
    cfg = model.config
    tokens = sum(t * h * w for t, h, w in grids)
    width = cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size**2
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
        for item in out.to_tuple() if hasattr(out, "to_tuple") else out:
            yield from output_tensors(item)


def step(model, pixels, grid_thw):
    """Forward and a loss on every output tensor (so every used parameter gets a gradient)."""
    out = model(pixels, grid_thw)
    loss = sum(t.float().square().mean() for t in output_tensors(out))
    return out, loss


def identity_rotary(q, k, cos, sin):
    """The rotary replaced by nothing: the bound a perfect rotary kernel could reach."""
    return q, k


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
