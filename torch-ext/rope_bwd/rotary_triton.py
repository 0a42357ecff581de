"""One strided Triton kernel for the rotary embedding, forward and backward.

Layout (any strides, element units; strides and head counts are compile-time constants):
    X_q [S, HQ, D], X_k [S, HK, D]   rotated inputs: q, k (forward) or the
                                     upstream gradients grad_q_embed, grad_k_embed (backward)
    Y_q, Y_k                         outputs, same shapes
    P_q, P_k                         backward only, when the table needs a gradient: q, k
    T0, T1 [S, D]                    the table: angles (T1 unused) or cos, sin
    G0, G1 [S, D]                    its gradient: grad angles (G1 unused) or grad cos, grad sin

A program owns BLOCK_S tokens x BLOCK_D channels of the first half and their
partners (d + D/2), for every head of q and k, taken BLOCK_R // 2 q heads plus
as many k heads at a time. Within such a chunk every load of both sides comes
before any store: a q phase followed by a k phase would serialize, since the
compiler cannot prove that the q outputs do not alias the k inputs. Both halves
of a row are read (and written) by one access, a last tile axis of 2, so the partner
comes from registers; cos/sin are evaluated once per
token row and reused for all heads; the table gradient is a sum over heads in
registers, in a fixed order (deterministic, no atomics). Small tiles on one
warp measured fastest on the H200 (many programs in flight per SM); splitting
the half dimension gives small-S launches enough programs to fill the GPU.

Only the pointers and S are runtime arguments. Strides, head counts and D do not
depend on S (a model has one layout per call site), so making them constexprs
costs one compilation per layout and buys two things: exact divisibility for the
compiler (head_dim 72 or 80 gets vector, not scalar, accesses) and a short
argument list, whose packing is much of the host time of a launch. No eviction
hints: measured slower.
"""

import functools

import triton
import triton.language as tl
from triton import knobs


@triton.jit
def _halves(base, s_h, h, half_off):
    """Pointers [tokens, heads, channels, 2] to both halves of heads h: base points at
    [tokens, 1, channels] of head 0's first half."""
    return (base + h * s_h)[:, :, :, None] + tl.arange(0, 2)[None, None, None, :] * half_off


@triton.jit
def _load_halves(base, s_h, h, half_off, mask):
    """Both halves of heads h (float32), read by one access: when a half row is not a whole
    number of 32-byte sectors (bf16 head_dim 72: 72 bytes), the sectors it shares with the other
    half then reach the L2 once, not once per half."""
    x = tl.load(_halves(base, s_h, h, half_off), mask=mask[:, :, :, None], other=0.0)
    return tl.split(x.to(tl.float32))


@triton.jit
def _load_side(x, p, sx_h, sp_h, h, x_half, p_half, mask, READ: tl.constexpr, GRAD_TABLE: tl.constexpr):
    """Halves of heads h of one side: x (when the side is read) and p (when the table needs a
    gradient). What is not read comes back as zeros, which the compiler drops."""
    zero = tl.zeros(mask.shape, tl.float32)
    x1, x2, p1, p2 = zero, zero, zero, zero
    if READ:
        x1, x2 = _load_halves(x, sx_h, h, x_half, mask)
    if GRAD_TABLE:
        p1, p2 = _load_halves(p, sp_h, h, p_half, mask)
    return x1, x2, p1, p2


@triton.jit
def _store_halves(base, s_h, h, half_off, y1, y2, mask, ROW_STORE: tl.constexpr):
    """Both halves of heads h, written by one access. ROW_STORE: pointers [2, tokens, heads,
    channels], halves axis first, so that Triton puts it on the lanes rather than in each
    thread's registers, and one store instruction writes whole rows: with the axis in
    registers each instruction writes one half of its rows, and the 32-byte sectors that two
    halves share (bf16 head_dim 72: 72-byte halves) go to the L2 once per half. It costs a
    register shuffle of the values (see _row_store)."""
    y = tl.join(y1, y2).to(base.dtype.element_ty)
    if ROW_STORE:
        ptrs = (base + h * s_h)[None, :, :, :] + tl.arange(0, 2)[:, None, None, None] * half_off
        tl.store(ptrs, tl.permute(y, (3, 0, 1, 2)), mask=mask[None, :, :, :])
    else:
        tl.store(_halves(base, s_h, h, half_off), y, mask=mask[:, :, :, None])


