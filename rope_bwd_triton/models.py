"""The transformers models the toolkit trains and times, and the tests kernelize: random-init
vision encoders and decoders built from configuration objects (no downloads), their
inputs, and one training step's forward and loss."""

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


def step(model, *inputs):
    """Forward (a vision encoder's pixels and grid_thw, a decoder's input ids) and a loss on every
    output tensor (so every used parameter gets a gradient)."""
    out = model(*inputs)
    loss = sum(t.float().square().mean() for t in output_tensors(out))
    return out, loss


def identity_rotary(q, k, cos, sin, unsqueeze_dim=1):
    """The rotary replaced by nothing: the bound a perfect rotary kernel could reach (vision's
    signature, and the decoders' with unsqueeze_dim)."""
    return q, k


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------- decoders
# Llama-3-8B's attention and width (its released config.json: hidden 4096, 32 query heads, 8 key/value
# heads, MLP 14336; LlamaConfig's defaults are Llama-2-7B's). rope_theta does not change the work.
LLAMA3_8B = dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128, intermediate_size=14336)
QUICK_DECODER = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128)
# The step is about the layers: the embedding and its gradient, outside the attention, are kept small.
DECODER_VOCAB = 1024
# Qwen3-Omni's Thinker decoder where transformers lacks Qwen3OmniMoeThinkerConfig or one of its fields:
# the defaults of its text_config in transformers 5.25 (28 query heads, 4 key/value heads); see thinker_heads.
THINKER_FALLBACK = (28, 4, 128)


def thinker_heads():
    """(query heads, key/value heads, head_dim) of Qwen3-Omni's Thinker decoder, from the defaults of
    transformers' Qwen3OmniMoeThinkerConfig().text_config. That config names no head_dim, and the
    attention's fallback, hidden_size // heads (2048 // 28 = 73), is odd: no rotary takes it. 128 is
    what the Thinker's rotary rotates (its default mrope_section [24, 20, 20]: 64 pairs) and the head_dim
    of the released checkpoint (which has 32 query heads: the defaults keep 28)."""
    try:
        from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeThinkerConfig

        text = Qwen3OmniMoeThinkerConfig().text_config
        heads, kv_heads = text.num_attention_heads, text.num_key_value_heads
    except (ImportError, AttributeError, TypeError, ValueError):  # a transformers without the class, or its fields
        return THINKER_FALLBACK
    head_dim = getattr(text, "head_dim", None)
    return heads, kv_heads, head_dim if head_dim and head_dim % 2 == 0 else THINKER_FALLBACK[2]


DECODER_NAMES = ("llama3-8b", "qwen3-omni-thinker")


def decoder_shapes() -> dict:
    """name (DECODER_NAMES) -> (query heads, key/value heads, head_dim) of the decoders
    `bench --preset decoder` times."""
    return {"llama3-8b": tuple(LLAMA3_8B[k] for k in ("num_attention_heads", "num_key_value_heads", "head_dim")),
            "qwen3-omni-thinker": thinker_heads()}  # fmt: skip


def plain_function(fn):
    """transformers' module-level function itself: where its hub decorator is active (a kernels
    version that transformers supports), the module global is an nn.Module whose forward calls it."""
    if isinstance(fn, torch.nn.Module):
        import inspect

        fn = inspect.getclosurevars(type(fn).forward).nonlocals.get("func", fn)
    if isinstance(fn, torch.nn.Module):
        raise TypeError(f"{type(fn).__name__}: not a function, nor kernels' wrapper of one")
    return fn


def decoder_rotary():
    """transformers' decoder apply_rotary_pos_emb (Llama's; the families copy it), the plain function."""
    return plain_function(modeling_module("llama").apply_rotary_pos_emb)


def make_decoder(*, dtype=torch.float32, device="cpu", seed=0, layers=2, **config):
    """A random-init LlamaModel (the decoder stack, no LM head) at `config`'s width, sdpa attention."""
    from transformers import LlamaConfig, LlamaModel

    cfg = LlamaConfig(vocab_size=DECODER_VOCAB, num_hidden_layers=layers, use_cache=False, **config)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return LlamaModel(cfg).to(device=device, dtype=dtype)


def make_tokens(model, batch=2, seq=7, *, seed=0):
    """Random input ids [batch, seq]."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (batch, seq), generator=gen).to(model.device)
