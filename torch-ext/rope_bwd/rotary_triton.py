"""One strided Triton kernel for the rotary embedding, forward and backward.

Layout (any strides, element units; the kernel takes every stride as an argument):
    X_q [S, HQ, D], X_k [S, HK, D]   rotated inputs: q, k (forward) or the
                                     upstream gradients grad_q_embed, grad_k_embed (backward)
    Y_q, Y_k                         outputs, same shapes
    P_q, P_k                         backward only, when the table needs a gradient: q, k
    T0, T1 [S, D]                    the table: angles (T1 unused) or cos, sin
    G0, G1 [S, D]                    its gradient: grad angles (G1 unused) or grad cos, grad sin

A program owns BLOCK_S tokens x BLOCK_D channels of the first half and their
partners (d + D/2), for every head of q and k. The heads of q and k are stacked
as rows of one tile (row r < HQ is q head r, else k head r - HQ), so a program
issues all its loads before any store: separate q and k phases would serialize,
since the compiler cannot prove that the q outputs do not alias the k inputs.
Each half is read once and the partner comes from registers; cos/sin are
evaluated once per token row and reused for all heads; the table gradient is
a sum over rows in registers, in a fixed order (deterministic, no atomics).
Splitting the half dimension into chunks gives small-S launches enough
programs to fill the GPU.

Token and head strides and D/2 arrive divided by V (a power of two dividing all
of them) and are multiplied by the constexpr V here: Triton only knows that a
runtime integer is a multiple of 16, so without this a head_dim of 72 or 80
would get scalar instead of vector loads. No eviction hints: measured slower.
"""

import math

import triton
import triton.language as tl


@triton.jit
def _rows(base_q, base_k, r, HQ, s_h_q, s_h_k):
    """Pointers of tile rows: q head r for r < HQ, else k head r - HQ."""
    is_q = r < HQ
    return tl.where(is_q, base_q + r * s_h_q, base_k + (r - HQ) * s_h_k)