STRIDES = (  # stride parameters of rotary_kernel, in order: 3 per [S, H, D] tensor, 2 per table
    "sxq_s", "sxq_h", "sxq_d", "sxk_s", "sxk_h", "sxk_d",
    "syq_s", "syq_h", "syq_d", "syk_s", "syk_h", "syk_d",
    "spq_s", "spq_h", "spq_d", "spk_s", "spk_h", "spk_d",
    "st0_s", "st0_d", "st1_s", "st1_d", "sg0_s", "sg0_d", "sg1_s", "sg1_d",
)


@triton.jit
def rotary_kernel(
    X_q, X_k, Y_q, Y_k, P_q, P_k, T0, T1, G0, G1, S,
    HQ: tl.constexpr, HK: tl.constexpr, HALF: tl.constexpr,
    sxq_s: tl.constexpr, sxq_h: tl.constexpr, sxq_d: tl.constexpr,
    sxk_s: tl.constexpr, sxk_h: tl.constexpr, sxk_d: tl.constexpr,
    syq_s: tl.constexpr, syq_h: tl.constexpr, syq_d: tl.constexpr,
    syk_s: tl.constexpr, syk_h: tl.constexpr, syk_d: tl.constexpr,
    spq_s: tl.constexpr, spq_h: tl.constexpr, spq_d: tl.constexpr,
    spk_s: tl.constexpr, spk_h: tl.constexpr, spk_d: tl.constexpr,
    st0_s: tl.constexpr, st0_d: tl.constexpr, st1_s: tl.constexpr, st1_d: tl.constexpr,
    sg0_s: tl.constexpr, sg0_d: tl.constexpr, sg1_s: tl.constexpr, sg1_d: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr,
    ADJOINT: tl.constexpr, ANGLES: tl.constexpr,
    WRITE_Q: tl.constexpr, WRITE_K: tl.constexpr, GRAD_TABLE: tl.constexpr, ROW_STORE: tl.constexpr,
):
    BLOCK_H: tl.constexpr = BLOCK_R // 2  # heads per side in one chunk
    # Sides that are neither written nor summed for the table are not read.
    READ_Q: tl.constexpr = WRITE_Q or GRAD_TABLE
    READ_K: tl.constexpr = WRITE_K or GRAD_TABLE
    # int64 token index: S*H*D may pass 2^31 elements.
    s = tl.program_id(0).to(tl.int64) * BLOCK_S + tl.arange(0, BLOCK_S)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_sd = (s[:, None] < S) & (d[None, :] < HALF)
    s2 = s[:, None]
    d2 = d[None, :]

    s3 = s[:, None, None]
    d3 = d[None, None, :]
    m_sd = mask_sd[:, None, :]
    xq = X_q + s3 * sxq_s + d3 * sxq_d
    xk = X_k + s3 * sxk_s + d3 * sxk_d
    pq = P_q + s3 * spq_s + d3 * spq_d
    pk = P_k + s3 * spk_s + d3 * spk_d
    h = tl.arange(0, BLOCK_H)[None, :, None]
    # The table and the first chunk of heads are loaded before either is used, so
    # that a program waits for one DRAM round trip, not two (table, then heads):
    # that latency is most of a call's time when S is small.
    t1 = tl.load(T0 + s2 * st0_s + d2 * st0_d, mask=mask_sd, other=0.0).to(tl.float32)
    t2 = tl.load(T0 + s2 * st0_s + (d2 + HALF) * st0_d, mask=mask_sd, other=0.0).to(tl.float32)
    if not ANGLES:
        n1 = tl.load(T1 + s2 * st1_s + d2 * st1_d, mask=mask_sd, other=0.0).to(tl.float32)
        n2 = tl.load(T1 + s2 * st1_s + (d2 + HALF) * st1_d, mask=mask_sd, other=0.0).to(tl.float32)
    xq1, xq2, pq1, pq2 = _load_side(xq, pq, sxq_h, spq_h, h, HALF * sxq_d, HALF * spq_d, m_sd & (h < HQ),
                                    READ_Q, GRAD_TABLE)
    xk1, xk2, pk1, pk2 = _load_side(xk, pk, sxk_h, spk_h, h, HALF * sxk_d, HALF * spk_d, m_sd & (h < HK),
                                    READ_K, GRAD_TABLE)
    if ANGLES:
        c1 = tl.cos(t1)
        c2 = tl.cos(t2)
        n1 = tl.sin(t1)
        n2 = tl.sin(t2)
    else:
        c1 = t1
        c2 = t2
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
    for h0 in range(0, HQ if HQ > HK else HK, BLOCK_H):
        h = (h0 + tl.arange(0, BLOCK_H))[None, :, None]
        mq = m_sd & (h < HQ)
        mk = m_sd & (h < HK)
        if h0 > 0:  # chunk 0 is loaded above; every load of both sides comes before any store
            xq1, xq2, pq1, pq2 = _load_side(xq, pq, sxq_h, spq_h, h, HALF * sxq_d, HALF * spq_d, mq,
                                            READ_Q, GRAD_TABLE)
            xk1, xk2, pk1, pk2 = _load_side(xk, pk, sxk_h, spk_h, h, HALF * sxk_d, HALF * spk_d, mk,
                                            READ_K, GRAD_TABLE)
        if GRAD_TABLE:
            # grad_cos = sum g*p ; grad_sin = sum g*rotate_half(p), rotate_half(p) = (-p2, p1)
            # One reduction per quantity over both sides (masked heads hold zeros): half the
            # cross-lane shuffles of a sum per side.
            gc1 += tl.sum(xq1 * pq1 + xk1 * pk1, axis=1)
            gc2 += tl.sum(xq2 * pq2 + xk2 * pk2, axis=1)
            gs1 -= tl.sum(xq1 * pq2 + xk1 * pk2, axis=1)
            gs2 += tl.sum(xq2 * pq1 + xk2 * pk1, axis=1)
        if WRITE_Q:
            _store_halves(Y_q + s3 * syq_s + d3 * syq_d, syq_h, h, HALF * syq_d,
                          xq1 * c1b + xq2 * a, xq2 * c2b + xq1 * b, mq, ROW_STORE)
        if WRITE_K:
            _store_halves(Y_k + s3 * syk_s + d3 * syk_d, syk_h, h, HALF * syk_d,
                          xk1 * c1b + xk2 * a, xk2 * c2b + xk1 * b, mk, ROW_STORE)

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


