"""rope-bwd: fused rotary position embedding (forward and backward) for the vision
encoders of Qwen3-Omni, Qwen2.5-VL and Qwen3-VL. See ops.py for the API."""

from . import integrations, layers
from .integrations import kernel_mapping, kernelize_vision_rotary, make_kernelizable, restore_transformers
from .ops import apply_rotary_emb, apply_rotary_pos_emb_vision, rope_bwd, rope_fwd

__all__ = [
    "apply_rotary_emb",
    "apply_rotary_pos_emb_vision",
    "integrations",
    "kernel_mapping",
    "kernelize_vision_rotary",
    "layers",
    "make_kernelizable",
    "restore_transformers",
    "rope_bwd",
    "rope_fwd",
]
