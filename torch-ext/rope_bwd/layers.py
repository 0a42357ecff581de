"""Layers for kernels.kernelize: one per variant of transformers' vision rotary
`apply_rotary_pos_emb_vision(q, k, cos, sin)` (integrations.py finds each family's
variant). Stateless: kernels accepts no members but forward (and its two flags), so the
variant is the class, not an attribute."""

import torch
from torch import nn

from .ops import apply_rotary_pos_emb_vision


def _rotary(q, k, cos, sin, interleaved: bool, promotes: bool):
    """The kernel on a family's call: q, k [S, H, D] or [B, S, H, D] (cos/sin [S, R] shared
    by the batch, as transformers broadcasts them), cos and sin of one dtype."""
    if promotes:  # outputs in the promotion with cos/sin, computed from the unrounded inputs
        q, k = (x.to(torch.promote_types(torch.promote_types(x.dtype, cos.dtype), sin.dtype)) for x in (q, k))
    if sin.dtype != cos.dtype:
        table = torch.promote_types(cos.dtype, sin.dtype)
        cos, sin = cos.to(table), sin.to(table)
    if q.dim() == 4:
        batch = q.shape[0]
        if batch != 1:
            cos, sin = cos.repeat(batch, 1), sin.repeat(batch, 1)
        q_embed, k_embed = apply_rotary_pos_emb_vision(
            q.flatten(0, 1), k.flatten(0, 1), cos, sin, interleaved=interleaved
        )
        return q_embed.unflatten(0, (batch, -1)), k_embed.unflatten(0, (batch, -1))
    return apply_rotary_pos_emb_vision(q, k, cos, sin, interleaved=interleaved)


class ApplyRotaryPosEmbVision(nn.Module):
    """rotate_half over the first cos.shape[-1] channels (all of them in most families), the
    rest passed through; each output in its input's dtype (Qwen2-VL to Qwen3.5, GLM-4V, ...)."""

    can_torch_compile = True
    has_backward = True

    def forward(self, q, k, cos, sin):
        return _rotary(q, k, cos, sin, False, False)


class ApplyRotaryPosEmbVisionInterleaved(nn.Module):
    """Interleaved pairs (2i, 2i+1) rotated, as transformers' rotate_pairwise (Inkling2);
    each output in its input's dtype."""

    can_torch_compile = True
    has_backward = True

    def forward(self, q, k, cos, sin):
        return _rotary(q, k, cos, sin, True, False)


class ApplyRotaryPosEmbVisionPromoted(nn.Module):
    """As ApplyRotaryPosEmbVision, each output in the promotion of its input's dtype with
    cos's and sin's, as a function computing in its inputs' dtypes returns it (MiniMax-M3:
    under autocast its bf16 q meets float32 cos/sin)."""

    can_torch_compile = True
    has_backward = True

    def forward(self, q, k, cos, sin):
        return _rotary(q, k, cos, sin, False, True)


class ApplyRotaryPosEmbVisionInterleavedPromoted(nn.Module):
    """Interleaved pairs, outputs in the promoted dtypes."""

    can_torch_compile = True
    has_backward = True

    def forward(self, q, k, cos, sin):
        return _rotary(q, k, cos, sin, True, True)
