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
    depth=1,
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
    return make_images_for(model.config, grids, model.device, model.dtype, seed)


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


# ------------------------------------------------------- tiny models of several families, to train

# The tiny decoders' text configuration: QUICK_DECODER's heads (4 query, 2 key/value, of 16), 2 layers.
TEXT = QUICK_DECODER | dict(vocab_size=96, num_hidden_layers=2, max_position_embeddings=64)
MOE = dict(moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2)  # Qwen3-Omni's text MoE
# family -> (configuration class, causal LM class, its tiny configuration beyond TEXT)
DECODERS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(sliding_window=4)),
    # Phi-3's rotary rotates the first cos.shape[-1] channels: half of each head here
    "phi3": (
        "Phi3Config",
        "Phi3ForCausalLM",
        dict(rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5), pad_token_id=0),
    ),
    # GPT-OSS's rotary takes a table of one value per pair, under Llama's hook name
    "gpt_oss": (
        "GptOssConfig",
        "GptOssForCausalLM",
        dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=4, layer_types=["sliding_attention"] * 2),
    ),
    # DeepSeek-V4's rotates the last 8 channels of each head of 32 (its compressors' entries too)
    "deepseek_v4": (
        "DeepseekV4Config",
        "DeepseekV4ForCausalLM",
        dict(
            num_key_value_heads=1,
            head_dim=32,
            qk_rope_head_dim=8,
            q_lora_rank=32,
            o_lora_rank=16,
            o_groups=2,
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            hc_mult=2,
            sliding_window=8,
            index_n_heads=2,
            index_head_dim=16,
            index_topk=4,
            num_nextn_predict_layers=0,
            mlp_layer_types=["moe"] * 2,
            layer_types=["heavily_compressed_attention", "compressed_sparse_attention"],
        ),
    ),
}
# Token ids of the multimodal models, inside their tiny vocabulary.
IMAGE_TOKEN, VISION_START, VISION_END = 90, 91, 92


def _configuration(family, name, **config):
    return getattr(importlib.import_module(f"transformers.models.{family}.configuration_{family}"), name)(**config)


def _built(model_cls, cfg, dtype, device, seed, attention="sdpa"):
    cfg._attn_implementation = attention
    torch.manual_seed(seed)
    return model_cls(cfg).to(device=device, dtype=dtype)


def make_decoder_model(family: str, *, dtype=torch.float32, device="cpu", seed=0, **config):
    """A random-init causal LM of `family` (DECODERS) with the tiny TEXT configuration; `config`
    overrides it."""
    cfg_name, model_name, extra = DECODERS[family]
    cfg = _configuration(family, cfg_name, **TEXT | extra | config)
    # eager attention: Gemma-2 has no SDPA path (its logit soft-capping)
    return _built(getattr(modeling_module(family), model_name), cfg, dtype, device, seed, "eager")


def decoder_step(model, input_ids):
    """A causal LM's forward and its language-modelling loss on its own tokens."""
    out = model(input_ids=input_ids, labels=input_ids)
    return out, out.loss


# ------------------------------------------------------------------- whole multimodal models


