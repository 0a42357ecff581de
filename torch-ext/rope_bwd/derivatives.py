"""The rules of the rotation's autograd past the first eager backward: torch.func transforms
(grad, vmap, jvp, hessian), forward-mode AD and double backward (ops.py's Functions apply them).

The rotation is linear in q/k and in the (cos, sin) table, and its backward is linear in the
upstream gradients and bilinear in them and (q, k) or the table. So every derivative is a sum
of calls of the same two maps, each differentiable again (any order runs the kernel):
    F(xq, xk, table, sin)                        -> (yq, yk)          the rotation
    B(gq, gk, q, k, table, sin, need_q, need_k)  -> (dq, dk, dt, ds)  its adjoint, and the
                                                    table's gradient when q and k are given
`table` holds angles when sin is None, else cos. Angles enter through cos(table) and
sin(table): a tangent t of the angles is the (cos, sin) tangent (-sin*t, cos*t), and the
angle gradient -sin*gcos + cos*gsin adds one term of its own (`_curvature`).
"""

import torch

from .rotary_torch import math_dtype


def _filled(a, b, like_a, like_b):
    """(a, b) with zeros for a missing one: F and B take both sides."""
    return (a if a is not None else torch.zeros_like(like_a), b if b is not None else torch.zeros_like(like_b))


def _table_dir(table, sin, t_table, t_sin, x_q, x_k):
    """A tangent (or cotangent of the table gradient) of the table, as a (cos, sin) pair; None when
    there is none. x_q, x_k: the rotated tensors, whose dtypes set the math dtype of cos(angles)."""
    if sin is not None:
        return None if t_table is None and t_sin is None else _filled(t_table, t_sin, table, sin)
    if t_table is None:
        return None
    dt = math_dtype(x_q, x_k)
    angles, t = table.to(dt), t_table.to(dt)
    return -angles.sin() * t, angles.cos() * t


def _rotated_only(pair, table):
    """A term of a table direction, zero past the table's width (F and B pass those channels
    through, but they do not depend on the table)."""
    rot = table.shape[-1]
    return tuple(
        t if t is None or t.shape[-1] == rot else torch.nn.functional.pad(t[..., :rot], (0, t.shape[-1] - rot))
        for t in pair
    )


def _curvature(B, gq, gk, q, k, angles, t):
    """t * d/dangles of the angle gradient -sin*gcos + cos*gsin, in the angles' dtype."""
    dt = math_dtype(gq, gk)
    a = angles.to(dt)
    c, s = a.cos(), a.sin()
    gcos, gsin = B(gq, gk, q, k, c, s, False, False)[2:]
    return (t.to(dt) * -(c * gcos + s * gsin)).to(angles.dtype)


def _sums(terms, likes):
    """Position-wise sums of the terms' non-None entries; zeros for an asked output (`likes`
    entry not None) that no term reaches, None where `likes` is None."""
    out = []
    for i, like in enumerate(likes):
        parts = [t[i] for t in terms if t[i] is not None]
        out.append(None if like is None else (sum(parts[1:], parts[0]) if parts else torch.zeros_like(like)))
    return tuple(out)


def rotation_jvp(F, q, k, table, sin, tq, tk, t_table, t_sin):
    """Tangents of F(q, k, table, sin)."""
    terms = []
    if tq is not None or tk is not None:
        terms.append(F(*_filled(tq, tk, q, k), table, sin))
    d = _table_dir(table, sin, t_table, t_sin, q, k)
    if d is not None:
        terms.append(_rotated_only(F(q, k, *d), d[0]))
    return _sums(terms, (q, k))


def _asked(saved, need_q, need_k):
    """Tensors shaped like B's outputs where they are asked for, else None."""
    gq, gk, q, _, table, sin = saved
    grad_table = q is not None
    return (gq if need_q else None, gk if need_k else None, table if grad_table else None, sin if grad_table else None)