@triton.jit
def rotary_kernel(
    X_q, X_k, Y_q, Y_k, P_q, P_k, T0, T1, G0, G1,
    S, HQ, HK, HALF_V,
    sxq_s, sxq_h, sxq_d, sxk_s, sxk_h, sxk_d,
    syq_s, syq_h, syq_d, syk_s, syk_h, syk_d,
    spq_s, spq_h, spq_d, spk_s, spk_h, spk_d,
    st0_s, st0_d, st1_s, st1_d, sg0_s, sg0_d, sg1_s, sg1_d,
    V: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr,
    ADJOINT: tl.constexpr, ANGLES: tl.constexpr,
    WRITE_Q: tl.constexpr, WRITE_K: tl.constexpr, GRAD_TABLE: tl.constexpr,
):
    HALF = HALF_V * V
    sxq_s *= V
    sxq_h *= V
    sxk_s *= V
    sxk_h *= V
    syq_s *= V
    syq_h *= V
    syk_s *= V
    syk_h *= V
    spq_s *= V
    spq_h *= V
    spk_s *= V
    spk_h *= V
    st0_s *= V
    st1_s *= V
    sg0_s *= V
    sg1_s *= V
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
    # forward: y1 = x1*c1 - x2*s1, y2 = x2*c2 + x1*s2; the adjoint swaps which sine goes where.
    if ADJOINT:
        a = n2[:, None, :]
        b = -n1[:, None, :]
    else:
        a = -n1[:, None, :]
        b = n2[:, None, :]
    c1b = c1[:, None, :]
    c2b = c2[:, None, :]

    gc1 = tl.zeros((BLOCK_S, BLOCK_D), tl.float32)
    gc2 = tl.zeros((BLOCK_S, BLOCK_D), tl.float32)
    gs1 = tl.zeros((BLOCK_S, BLOCK_D), tl.float32)
    gs2 = tl.zeros((BLOCK_S, BLOCK_D), tl.float32)
    s3 = s[:, None, None]
    d3 = d[None, None, :]
    m_sd = mask_sd[:, None, :]
    for r0 in range(0, HQ + HK, BLOCK_R):
        r = (r0 + tl.arange(0, BLOCK_R))[None, :, None]
        is_q = r < HQ
        in_rows = r < HQ + HK
        written = (is_q & WRITE_Q) | ((~is_q) & WRITE_K)
        # Rows that are neither written nor summed for the table are not read.
        mask = m_sd & in_rows & (written | GRAD_TABLE)
        x = _rows(X_q + s3 * sxq_s + d3 * sxq_d, X_k + s3 * sxk_s + d3 * sxk_d, r, HQ, sxq_h, sxk_h)
        x_half = tl.where(is_q, HALF * sxq_d, HALF * sxk_d)
        x1 = tl.load(x, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(x + x_half, mask=mask, other=0.0).to(tl.float32)
        if GRAD_TABLE:
            p = _rows(P_q + s3 * spq_s + d3 * spq_d, P_k + s3 * spk_s + d3 * spk_d, r, HQ, spq_h, spk_h)
            p_half = tl.where(is_q, HALF * spq_d, HALF * spk_d)
            p1 = tl.load(p, mask=mask, other=0.0).to(tl.float32)
            p2 = tl.load(p + p_half, mask=mask, other=0.0).to(tl.float32)
            # grad_cos = sum g*p ; grad_sin = sum g*rotate_half(p), rotate_half(p) = (-p2, p1)
            gc1 += tl.sum(x1 * p1, axis=1)
            gc2 += tl.sum(x2 * p2, axis=1)
            gs1 -= tl.sum(x1 * p2, axis=1)
            gs2 += tl.sum(x2 * p1, axis=1)
        if WRITE_Q or WRITE_K:
            y = _rows(Y_q + s3 * syq_s + d3 * syq_d, Y_k + s3 * syk_s + d3 * syk_d, r, HQ, syq_h, syk_h)
            y_half = tl.where(is_q, HALF * syq_d, HALF * syk_d)
            y1 = x1 * c1b + x2 * a
            y2 = x2 * c2b + x1 * b
            wmask = m_sd & in_rows & written
            tl.store(y, y1.to(Y_q.dtype.element_ty), mask=wmask)
            tl.store(y + y_half, y2.to(Y_q.dtype.element_ty), mask=wmask)

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


def _divided(strides, v):
    """Token/head strides divided by v; the channel stride (last) as is."""
    return [st // v for st in strides[:-1]] + [strides[-1]]


def launch(x_q, x_k, y_q, y_k, p_q, p_k, t0, t1, g0, g1, *, adjoint, config):
    """Run the kernel. Tensors that a mode does not use may be None (y_q/y_k when
    that side is not written; p_*, g* without a table gradient; t1, g1 in angle mode).
    Outputs y_q and y_k share one dtype. `config` holds BLOCK_S, BLOCK_D, BLOCK_R,
    num_warps (see tuning.py)."""
    S, HQ, D = x_q.shape
    HK = x_k.shape[1]
    if S == 0:
        return
    half = D // 2
    tensors = [t for t in (x_q, x_k, y_q, y_k, p_q, p_k, t0, t1, g0, g1) if t is not None]
    v = math.gcd(half, *(st for t in tensors for st in t.stride()[:-1]))
    v = math.gcd(v, 16)  # a power of two, enough for 16-byte accesses
    # Unused pointers get a real tensor of the right dtype, so every argument is valid.
    y_any = y_q if y_q is not None else (y_k if y_k is not None else x_q)
    grid = (triton.cdiv(S, config["BLOCK_S"]), triton.cdiv(half, config["BLOCK_D"]))
    rotary_kernel[grid](
        x_q, x_k,
        y_q if y_q is not None else y_any, y_k if y_k is not None else y_any,
        p_q if p_q is not None else x_q, p_k if p_k is not None else x_k,
        t0, t1 if t1 is not None else t0,
        g0 if g0 is not None else t0, g1 if g1 is not None else t0,
        S, HQ, HK, half // v,
        *(st for t, n in ((x_q, 3), (x_k, 3), (y_q, 3), (y_k, 3), (p_q, 3), (p_k, 3), (t0, 2), (t1, 2), (g0, 2), (g1, 2))
          for st in _divided(_strides(t, n), v)),
        V=v,
        BLOCK_S=config["BLOCK_S"], BLOCK_D=config["BLOCK_D"], BLOCK_R=config["BLOCK_R"],
        ADJOINT=adjoint, ANGLES=t1 is None,
        WRITE_Q=y_q is not None, WRITE_K=y_k is not None, GRAD_TABLE=g0 is not None,
        num_warps=config["num_warps"],
    )