def _image_prompt(model, grids, seed, text=5):
    """Per image: `text` random tokens, vision start, one image token per merged patch, vision end;
    the keyword inputs of a vision-language model's forward (a batch of one sequence)."""
    vision = model.config.vision_config
    merge = vision.spatial_merge_size**2
    pixels, grid_thw = make_images_for(vision, grids, model.device, model.dtype, seed)
    gen = torch.Generator().manual_seed(seed)
    ids = []
    for t, h, w in grids:
        ids += torch.randint(0, IMAGE_TOKEN, (text,), generator=gen).tolist()
        ids += [VISION_START] + [IMAGE_TOKEN] * (t * h * w // merge) + [VISION_END]
    ids = torch.tensor([ids], device=model.device)
    return dict(
        input_ids=ids, mm_token_type_ids=(ids == IMAGE_TOKEN).int(), pixel_values=pixels, image_grid_thw=grid_thw
    )


def make_images_for(cfg, grids, device, dtype, seed):
    """make_images for a vision configuration `cfg`."""
    tokens = sum(t * h * w for t, h, w in grids)
    width = cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size**2
    gen = torch.Generator().manual_seed(seed)
    pixels = torch.randn(tokens, width, generator=gen).to(device=device, dtype=dtype)
    return pixels, torch.tensor(grids, device=device)


TOKENS = dict(image_token_id=IMAGE_TOKEN, vision_start_token_id=VISION_START, vision_end_token_id=VISION_END)
MROPE = dict(rope_type="default", rope_theta=10000.0, mrope_section=[4, 2, 2], mrope_interleaved=True)


def make_qwen3_vl(*, dtype=torch.float32, device="cpu", seed=0):
    """A random-init Qwen3-VL (its vision encoder, deepstack, and text decoder), tiny."""
    cfg = _configuration(
        "qwen3_vl",
        "Qwen3VLConfig",
        text_config=TEXT | dict(rope_parameters=MROPE),
        vision_config=QUICK_OMNI | dict(out_hidden_size=TEXT["hidden_size"]),
        **TOKENS,
    )
    return _built(modeling_module("qwen3_vl").Qwen3VLForConditionalGeneration, cfg, dtype, device, seed)


def make_qwen3_omni(*, dtype=torch.float32, device="cpu", seed=0):
    """A random-init Qwen3-Omni, tiny: the thinker (vision and audio encoders, MoE text decoder),
    the talker (MoE decoder and its code predictor) and code2wav (its transformer and decoder)."""
    cfg = _configuration(
        OMNI,
        "Qwen3OmniMoeConfig",
        thinker_config=dict(
            text_config=TEXT | MOE | dict(rope_parameters=MROPE),
            vision_config=QUICK_OMNI | dict(out_hidden_size=TEXT["hidden_size"]),
            audio_config=dict(
                encoder_layers=1,
                encoder_attention_heads=2,
                encoder_ffn_dim=32,
                d_model=16,
                num_mel_bins=16,
                output_dim=TEXT["hidden_size"],
                downsample_hidden_size=8,
            ),
            audio_token_id=93,
            audio_start_token_id=94,
            **TOKENS,
        ),
        talker_config=dict(
            text_config=TEXT | MOE | dict(rope_parameters=MROPE, shared_expert_intermediate_size=32),
            code_predictor_config=TEXT | dict(num_code_groups=4, layer_types=["full_attention"] * 2),
            num_code_groups=4,
            thinker_hidden_size=TEXT["hidden_size"],
            accept_hidden_layer=1,
            spatial_merge_size=2,
        ),
        code2wav_config=dict(
            codebook_size=64,
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=4,
            intermediate_size=64,
            num_hidden_layers=2,
            num_quantizers=4,
            sliding_window=8,
            upsample_rates=[2, 2],
            upsampling_ratios=[2],
            decoder_dim=16,
            max_position_embeddings=64,
        ),
        enable_audio_output=True,
    )
    model = _built(modeling_module(OMNI).Qwen3OmniMoeForConditionalGeneration, cfg, dtype, device, seed)
    # transformers' _init_weights leaves the talker's experts as torch.empty made them (whatever the
    # memory held, NaN at times): drawn here, after the seeded build, as the thinker's are
    with torch.no_grad():
        for name, p in model.talker.named_parameters():
            if ".experts." in name:
                p.normal_(0.0, cfg.initializer_range)
    return model


WHOLE = {"qwen3_vl": make_qwen3_vl, OMNI: make_qwen3_omni}  # family -> tiny whole-model factory


def omni_decoders(model) -> dict:
    """Qwen3-Omni's decoders besides the thinker's (its own causal LM): name -> module taking
    inputs_embeds."""
    return {
        "talker": model.talker.model,
        "code_predictor": model.talker.code_predictor.model,
        "code2wav": model.code2wav.pre_transformer,
    }


def whole_inputs(model, grids=([1, 4, 8], [1, 4, 4]), *, seed=0, tokens=6):
    """Inputs of whole_step: a prompt with the images of `grids` for the vision-language model
    (Qwen3-Omni's thinker), and random embeddings of `tokens` for each of Qwen3-Omni's other
    decoders."""
    vlm = getattr(model, "thinker", model)
    inputs = {"prompt": _image_prompt(vlm, [list(g) for g in grids], seed)}
    if hasattr(model, "talker"):
        gen = torch.Generator().manual_seed(seed + 1)
        inputs["embeds"] = {
            name: torch.randn(1, tokens, decoder.config.hidden_size, generator=gen).to(model.device, model.dtype)
            for name, decoder in omni_decoders(model).items()
        }
    return inputs


def whole_step(model, inputs):
    """The vision-language model's language-modelling loss on its prompt (image tokens through the
    vision encoder), plus the mean square of each other decoder's last hidden state; (outputs, loss)."""
    vlm = getattr(model, "thinker", model)
    prompt = inputs["prompt"]
    out = vlm(**prompt, labels=prompt["input_ids"])
    outputs, loss = [out.logits], out.loss
    for name, embeds in inputs.get("embeds", {}).items():
        hidden = omni_decoders(model)[name](inputs_embeds=embeds).last_hidden_state
        outputs.append(hidden)
        loss = loss + hidden.float().square().mean()
    return outputs, loss


def make_dinov3(*, dtype=torch.float32, device="cpu", seed=0):
    """A random-init DINOv3 ViT with QUICK_DECODER's heads, 2 layers and 2 register tokens (its
    rotary passes the class and register tokens through), on 32x32 images of 8x8 patches."""
    cfg = _configuration("dinov3_vit", "DINOv3ViTConfig", **QUICK_DECODER, num_hidden_layers=2, image_size=32,
                         patch_size=8, num_register_tokens=2)  # fmt: skip
    return _built(modeling_module("dinov3_vit").DINOv3ViTModel, cfg, dtype, device, seed)
