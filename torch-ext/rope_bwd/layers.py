"""Layers for kernels.kernelize."""

from torch import nn

from .ops import apply_rotary_pos_emb_vision


class ApplyRotaryPosEmbVision(nn.Module):
    """Replacement for transformers' vision rotary `apply_rotary_pos_emb_vision(q, k, cos, sin)`
    (Qwen3-Omni, Qwen2.5-VL, Qwen3-VL) once it is a kernelizable layer. Stateless."""

    can_torch_compile = True
    has_backward = True

    def forward(self, q, k, cos, sin):
        return apply_rotary_pos_emb_vision(q, k, cos, sin)