def adjoint_jvp(B, saved, need_q, need_k, tangents):
    """Tangents of B(*saved, need_q, need_k) for tangents of (gq, gk, q, k, table, sin)."""
    gq, gk, q, k, table, sin = saved
    tgq, tgk, tq, tk, t_table, t_sin = tangents
    terms = []
    if tgq is not None or tgk is not None:  # linear in the upstream gradients
        terms.append(B(*_filled(tgq, tgk, gq, gk), q, k, table, sin, need_q, need_k))
    if q is not None and (tq is not None or tk is not None):
        terms.append((None, None, *B(gq, gk, *_filled(tq, tk, q, k), table, sin, False, False)[2:]))
    d = _table_dir(table, sin, t_table, t_sin, gq, gk)
    if d is not None:
        if need_q or need_k:
            terms.append((*_rotated_only(B(gq, gk, None, None, *d, need_q, need_k)[:2], d[0]), None, None))
        if q is not None and sin is None:
            terms.append((None, None, _curvature(B, gq, gk, q, k, table, t_table), None))
    return _sums(terms, _asked(saved, need_q, need_k))


def adjoint_vjp(F, B, saved, need_q, need_k, needs, cotangents):
    """Gradients of (gq, gk, q, k, table, sin) from cotangents of B's outputs (dq, dk, dt, ds);
    `needs`: which of the six need one."""
    gq, gk, q, k, table, sin = saved
    vq, vk, v_table, v_sin = (v if a is not None else None for v, a in zip(cotangents, _asked(saved, need_q, need_k)))
    # The cotangent of the summed products (gcos, gsin) that the table gradient is made of.
    d = _table_dir(table, sin, v_table, v_sin, gq, gk) if q is not None else None
    v_heads = vq is not None or vk is not None
    grads = [None] * 6
    if needs[0] or needs[1]:
        terms = []
        if v_heads:  # dq = R^T g: its gradient in g is the rotation of dq's cotangent
            terms.append(F(*_filled(vq, vk, gq, gk), table, sin))
        if d is not None:  # gcos = sum g*q, gsin = sum g*rotate_half(q)
            terms.append(_rotated_only(F(q, k, *d), d[0]))
        grads[0], grads[1] = _sums(terms, (gq if needs[0] else None, gk if needs[1] else None))
    if (needs[2] or needs[3]) and d is not None:
        dq, dk = _rotated_only(B(gq, gk, None, None, *d, needs[2], needs[3])[:2], d[0])
        grads[2], grads[3] = (dq if needs[2] else None), (dk if needs[3] else None)
    if needs[4] or needs[5]:
        terms = []
        if v_heads:  # dq = R^T(table) g, with the cotangent in the place of q
            terms.append(B(gq, gk, *_filled(vq, vk, gq, gk), table, sin, False, False)[2:])
        if d is not None and sin is None:
            terms.append((_curvature(B, gq, gk, q, k, table, v_table), None))
        grads[4], grads[5] = _sums(terms, (table if needs[4] else None, sin if needs[5] else None))
    return tuple(grads)


def vmap_folded(fn, batch_size, in_dims, tensors, *rest):
    """vmap of fn(*tensors, *rest) by one call: tensors are F's or B's (q-like first, the tables
    last); tokens and sequences are independent, so sample b folds into token rows b*S.. of 3-D q
    [S, H, D], or sequences b*B.. of 4-D q [B, S, H, D] (tables expanded to B sequences first). An
    argument without the vmapped dimension is expanded (a table's gradient is then one per sample;
    a table shared by a sample's sequences gets their sum). Returns (outputs, out_dims)."""
    moved = [
        None if t is None else t.movedim(dim, 0) if dim is not None else t.expand(batch_size, *t.shape)
        for t, dim in zip(tensors, in_dims)
    ]
    seqs = moved[0].shape[1] if moved[0].dim() == 5 else None  # a sample's sequences (4-D q)
    tables = moved[-2:]
    folded = [
        None if t is None else (t.expand(-1, seqs, *t.shape[2:]) if seqs and i >= len(moved) - 2 else t).flatten(0, 1)
        for i, t in enumerate(moved)
    ]
    outs = fn(*folded, *rest)

    def unfold(i, o):
        o = o.unflatten(0, (batch_size, -1))
        if seqs and i >= 2 and tables[i - 2].shape[1] == 1:  # the gradient of a shared table
            o = o.sum(1, keepdim=True)
        return o

    return (
        tuple(None if o is None else unfold(i, o) for i, o in enumerate(outs)),
        tuple(None if o is None else 0 for o in outs),
    )
