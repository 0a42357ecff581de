"""The rotary embedding in PyTorch: the specification the kernel must match, the CPU
path and the float64 path.

q, k and their gradients are [S, H, D] or [B, S, H, D] (any strides; [B, H, S, D] with
`heads` -3, the decoders' attention views); the table is [S, R]
or [B, S, R] (B may be 1 against a batch of q/k: one table for every sequence), R even and
R <= D: angles (`embeddings`, whose cos/sin are taken here) or a (cos, sin) pair.
The first R channels of each head are rotated in pairs, the other D - R pass through:
    halves:      pair j = (j, j + R/2)      transformers' rotate_half
    interleaved: pair j = (2j, 2j + 1)      transformers' rotate_pairwise
Each pair (x1, x2) with table pairs (c1, c2), (s1, s2) (the two halves of a table row
are never assumed equal):
    forward:  y1 = x1*c1 - x2*s1      y2 = x2*c2 + x1*s2
    adjoint:  y1 = x1*c1 + x2*s2      y2 = x2*c2 - x1*s1      (the backward of q and k)
Math runs in float32 (float64 when q or k is float64); each result is cast back to the
dtype of the tensor it is the value or gradient of (q and k may differ in dtype).
"""

import torch


def math_dtype(*tensors) -> torch.dtype:
    """float64 when any of the tensors is, else float32."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def split_pairs(x: torch.Tensor, rot: int, interleaved: bool):
    """(x1, x2, tail): the first and second element of each rotated pair of the first `rot`
    channels, and the channels past them."""
    # No slice where it would take everything: vmap has no batching rule for the alias it makes.
    r, tail = (x, None) if rot == x.shape[-1] else (x[..., :rot], x[..., rot:])
    if interleaved:
        return r[..., 0::2], r[..., 1::2], tail
    return r[..., : rot // 2], r[..., rot // 2 :], tail


def join_pairs(y1: torch.Tensor, y2: torch.Tensor, tail, interleaved: bool) -> torch.Tensor:
    """split_pairs' inverse; tail None: the rotated channels alone."""
    if interleaved:  # reshape, not flatten: forward-mode vmap has no rule for flatten
        y = torch.stack((y1, y2), dim=-1).reshape(*y1.shape[:-1], 2 * y1.shape[-1])
    else:
        y = torch.cat((y1, y2), dim=-1)
    return y if tail is None else torch.cat((y, tail), dim=-1)


def repeat_pairs(table: torch.Tensor) -> torch.Tensor:
    """A table for interleaved pairs from one whose first R/2 channels hold a value per pair:
    each taken for both members of its pair, cos[..., :R/2].repeat_interleave(2) (GLM and
    Moonshine build their tables for rotate_half and rotate interleaved pairs this way)."""
    return table[..., : table.shape[-1] // 2].repeat_interleave(2, dim=-1)


def cos_sin(table: torch.Tensor, sin, dtype: torch.dtype):
    """The (cos, sin) tables in the math dtype: given, or of the angles `table` when sin is None."""
    if sin is None:
        e = table.to(dtype)
        return e.cos(), e.sin()
    return table.to(dtype), sin.to(dtype)


def rotate(x, cos, sin, *, adjoint: bool, interleaved: bool = False, heads: int = -2) -> torch.Tensor:
    """The rotation of x [..., S, H, D] (heads -2) or [..., H, S, D] (-3) by cos/sin [..., S, R]
    (math dtype), or its adjoint; math dtype."""
    rot = cos.shape[-1]
    x1, x2, tail = split_pairs(x.to(cos.dtype), rot, interleaved)
    c1, c2, _ = split_pairs(cos.unsqueeze(heads), rot, interleaved)
    s1, s2, _ = split_pairs(sin.unsqueeze(heads), rot, interleaved)
    if adjoint:
        y1, y2 = x1 * c1 + x2 * s2, x2 * c2 - x1 * s1
    else:
        y1, y2 = x1 * c1 - x2 * s1, x2 * c2 + x1 * s2
    return join_pairs(y1, y2, tail, interleaved)


def grad_cos_sin(gq, gk, q, k, rot: int, dtype: torch.dtype, interleaved: bool = False, heads: int = -2):
    """Gradients of the cos and sin tables [..., S, R]: sums over the heads of q and k of g*x
    and g*rotated(x), rotated(x) = (-x2, x1) pairwise."""
    gc1 = gc2 = gs1 = gs2 = 0
    for g, x in ((gq, q), (gk, k)):
        g1, g2, _ = split_pairs(g.to(dtype), rot, interleaved)
        x1, x2, _ = split_pairs(x.to(dtype), rot, interleaved)
        gc1, gc2 = gc1 + (g1 * x1).sum(heads), gc2 + (g2 * x2).sum(heads)
        gs1, gs2 = gs1 - (g1 * x2).sum(heads), gs2 + (g2 * x1).sum(heads)
    return join_pairs(gc1, gc2, None, interleaved), join_pairs(gs1, gs2, None, interleaved)


def forward(q, k, table, sin=None, interleaved=False, heads=-2):
    """(q_embed, k_embed). table: the angles when sin is None, else cos."""
    cos, sn = cos_sin(table, sin, math_dtype(q, k))
    return (
        rotate(q, cos, sn, adjoint=False, interleaved=interleaved, heads=heads).to(q.dtype),
        rotate(k, cos, sn, adjoint=False, interleaved=interleaved, heads=heads).to(k.dtype),
    )


def backward(gq, gk, q, k, table, sin=None, need_q=True, need_k=True, interleaved=False, heads=-2):
    """(grad_q, grad_k, grad_table, grad_sin), None where not asked for.

    The table gradient is computed when q and k are given (they are read only for it):
    the angles' gradient when sin is None, else (grad_cos, grad_sin); a table shared by a
    batch gets the sum over it.
    """
    dt = math_dtype(gq, gk)
    cos, sn = cos_sin(table, sin, dt)
    dq = rotate(gq, cos, sn, adjoint=True, interleaved=interleaved, heads=heads).to(gq.dtype) if need_q else None
    dk = rotate(gk, cos, sn, adjoint=True, interleaved=interleaved, heads=heads).to(gk.dtype) if need_k else None
    if q is None:
        return dq, dk, None, None
    gcos, gsin = grad_cos_sin(gq, gk, q, k, cos.shape[-1], dt, interleaved, heads)
    if sin is None:  # d/dangle (cos, sin) = (-sin, cos)
        return dq, dk, (cos * gsin - sn * gcos).sum_to_size(table.shape).to(table.dtype), None
    return dq, dk, gcos.sum_to_size(table.shape).to(table.dtype), gsin.sum_to_size(sin.shape).to(sin.dtype)
