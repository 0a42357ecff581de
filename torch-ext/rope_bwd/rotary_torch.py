"""The rotary embedding in PyTorch: the specification the kernel must match, the CPU path and
the float64 path.

q, k and their gradients are [(B,) S, H, D], any strides ([B, H, S, D] with `heads` -3); the table
[(B or 1,) S, T]: angles (`embeddings`, whose cos/sin are taken here) or a (cos, sin) pair. R = T
channels of each head are rotated in pairs (R = 2T with a table of one value per pair), R even,
R <= D; the other D - R pass through. `pairs`, an int of flags (a bool serves: True is INTERLEAVED):
    halves:      pair j = (j, j + R/2)      transformers' rotate_half
    INTERLEAVED: pair j = (2j, 2j + 1)      transformers' rotate_pairwise
    PAIR_TABLE:  the table holds one value per pair (GPT-OSS, DeepSeek-V4), read for both
                 members; its gradient is the sum of theirs
    LAST:        the rotated channels are the last R, the first D - R pass through
A table with fewer tokens than q (DINOv3) rotates q's last tokens; the first pass through.
Each pair (x1, x2) with table pairs (c1, c2), (s1, s2) (the two halves of a table row
are never assumed equal):
    forward:  y1 = x1*c1 - x2*s1      y2 = x2*c2 + x1*s2
    adjoint:  y1 = x1*c1 + x2*s2      y2 = x2*c2 - x1*s1      (the backward of q and k)
Math runs in float32 (float64 when q or k is float64); each result is cast back to the
dtype of the tensor it is the value or gradient of (q and k may differ in dtype).
"""

import torch

INTERLEAVED, PAIR_TABLE, LAST = 1, 2, 4  # the flags of `pairs`


def math_dtype(*tensors) -> torch.dtype:
    """float64 when any of the tensors is, else float32."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def split_pairs(x: torch.Tensor, rot: int, pairs: int):
    """(x1, x2, rest): the first and second element of each rotated pair of the `rot` rotated
    channels (the first, or the last with LAST), and the channels that pass through."""
    # No slice where it would take everything: vmap has no batching rule for the alias it makes.
    if rot == x.shape[-1]:
        r, rest = x, None
    else:
        r, rest = (x[..., -rot:], x[..., :-rot]) if pairs & LAST else (x[..., :rot], x[..., rot:])
    if pairs & INTERLEAVED:
        return r[..., 0::2], r[..., 1::2], rest
    return r[..., : rot // 2], r[..., rot // 2 :], rest


def join_pairs(y1: torch.Tensor, y2: torch.Tensor, rest, pairs: int) -> torch.Tensor:
    """split_pairs' inverse; rest None: the rotated channels alone."""
    if pairs & INTERLEAVED:  # reshape, not flatten: forward-mode vmap has no rule for flatten
        y = torch.stack((y1, y2), dim=-1).reshape(*y1.shape[:-1], 2 * y1.shape[-1])
    else:
        y = torch.cat((y1, y2), dim=-1)
    if rest is None:
        return y
    return torch.cat((rest, y) if pairs & LAST else (y, rest), dim=-1)


def cos_sin(table: torch.Tensor, sin, dtype: torch.dtype):
    """The (cos, sin) tables in the math dtype: given, or of the angles `table` when sin is None."""
    if sin is None:
        e = table.to(dtype)
        return e.cos(), e.sin()
    return table.to(dtype), sin.to(dtype)


def _table_pairs(t, heads, pairs):
    """(t1, t2): a table's values for the first and second members of the pairs, broadcast over heads."""
    t = t.unsqueeze(heads)
    if pairs & PAIR_TABLE:
        return t, t
    return split_pairs(t, t.shape[-1], pairs)[:2]


def rotated_channels(table, pairs) -> int:
    """R, the channels a table rotates."""
    return table.shape[-1] * (2 if pairs & PAIR_TABLE else 1)


def rotate(x, cos, sin, *, adjoint: bool, pairs: int = 0, heads: int = -2) -> torch.Tensor:
    """The rotation of x [..., S, H, D] (heads -2) or [..., H, S, D] (-3) by cos/sin [..., S, T]
    (math dtype), or its adjoint; math dtype."""
    x1, x2, rest = split_pairs(x.to(cos.dtype), rotated_channels(cos, pairs), pairs)
    c1, c2 = _table_pairs(cos, heads, pairs)
    s1, s2 = _table_pairs(sin, heads, pairs)
    if adjoint:
        y1, y2 = x1 * c1 + x2 * s2, x2 * c2 - x1 * s1
    else:
        y1, y2 = x1 * c1 - x2 * s1, x2 * c2 + x1 * s2
    return join_pairs(y1, y2, rest, pairs)