class _Plan:
    """One launch shape: grid, constexprs and, once it has run, Triton's compiled kernel.
    Later launches of the shape call that kernel's launcher directly, exactly as Triton's
    `kernel[grid](...)` does after binding and specializing the arguments, which costs
    more host time than the kernel takes at small S (and a training step at a few thousand
    tokens waits on host time)."""

    def __init__(self, grid, consts):
        self.grid, self.consts = grid, consts
        # constexpr values in the kernel's parameter order (the launcher skips them)
        self.const_args = tuple(consts[n] for n in rotary_kernel.arg_names if n in consts)
        self.compiled = None


def _grid(S, D, cfg):
    return (triton.cdiv(S, cfg["BLOCK_S"]), triton.cdiv(D // 2, cfg["BLOCK_D"]))


def _constexprs(HQ, D, HK, adjoint, layout, config):
    """The kernel's constexprs. `layout` holds, per tensor argument, None (unused) or
    (strides, dtype, 16-byte alignment of its pointer): the strides are constexprs; dtypes
    and alignment only key the compiled kernel (Triton compiles one per value)."""
    cfg = dict(config)
    ndims = (3, 3, 3, 3, 3, 3, 2, 2, 2, 2)  # unused tensors get zero strides
    flat = (st for lay, n in zip(layout, ndims) for st in (lay[0] if lay else (0,) * n))
    y_q, y_k, g0, t1 = layout[2], layout[3], layout[8], layout[7]
    y_dtype = (y_q or y_k or g0)[1]
    return dict(
        HQ=HQ, HK=HK, HALF=D // 2, **dict(zip(STRIDES, flat)),
        BLOCK_S=cfg["BLOCK_S"], BLOCK_D=cfg["BLOCK_D"], BLOCK_R=cfg["BLOCK_R"],
        ADJOINT=adjoint, ANGLES=t1 is None, WRITE_Q=y_q is not None, WRITE_K=y_k is not None,
        GRAD_TABLE=g0 is not None, ROW_STORE=_row_store(D // 2, y_dtype.itemsize, g0 is not None),
        num_warps=cfg["num_warps"],
    )


def _row_store(half, itemsize, grad_table):
    """Whole rows per store instruction (see _store_halves) where half rows share sectors and
    no table gradient is computed. H200, kernel time, best configuration of each (NOTES.md):
    forward and q/k-only backward 1-7% faster at S >= 4096 (bf16 head_dim 72/80, fp32 head_dim
    72; at S = 1024 within the timing noise); the backward with a table gradient 1-6% slower
    (bf16 head_dim 72), so it keeps per-half stores."""
    return not grad_table and (half * itemsize) % 32 != 0


@functools.lru_cache(maxsize=1024)
def _plan(S, HQ, D, HK, adjoint, layout, config, device):
    """The _Plan of one launch, cached (`device` keys the compiled kernel)."""
    return _Plan(_grid(S, D, dict(config)), _constexprs(HQ, D, HK, adjoint, layout, config))


def _pointer_args(x_q, x_k, y_q, y_k, p_q, p_k, t0, t1, g0, g1):
    """The ten tensors, each unused one replaced by a used tensor of its kind (an output for
    outputs, an input for inputs), so that every argument is valid and inductor, which reads
    what the kernel stores to, sees no input written."""
    y_any = next(t for t in (y_q, y_k, g0) if t is not None)
    return (
        x_q, x_k,
        y_q if y_q is not None else y_any, y_k if y_k is not None else y_any,
        p_q if p_q is not None else x_q, p_k if p_k is not None else x_k,
        t0, t1 if t1 is not None else t0,
        g0 if g0 is not None else y_any, g1 if g1 is not None else y_any,
    )


def launch(x_q, x_k, y_q, y_k, p_q, p_k, t0, t1, g0, g1, *, adjoint, config):
    """Run the kernel on the current device. Tensors that a mode does not use may be None
    (y_q/y_k when that side is not written; p_*, g* without a table gradient; t1, g1 in
    angle mode). Outputs y_q and y_k share one dtype. `config` holds BLOCK_S, BLOCK_D,
    BLOCK_R, num_warps (see tuning.py)."""
    S, HQ, D = x_q.shape
    if S == 0:
        return
    tensors = (x_q, x_k, y_q, y_k, p_q, p_k, t0, t1, g0, g1)
    # This key is most of the host time of a launch seen before: one pass, no generators.
    ptrs = [0 if t is None else t.data_ptr() for t in tensors]
    layout = tuple([None if t is None else (t.stride(), t.dtype, p % 16 == 0) for t, p in zip(tensors, ptrs)])
    plan = _plan(S, HQ, D, x_k.shape[1], adjoint, layout, tuple(config.items()), x_q.device.index)
    kernel = plan.compiled
    if kernel is None:
        # Triton's path: compiles on first use. The interpreter returns no compiled kernel,
        # so it always comes here.
        plan.compiled = rotary_kernel[plan.grid](*_pointer_args(*tensors), S, **plan.consts)
        return
    # The launcher takes addresses as ints: for a tensor it would call data_ptr() again and
    # ask the driver about the pointer (cuPointerGetAttribute), for each of the ten. Unused
    # pointers are null: the kernel's constexpr flags compile their accesses away.
    stream = triton.runtime.driver.active.get_current_stream(x_q.device.index)
    args = (*ptrs, S, *plan.const_args)
    kernel.run(*plan.grid, 1, stream, kernel.function, kernel.packed_metadata,
               kernel.launch_metadata(plan.grid, stream, *args),
               knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *args)


def launch_traced(x_q, x_k, y_q, y_k, p_q, p_k, t0, t1, g0, g1, *, adjoint, config):
    """launch() for torch.compile's tracing (fake or functional tensors; head counts and
    head_dim ints, S may be symbolic): through torch.library.wrap_triton, so that inductor
    sees the kernel and launches it from its generated code, with no Python op left on the
    step's host path. Called with real tensors (a triton_op run eagerly), it is Triton's
    own launch.

    With S dynamic, S and the grid are symbolic and every constexpr must still be an int.
    An input whose strides depend on S (the upstream gradient arrives transposed from the
    attention: head stride S*D) is copied to contiguous strides, which depend only on the
    head count and head_dim. Inductor writes that copy as one more kernel of its own: a
    pass over a gradient costs far less than a Python op per call (NOTES.md). Outputs are
    contiguous already."""
    from torch.library import wrap_triton

    S, HQ, D = x_q.shape
    if S == 0:
        return
    x_q, x_k, p_q, p_k, t0, t1 = (
        t if t is None or all(isinstance(st, int) for st in t.stride()) else t.contiguous()
        for t in (x_q, x_k, p_q, p_k, t0, t1))
    tensors = (x_q, x_k, y_q, y_k, p_q, p_k, t0, t1, g0, g1)
    # No pointer alignment in the key: traced tensors have no address (inductor specializes).
    layout = tuple(None if t is None else (t.stride(), t.dtype, None) for t in tensors)
    consts = _constexprs(HQ, D, x_k.shape[1], adjoint, layout, tuple(config.items()))
    wrap_triton(rotary_kernel)[_grid(S, D, config)](*_pointer_args(*tensors), S, **consts)
