"""One strided Triton kernel for the rotary embedding, forward and backward.

Layout (any strides, element units; the kernel takes every stride as an argument):
    X_q [S, HQ, D], X_k [S, HK, D]   rotated inputs: q, k (forward) or the
                                     upstream gradients grad_q_embed, grad_k_embed (backward)
    Y_q, Y_k                         outputs, same shapes
    P_q, P_k                         backward only, when the table needs a gradient: q, k
    T0, T1 [S, D]                    the table: angles (T1 unused) or cos, sin
    G0, G1 [S, D]                    its gradient: grad angles (G1 unused) or grad cos, grad sin

A program owns BLOCK_S tokens x BLOCK_D channels of the first half and their
partners (d + D/2) in the second half, for every head. Each half is read once
and the partner comes from registers; cos/sin are evaluated once per token row
and reused for all heads; the table gradient is a sum over heads done in
registers in a fixed order (deterministic, no atomics). Splitting the half
dimension into chunks gives small-S launches enough programs to fill the GPU.
"""

import triton
import triton.language as tl


@triton.jit
def _side(
    X, Y, P, s, d, mask_sd, H, HALF,
    c1, c2, a, b,
    sx_s, sx_h, sx_d, sy_s, sy_h, sy_d, sp_s, sp_h, sp_d,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr,
    WRITE: tl.constexpr, GRAD_TABLE: tl.constexpr,
):
    """Rotate one of q/k over all its heads: y1 = x1*c1 + x2*a, y2 = x2*c2 + x1*b.
    Returns its head-sums for the table gradient (zeros unless GRAD_TABLE)."""
    gc1 = tl.zeros((BLOCK_S, BLOCK_D), tl.float32)
    gc2 = tl.zeros((BLOCK_S, BLOCK_D), tl.float32)
    gs1 = tl.zeros((BLOCK_S, BLOCK_D), tl.float32)
    gs2 = tl.zeros((BLOCK_S, BLOCK_D), tl.float32)
    s3 = s[:, None, None]
    d3 = d[None, None, :]
    for h0 in range(0, H, BLOCK_H):
        h = h0 + tl.arange(0, BLOCK_H)
        h3 = h[None, :, None]
        mask = mask_sd[:, None, :] & (h3 < H)
        ox = s3 * sx_s + h3 * sx_h + d3 * sx_d
        x1 = tl.load(X + ox, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        x2 = tl.load(X + ox + HALF * sx_d, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        if WRITE:
            oy = s3 * sy_s + h3 * sy_h + d3 * sy_d
            y1 = x1 * c1[:, None, :] + x2 * a[:, None, :]
            y2 = x2 * c2[:, None, :] + x1 * b[:, None, :]
            tl.store(Y + oy, y1.to(Y.dtype.element_ty), mask=mask, eviction_policy="evict_first")
            tl.store(Y + oy + HALF * sy_d, y2.to(Y.dtype.element_ty), mask=mask, eviction_policy="evict_first")
        if GRAD_TABLE:
            op = s3 * sp_s + h3 * sp_h + d3 * sp_d
            p1 = tl.load(P + op, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            p2 = tl.load(P + op + HALF * sp_d, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            # grad_cos = sum_h g*p ; grad_sin = sum_h g*rotate_half(p), rotate_half(p) = (-p2, p1)
            gc1 += tl.sum(x1 * p1, axis=1)
            gc2 += tl.sum(x2 * p2, axis=1)
            gs1 -= tl.sum(x1 * p2, axis=1)
            gs2 += tl.sum(x2 * p1, axis=1)
    return gc1, gc2, gs1, gs2


@triton.jit
def rotary_kernel(
    X_q, X_k, Y_q, Y_k, P_q, P_k, T0, T1, G0, G1,
    S, HQ, HK, HALF,
    sxq_s, sxq_h, sxq_d, sxk_s, sxk_h, sxk_d,
    syq_s, syq_h, syq_d, syk_s, syk_h, syk_d,
    spq_s, spq_h, spq_d, spk_s, spk_h, spk_d,
    st0_s, st0_d, st1_s, st1_d, sg0_s, sg0_d, sg1_s, sg1_d,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr,
    ADJOINT: tl.constexpr, ANGLES: tl.constexpr,
    WRITE_Q: tl.constexpr, WRITE_K: tl.constexpr, GRAD_TABLE: tl.constexpr,
):
    # int64 token index: S*H*D may pass 2^31 elements.
    s = tl.program_id(0).to(tl.int64) * BLOCK_S + tl.arange(0, BLOCK_S)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_sd = (s[:, None] < S) & (d[None, :] < HALF)
    s2 = s[:, None]
    d2 = d[None, :]

    t1 = tl.load(T0 + s2 * st0_s + d2 * st0_d, mask=mask_sd, other=0.0).to(tl.float32)
    t2 = tl.load(T0 + s2 * st0_s + (d2 + HALF) * st0_d, mask=mask_sd, other=0.0).to(tl.float32)
    if ANGLES:
        c1 = tl.cos(t1)
        c2 = tl.cos(t2)
        n1 = tl.sin(t1)
        n2 = tl.sin(t2)
    else:
        c1 = t1
        c2 = t2
        n1 = tl.load(T1 + s2 * st1_s + d2 * st1_d, mask=mask_sd, other=0.0).to(tl.float32)
        n2 = tl.load(T1 + s2 * st1_s + (d2 + HALF) * st1_d, mask=mask_sd, other=0.0).to(tl.float32)
    # forward: y1 = x1*c1 - x2*s1, y2 = x2*c2 + x1*s2; adjoint swaps which sine goes where.
    if ADJOINT:
        a = n2
        b = -n1
    else:
        a = -n1
        b = n2

    gc1 = tl.zeros((BLOCK_S, BLOCK_D), tl.float32)
    gc2 = tl.zeros((BLOCK_S, BLOCK_D), tl.float32)
    gs1 = tl.zeros((BLOCK_S, BLOCK_D), tl.float32)
    gs2 = tl.zeros((BLOCK_S, BLOCK_D), tl.float32)
    if WRITE_Q or GRAD_TABLE:
        qc1, qc2, qs1, qs2 = _side(
            X_q, Y_q, P_q, s, d, mask_sd, HQ, HALF, c1, c2, a, b,
            sxq_s, sxq_h, sxq_d, syq_s, syq_h, syq_d, spq_s, spq_h, spq_d,
            BLOCK_S, BLOCK_D, BLOCK_HQ, WRITE_Q, GRAD_TABLE,
        )
        gc1 += qc1
        gc2 += qc2
        gs1 += qs1
        gs2 += qs2
    if WRITE_K or GRAD_TABLE:
        kc1, kc2, ks1, ks2 = _side(
            X_k, Y_k, P_k, s, d, mask_sd, HK, HALF, c1, c2, a, b,
            sxk_s, sxk_h, sxk_d, syk_s, syk_h, syk_d, spk_s, spk_h, spk_d,
            BLOCK_S, BLOCK_D, BLOCK_HK, WRITE_K, GRAD_TABLE,
        )
        gc1 += kc1
        gc2 += kc2
        gs1 += ks1
        gs2 += ks2

    if GRAD_TABLE:
        if ANGLES:
            # d/d angle of (cos, sin) = (-sin, cos)
            tl.store(G0 + s2 * sg0_s + d2 * sg0_d, (c1 * gs1 - n1 * gc1).to(G0.dtype.element_ty), mask=mask_sd)
            tl.store(G0 + s2 * sg0_s + (d2 + HALF) * sg0_d, (c2 * gs2 - n2 * gc2).to(G0.dtype.element_ty), mask=mask_sd)
        else:
            tl.store(G0 + s2 * sg0_s + d2 * sg0_d, gc1.to(G0.dtype.element_ty), mask=mask_sd)
            tl.store(G0 + s2 * sg0_s + (d2 + HALF) * sg0_d, gc2.to(G0.dtype.element_ty), mask=mask_sd)
            tl.store(G1 + s2 * sg1_s + d2 * sg1_d, gs1.to(G1.dtype.element_ty), mask=mask_sd)
            tl.store(G1 + s2 * sg1_s + (d2 + HALF) * sg1_d, gs2.to(G1.dtype.element_ty), mask=mask_sd)


def _strides(t, n):
    return t.stride() if t is not None else (0,) * n


def launch(x_q, x_k, y_q, y_k, p_q, p_k, t0, t1, g0, g1, *, adjoint, config):
    """Run the kernel. Tensors that a mode does not use may be None (y_q/y_k when
    that side is not written; p_*, g* without a table gradient; t1, g1 in angle mode).
    `config` holds BLOCK_S, BLOCK_D, BLOCK_HQ, BLOCK_HK, num_warps (see tuning.py)."""
    S, HQ, D = x_q.shape
    HK = x_k.shape[1]
    if S == 0:
        return
    half = D // 2
    angles = t1 is None
    grad_table = g0 is not None
    # Unused pointers get a real tensor so that every argument is a valid pointer.
    any_ = x_q
    grid = (triton.cdiv(S, config["BLOCK_S"]), triton.cdiv(half, config["BLOCK_D"]))
    rotary_kernel[grid](
        x_q, x_k,
        y_q if y_q is not None else any_, y_k if y_k is not None else any_,
        p_q if p_q is not None else any_, p_k if p_k is not None else any_,
        t0, t1 if t1 is not None else t0,
        g0 if g0 is not None else t0, g1 if g1 is not None else t0,
        S, HQ, HK, half,
        *x_q.stride(), *x_k.stride(),
        *_strides(y_q, 3), *_strides(y_k, 3),
        *_strides(p_q, 3), *_strides(p_k, 3),
        *t0.stride(), *_strides(t1, 2), *_strides(g0, 2), *_strides(g1, 2),
        BLOCK_S=config["BLOCK_S"], BLOCK_D=config["BLOCK_D"],
        BLOCK_HQ=config["BLOCK_HQ"], BLOCK_HK=config["BLOCK_HK"],
        ADJOINT=adjoint, ANGLES=angles,
        WRITE_Q=y_q is not None, WRITE_K=y_k is not None, GRAD_TABLE=grad_table,
        num_warps=config["num_warps"],
    )

