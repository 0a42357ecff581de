"""Layers for kernels.kernelize: one per variant of transformers' rotary functions, the vision
encoders' `apply_rotary_pos_emb_vision(q, k, cos, sin)` and the decoders'
`apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)` (integrations.py finds each family's
variant). Stateless: kernels accepts no members but forward (and its two flags), and checks
that forward's parameters are those of the function it replaces, so the variant is the class."""

from torch import nn

from .ops import heads_axis, rotary_call

_VISION = "apply_rotary_pos_emb_vision"
_DECODER = "apply_rotary_pos_emb"


class _Layer(nn.Module):
    can_torch_compile = True
    has_backward = True


class ApplyRotaryPosEmbVision(_Layer):
    """rotate_half over the first cos.shape[-1] channels (all of them in most families), the
    rest passed through; each output in its input's dtype (Qwen2-VL to Qwen3.5, GLM-4V, ...).
    q, k [S, H, D] or [B, S, H, D], cos/sin [S, R]."""

    def forward(self, q, k, cos, sin):
        return rotary_call(_VISION, q, k, cos, sin)


class ApplyRotaryPosEmbVisionInterleaved(_Layer):
    """Interleaved pairs (2i, 2i+1) rotated, as transformers' rotate_pairwise (Inkling2);
    each output in its input's dtype."""

    def forward(self, q, k, cos, sin):
        return rotary_call(_VISION, q, k, cos, sin, interleaved=True)


class ApplyRotaryPosEmbVisionPromoted(_Layer):
    """As ApplyRotaryPosEmbVision, each output in the promotion of its input's dtype with
    cos's and sin's, as a function computing in its inputs' dtypes returns it (MiniMax-M3:
    under autocast its bf16 q meets float32 cos/sin)."""

    def forward(self, q, k, cos, sin):
        return rotary_call(_VISION, q, k, cos, sin, promotes=True)


class ApplyRotaryPosEmbVisionInterleavedPromoted(_Layer):
    """Interleaved pairs, outputs in the promoted dtypes."""

    def forward(self, q, k, cos, sin):
        return rotary_call(_VISION, q, k, cos, sin, interleaved=True, promotes=True)


class ApplyRotaryPosEmbPromoted(_Layer):
    """The decoders' rotary of Llama and most families (transformers' hook "rotary_pos_emb"):
    rotate_half over the first cos.shape[-1] channels, outputs in the promotion of each input's
    dtype with cos's and sin's. q, k [B, H, S, D] (unsqueeze_dim=1) or [B, S, H, D] (2), cos/sin
    [B, S, R] or [1, S, R]."""

    def forward(self, q, k, cos, sin, unsqueeze_dim=1):
        return rotary_call(_DECODER, q, k, cos, sin, promotes=True, heads_axis=heads_axis(_DECODER, unsqueeze_dim))


class ApplyRotaryPosEmb(_Layer):
    """As ApplyRotaryPosEmbPromoted, each output in its input's dtype (families that compute in
    float32 and cast back)."""

    def forward(self, q, k, cos, sin, unsqueeze_dim=1):
        return rotary_call(_DECODER, q, k, cos, sin, heads_axis=heads_axis(_DECODER, unsqueeze_dim))


class ApplyRotaryPosEmbInterleaved(_Layer):
    """Interleaved pairs (rotate_pairwise), each output in its input's dtype."""

    def forward(self, q, k, cos, sin, unsqueeze_dim=1):
        return rotary_call(_DECODER, q, k, cos, sin, interleaved=True, heads_axis=heads_axis(_DECODER, unsqueeze_dim))


class ApplyRotaryPosEmbInterleavedPromoted(_Layer):
    """Interleaved pairs, outputs in the promoted dtypes."""

    def forward(self, q, k, cos, sin, unsqueeze_dim=1):
        axis = heads_axis(_DECODER, unsqueeze_dim)
        return rotary_call(_DECODER, q, k, cos, sin, interleaved=True, promotes=True, heads_axis=axis)
