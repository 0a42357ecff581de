"""rope-bwd: fused rotary position embedding (forward and backward) for the vision
encoders of Qwen3-Omni, Qwen2.5-VL and Qwen3-VL. See ops.py for the API."""

from . import layers
from .ops import apply_rotary_emb, apply_rotary_pos_emb_vision, rope_bwd, rope_fwd

__all__ = ["apply_rotary_emb", "apply_rotary_pos_emb_vision", "layers", "rope_bwd", "rope_fwd"]