def grad_cos_sin(gq, gk, q, k, rot: int, dtype: torch.dtype, pairs: int = 0, heads: int = -2):
    """Gradients of the cos and sin tables [..., S, T]: sums over the heads of q and k of g*x
    and g*rotated(x), rotated(x) = (-x2, x1) pairwise; a table of one value per pair gets the
    sum over the pair."""
    gc1 = gc2 = gs1 = gs2 = 0
    for g, x in ((gq, q), (gk, k)):
        g1, g2, _ = split_pairs(g.to(dtype), rot, pairs)
        x1, x2, _ = split_pairs(x.to(dtype), rot, pairs)
        gc1, gc2 = gc1 + (g1 * x1).sum(heads), gc2 + (g2 * x2).sum(heads)
        gs1, gs2 = gs1 - (g1 * x2).sum(heads), gs2 + (g2 * x1).sum(heads)
    if pairs & PAIR_TABLE:
        return gc1 + gc2, gs1 + gs2
    return join_pairs(gc1, gc2, None, pairs), join_pairs(gs1, gs2, None, pairs)


def token_axis(heads: int) -> int:
    """The tokens' axis of q-like tensors whose heads' axis is `heads` (-2: [..., S, H, D])."""
    return -5 - heads


def prefix(x, table, heads) -> int:
    """The tokens of x before the table's first (they pass through): x's token count less the table's."""
    return x.shape[token_axis(heads)] - table.shape[-2]


def tokens(x, n, heads):
    """(x's first n tokens, the rest)."""
    axis = token_axis(heads)
    return x.narrow(axis, 0, n), x.narrow(axis, n, x.shape[axis] - n)


def forward(q, k, table, sin=None, pairs=0, heads=-2):
    """(q_embed, k_embed). table: the angles when sin is None, else cos."""
    n = prefix(q, table, heads)
    if n:  # the prefix passes through
        (q0, q1), (k0, k1) = tokens(q, n, heads), tokens(k, n, heads)
        y = forward(q1, k1, table, sin, pairs, heads)
        return tuple(torch.cat((x0, y1), dim=token_axis(heads)) for x0, y1 in zip((q0, k0), y))
    cos, sn = cos_sin(table, sin, math_dtype(q, k))
    return tuple(rotate(x, cos, sn, adjoint=False, pairs=pairs, heads=heads).to(x.dtype) for x in (q, k))


def backward(gq, gk, q, k, table, sin=None, need_q=True, need_k=True, pairs=0, heads=-2):
    """(grad_q, grad_k, grad_table, grad_sin), None where not asked for. The table gradient when
    q and k are given (read only for it): the angles' when sin is None, else (grad_cos, grad_sin);
    a table shared by a batch gets the sum over it."""
    n = prefix(gq, table, heads)
    if n:  # the prefix's gradient passes through
        (g0, g1), (h0, h1) = tokens(gq, n, heads), tokens(gk, n, heads)
        rest = [None if x is None else tokens(x, n, heads)[1] for x in (q, k)]
        dq, dk, dt, ds = backward(g1, h1, *rest, table, sin, need_q, need_k, pairs, heads)
        dq, dk = (d if d is None else torch.cat((g, d), dim=token_axis(heads)) for d, g in ((dq, g0), (dk, h0)))
        return dq, dk, dt, ds
    dt = math_dtype(gq, gk)
    cos, sn = cos_sin(table, sin, dt)
    dq = rotate(gq, cos, sn, adjoint=True, pairs=pairs, heads=heads).to(gq.dtype) if need_q else None
    dk = rotate(gk, cos, sn, adjoint=True, pairs=pairs, heads=heads).to(gk.dtype) if need_k else None
    if q is None:
        return dq, dk, None, None
    gcos, gsin = grad_cos_sin(gq, gk, q, k, rotated_channels(cos, pairs), dt, pairs, heads)
    if sin is None:  # d/dangle (cos, sin) = (-sin, cos)
        return dq, dk, (cos * gsin - sn * gcos).sum_to_size(table.shape).to(table.dtype), None
    return dq, dk, gcos.sum_to_size(table.shape).to(table.dtype), gsin.sum_to_size(sin.shape).to(sin.dtype)
