"""The rotary embedding in plain PyTorch: the CPU path, and the readable statement
of the semantics that the Triton kernels must match.

Layout: q, k and their gradients are [S, H, D] (any strides); the rotation
table is [S, D], either angles (`embeddings`, cos/sin taken here) or a
(cos, sin) pair. Math runs in float32 (float64 when q or k is float64) and results
are cast back to the dtype of the tensor they are the value or gradient of; q and
k may differ in dtype, as in transformers.
"""

import torch


def math_dtype(*tensors) -> torch.dtype:
    """float64 when any of the tensors is, else float32."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def _halves(x: torch.Tensor):
    half = x.shape[-1] // 2
    return x[..., :half], x[..., half:]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = _halves(x)
    return torch.cat((-x2, x1), dim=-1)


def cos_sin(embeddings: torch.Tensor, dtype: torch.dtype):
    e = embeddings.to(dtype)
    return e.cos(), e.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, adjoint: bool) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin, or its adjoint (the backward map of x).

    cos/sin are [S, D] in the math dtype; the result is in the math dtype.
    With general (not half-duplicated) tables the adjoint mixes halves:
        forward: y1 = x1*c1 - x2*s1   y2 = x2*c2 + x1*s2
        adjoint: y1 = x1*c1 + x2*s2   y2 = x2*c2 - x1*s1
    """
    x = x.to(cos.dtype)
    c, s = cos[:, None, :], sin[:, None, :]
    if not adjoint:
        return x * c + rotate_half(x) * s
    x1, x2 = _halves(x)
    c1, c2 = _halves(c)
    s1, s2 = _halves(s)
    return torch.cat((x1 * c1 + x2 * s2, x2 * c2 - x1 * s1), dim=-1)


def grad_cos_sin(gq, gk, q, k, dtype: torch.dtype):
    """Gradients of the cos and sin tables: sums over heads of g*x and g*rotate_half(x)."""
    gcos = 0
    gsin = 0
    for g, x in ((gq, q), (gk, k)):
        g, x = g.to(dtype), x.to(dtype)
        gcos = gcos + (g * x).sum(dim=1)
        gsin = gsin + (g * rotate_half(x)).sum(dim=1)
    return gcos, gsin


def forward(q, k, table, sin=None):
    """(q_embed, k_embed). table = angles when sin is None, else cos."""
    dt = math_dtype(q, k)
    cos, sn = cos_sin(table, dt) if sin is None else (table.to(dt), sin.to(dt))
    return (
        rotate(q, cos, sn, adjoint=False).to(q.dtype),
        rotate(k, cos, sn, adjoint=False).to(k.dtype),
    )


def backward(gq, gk, q, k, table, sin=None, *, need_q=True, need_k=True):
    """(grad_q, grad_k, grad_table, grad_sin); None where not asked for.

    The table gradient is computed when q and k are given (they are read only
    for it): grad_embeddings in angle mode, else (grad_cos, grad_sin).
    """
    dt = math_dtype(gq, gk)
    cos, sn = cos_sin(table, dt) if sin is None else (table.to(dt), sin.to(dt))
    dq = rotate(gq, cos, sn, adjoint=True).to(gq.dtype) if need_q else None
    dk = rotate(gk, cos, sn, adjoint=True).to(gk.dtype) if need_k else None
    dtable = dsin = None
    if q is not None:
        gcos, gsin = grad_cos_sin(gq, gk, q, k, dt)
        if sin is None:
            dtable = (cos * gsin - sn * gcos).to(table.dtype)
        else:
            dtable, dsin = gcos.to(table.dtype), gsin.to(sin.dtype)
    return dq, dk, dtable, dsin
