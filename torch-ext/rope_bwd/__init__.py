"""rope-bwd: the rotary position embedding of transformers' vision encoders and decoders,
forward and backward, in one fused Triton kernel (kernel.py, launched by launch.py; the ops and public
functions in ops.py; the math in PyTorch in rotary_torch.py)."""

from . import integrations, layers
from .integrations import (
    check_rotaries,
    kernel_config,
    kernel_mapping,
    kernelize_rotary,
    kernelize_vision_rotary,
    make_kernelizable,
    restore_transformers,
)
from .ops import apply_rotary_pos_emb, apply_rotary_pos_emb_vision, rope_bwd, rope_fwd

__all__ = [
    "apply_rotary_pos_emb", "apply_rotary_pos_emb_vision", "check_rotaries", "integrations", "kernel_config",
    "kernel_mapping", "kernelize_rotary", "kernelize_vision_rotary", "layers", "make_kernelizable",
    "restore_transformers", "rope_bwd", "rope_fwd",
]  # fmt: skip
