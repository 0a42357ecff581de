"""One strided Triton kernel for the rotary embedding, forward and backward.

Layout (any strides, element units):
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
of a row are read (and written) by one access, a tile axis of 2 placed where this
Triton keeps it in registers (_REGS_FIRST), so the partner comes from registers;
cos/sin are evaluated once per token row and reused for all heads; the table
gradient is a sum over heads in registers, in a fixed order (deterministic, no
atomics). Small tiles on one warp measured fastest (many programs in flight per SM:
benchmarks/NOTES.md); splitting the half dimension gives small-S launches enough
programs to fill the GPU.

Compiled once per layout, never per sequence length: training on images of many
sizes sees a new S nearly every step. Only the pointers and S are runtime
arguments, and S is not specialized by Triton (do_not_specialize: no variant for
S == 1 or S % 16 == 0). Everything else is a constexpr that does not change with
S: head counts, head_dim, block sizes, mode flags and the strides. A stride is a
constant, or a multiple of S: the upstream gradient as sdpa returns it, [1, H, S, D]
seen as [S, H, D], has head stride S*D. Such a stride is passed as -a for a*S
(`_encode`); the kernel multiplies it out in int64, and the compiler still knows
it divides by a (head_dim 72 in bf16 keeps 16-byte accesses). Constexpr strides
give the compiler exact divisibility and a short argument list, whose packing is
much of the host time of a launch. Triton compiles one kernel per value of the
constexprs, pointer dtypes and 16-byte alignment, and of S's integer width (32 or
64 bits): per call site, one per launch configuration (tuning.py's S buckets). No
eviction hints: measured slower.
"""

import functools
import re
import threading

import torch
import triton
import triton.language as tl


@triton.jit
def _halves(base, s_h, h, half_off, mask, FIRST: tl.constexpr):
    """Pointers and mask for both halves of heads h, the halves axis first ([2, tokens, heads,
    channels]) or last ([tokens, heads, channels, 2]): base points at [tokens, 1, channels] of
    head 0's first half, mask is [tokens, heads, channels]."""
    if FIRST:
        m = mask[None, :, :, :]
        return (base + h * s_h)[None, :, :, :] + tl.arange(0, 2)[:, None, None, None] * half_off, m
    else:
        m = mask[:, :, :, None]
        return (base + h * s_h)[:, :, :, None] + tl.arange(0, 2)[None, None, None, :] * half_off, m


@triton.jit
def _load_halves(base, s_h, h, half_off, mask, REGS_FIRST: tl.constexpr):
    """Both halves of heads h (float32), read by one access: when a half row is not a whole
    number of 32-byte sectors (bf16 head_dim 72: 72 bytes), the sectors it shares with the other
    half then reach the L2 once, not once per half. The halves axis is placed where Triton keeps
    it in each thread's registers (REGS_FIRST, see _REGS_FIRST), as the split needs: placed
    elsewhere, Triton spreads it over lanes and regroups each loaded tile through shared memory,
    whose wait for the tile's data comes before the next tile's loads issue."""
    ptrs, m = _halves(base, s_h, h, half_off, mask, REGS_FIRST)
    x = tl.load(ptrs, mask=m, other=0.0).to(tl.float32)
    if REGS_FIRST:
        x = tl.permute(x, (1, 2, 3, 0))
    return tl.split(x)


@triton.jit
def _load_side(
    x, p, sx_h, sp_h, h, x_half, p_half, mask, READ: tl.constexpr, GRAD_TABLE: tl.constexpr, REGS_FIRST: tl.constexpr
):
    """Halves of heads h of one side: x (when the side is read) and p (when the table needs a
    gradient). What is not read comes back as zeros, which the compiler drops."""
    zero = tl.zeros(mask.shape, tl.float32)
    x1, x2, p1, p2 = zero, zero, zero, zero
    if READ:
        x1, x2 = _load_halves(x, sx_h, h, x_half, mask, REGS_FIRST)
    if GRAD_TABLE:
        p1, p2 = _load_halves(p, sp_h, h, p_half, mask, REGS_FIRST)
    return x1, x2, p1, p2


@triton.jit
def _store_halves(base, s_h, h, half_off, y1, y2, mask, ROW_STORE: tl.constexpr, REGS_FIRST: tl.constexpr):
    """Both halves of heads h, written by one access. ROW_STORE: the halves axis where Triton
    puts it on the lanes rather than in each thread's registers, so that one store instruction
    writes whole rows: with the axis in registers each instruction writes one half of its rows,
    and the 32-byte sectors that two halves share (bf16 head_dim 72: 72-byte halves) go to the L2
    once per half. It costs a register shuffle of the values (see _row_store)."""
    FIRST: tl.constexpr = ROW_STORE != REGS_FIRST
    y = tl.join(y1, y2).to(base.dtype.element_ty)
    if FIRST:
        y = tl.permute(y, (3, 0, 1, 2))
    ptrs, m = _halves(base, s_h, h, half_off, mask, FIRST)
    tl.store(ptrs, y, mask=m)


@triton.jit
def _stride(S, st: tl.constexpr):
    """A stride constexpr as `_encode` writes it: st >= 0 is the stride, -a stands for a*S."""
    if st < 0:
        return tl.cast(S, tl.int64) * (-st)  # S is an int where a caller specialized it
    else:
        return st


STRIDES = (  # stride parameters of rotary_kernel, in order: 3 per [S, H, D] tensor, 2 per table
    "sxq_s",
    "sxq_h",
    "sxq_d",
    "sxk_s",
    "sxk_h",
    "sxk_d",
    "syq_s",
    "syq_h",
    "syq_d",
    "syk_s",
    "syk_h",
    "syk_d",
    "spq_s",
    "spq_h",
    "spq_d",
    "spk_s",
    "spk_h",
    "spk_d",
    "st0_s",
    "st0_d",
    "st1_s",
    "st1_d",
    "sg0_s",
    "sg0_d",
    "sg1_s",
    "sg1_d",
)


@triton.jit(do_not_specialize=["S"])
def rotary_kernel(
    X_q,
    X_k,
    Y_q,
    Y_k,
    P_q,
    P_k,
    T0,
    T1,
    G0,
    G1,
    S,
    HQ: tl.constexpr,
    HK: tl.constexpr,
    HALF: tl.constexpr,
    sxq_s: tl.constexpr,
    sxq_h: tl.constexpr,
    sxq_d: tl.constexpr,
    sxk_s: tl.constexpr,
    sxk_h: tl.constexpr,
    sxk_d: tl.constexpr,
    syq_s: tl.constexpr,
    syq_h: tl.constexpr,
    syq_d: tl.constexpr,
    syk_s: tl.constexpr,
    syk_h: tl.constexpr,
    syk_d: tl.constexpr,
    spq_s: tl.constexpr,
    spq_h: tl.constexpr,
    spq_d: tl.constexpr,
    spk_s: tl.constexpr,
    spk_h: tl.constexpr,
    spk_d: tl.constexpr,
    st0_s: tl.constexpr,
    st0_d: tl.constexpr,
    st1_s: tl.constexpr,
    st1_d: tl.constexpr,
    sg0_s: tl.constexpr,
    sg0_d: tl.constexpr,
    sg1_s: tl.constexpr,
    sg1_d: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_R: tl.constexpr,
    ADJOINT: tl.constexpr,
    ANGLES: tl.constexpr,
    WRITE_Q: tl.constexpr,
    WRITE_K: tl.constexpr,
    GRAD_TABLE: tl.constexpr,
    ROW_STORE: tl.constexpr,
    REGS_FIRST: tl.constexpr,
):
    BLOCK_H: tl.constexpr = BLOCK_R // 2  # heads per side in one chunk
    # Strides of dimensions other than the tokens' may grow with S (see _encode).
    sxq_h, sxq_d, sxk_h, sxk_d = _stride(S, sxq_h), _stride(S, sxq_d), _stride(S, sxk_h), _stride(S, sxk_d)
    syq_h, syq_d, syk_h, syk_d = _stride(S, syq_h), _stride(S, syq_d), _stride(S, syk_h), _stride(S, syk_d)
    spq_h, spq_d, spk_h, spk_d = _stride(S, spq_h), _stride(S, spq_d), _stride(S, spk_h), _stride(S, spk_d)
    st0_d, st1_d, sg0_d, sg1_d = _stride(S, st0_d), _stride(S, st1_d), _stride(S, sg0_d), _stride(S, sg1_d)
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
    xq1, xq2, pq1, pq2 = _load_side(
        xq, pq, sxq_h, spq_h, h, HALF * sxq_d, HALF * spq_d, m_sd & (h < HQ), READ_Q, GRAD_TABLE, REGS_FIRST
    )
    xk1, xk2, pk1, pk2 = _load_side(
        xk, pk, sxk_h, spk_h, h, HALF * sxk_d, HALF * spk_d, m_sd & (h < HK), READ_K, GRAD_TABLE, REGS_FIRST
    )
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
            xq1, xq2, pq1, pq2 = _load_side(
                xq, pq, sxq_h, spq_h, h, HALF * sxq_d, HALF * spq_d, mq, READ_Q, GRAD_TABLE, REGS_FIRST
            )
            xk1, xk2, pk1, pk2 = _load_side(
                xk, pk, sxk_h, spk_h, h, HALF * sxk_d, HALF * spk_d, mk, READ_K, GRAD_TABLE, REGS_FIRST
            )
        if GRAD_TABLE:
            # grad_cos = sum g*p ; grad_sin = sum g*rotate_half(p), rotate_half(p) = (-p2, p1)
            # One reduction per quantity over both sides (masked heads hold zeros): half the
            # cross-lane shuffles of a sum per side.
            gc1 += tl.sum(xq1 * pq1 + xk1 * pk1, axis=1)
            gc2 += tl.sum(xq2 * pq2 + xk2 * pk2, axis=1)
            gs1 -= tl.sum(xq1 * pq2 + xk1 * pk2, axis=1)
            gs2 += tl.sum(xq2 * pq1 + xk2 * pk1, axis=1)
        # The q and k sides are spelled out, not looped over: every load of a chunk, both
        # sides', comes before its stores.
        if WRITE_Q:
            _store_halves(
                Y_q + s3 * syq_s + d3 * syq_d,
                syq_h,
                h,
                HALF * syq_d,
                xq1 * c1b + xq2 * a,
                xq2 * c2b + xq1 * b,
                mq,
                ROW_STORE,
                REGS_FIRST,
            )
        if WRITE_K:
            _store_halves(
                Y_k + s3 * syk_s + d3 * syk_d,
                syk_h,
                h,
                HALF * syk_d,
                xk1 * c1b + xk2 * a,
                xk2 * c2b + xk1 * b,
                mk,
                ROW_STORE,
                REGS_FIRST,
            )

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


def _encode(strides, S):
    """Strides as the kernel's constexprs, which must not change with S: a stride that is
    a multiple of S times the token stride (a dimension laid out outside the tokens, as
    the heads of sdpa's [H, S, D] gradient) becomes -(stride // S), which the kernel
    multiplies back by S (`_stride`). The token stride itself never depends on S."""
    unit = S * abs(strides[0])
    if unit == 0 or max(strides) < unit:  # the common case: nothing outside the tokens
        return strides
    return tuple([strides[0]] + [-(st // S) if st and st % unit == 0 else st for st in strides[1:]])


def _triton_version():
    return tuple(int(n) for n in re.findall(r"\d+", triton.__version__)[:2])


# Where a pointer tile's halves axis (of size 2, after the contiguous channels) must go for
# Triton to keep it in each thread's registers: Triton orders the tile's non-contiguous axes,
# which tie, one way up to 3.6 (the axis last stays in registers) and the other way from 3.7 on
# (first). Elsewhere every loaded tile is regrouped through shared memory, and each regrouping
# waits for its data before the next tile's loads issue: up to 1.6x the time of the kernel
# compiled by Triton 3.9 on the H200 (benchmarks/NOTES.md). tests/test_codegen.py checks it.
_REGS_FIRST = _triton_version() >= (3, 7)


def _row_store(half, itemsize, grad_table):
    """Whole rows per store instruction (see _store_halves) where half rows share sectors and
    no table gradient is computed: faster there, slower with a table gradient, which keeps
    per-half stores (benchmarks/NOTES.md, "Shipped at the stop of fcf609c")."""
    return not grad_table and (half * itemsize) % 32 != 0


def _constexprs(HQ, D, HK, adjoint, layout, config):
    """The kernel's constexprs. `layout` holds, per tensor argument, None (unused) or
    (encoded strides, dtype, 16-byte alignment of its pointer): the strides are constexprs;
    dtypes and alignment only key the compiled kernel (Triton compiles one per value)."""
    cfg = dict(config)
    ndims = (3, 3, 3, 3, 3, 3, 2, 2, 2, 2)  # unused tensors get zero strides
    flat = (st for lay, n in zip(layout, ndims) for st in (lay[0] if lay else (0,) * n))
    y_q, y_k, g0, t1 = layout[2], layout[3], layout[8], layout[7]
    y_dtype = (y_q or y_k or g0)[1]
    return dict(
        HQ=HQ,
        HK=HK,
        HALF=D // 2,
        **dict(zip(STRIDES, flat)),
        BLOCK_S=cfg["BLOCK_S"],
        BLOCK_D=cfg["BLOCK_D"],
        BLOCK_R=cfg["BLOCK_R"],
        ADJOINT=adjoint,
        ANGLES=t1 is None,
        WRITE_Q=y_q is not None,
        WRITE_K=y_k is not None,
        GRAD_TABLE=g0 is not None,
        ROW_STORE=_row_store(D // 2, y_dtype.itemsize, g0 is not None),
        REGS_FIRST=_REGS_FIRST,
        num_warps=cfg["num_warps"],
    )


def _pointer_args(x_q, x_k, y_q, y_k, p_q, p_k, t0, t1, g0, g1):
    """The ten tensors, each unused one replaced by a used tensor of its kind (an output for
    outputs, an input for inputs), so that every argument is valid and inductor, which reads
    what the kernel stores to, sees no input written."""
    y_any = next(t for t in (y_q, y_k, g0) if t is not None)
    return (
        x_q,
        x_k,
        y_q if y_q is not None else y_any,
        y_k if y_k is not None else y_any,
        p_q if p_q is not None else x_q,
        p_k if p_k is not None else x_k,
        t0,
        t1 if t1 is not None else t0,
        g0 if g0 is not None else y_any,
        g1 if g1 is not None else y_any,
    )


_DIRECT = {"ok": True}  # False once this Triton's compiled kernels do not take the direct launch
_JIT = isinstance(rotary_kernel, triton.runtime.JITFunction)  # False under the interpreter


def _direct(kernel, const_args, device):
    """A launcher (grid, device, args: the pointers and S) that calls Triton's compiled
    `kernel` as JITFunction.run does after binding and specializing the arguments, which
    costs more host time than the kernel takes at small S (a training step at a few thousand
    tokens waits on host time). These are Triton internals: None when this Triton lacks them.
    Without launch hooks it goes through torch's launcher where there is one (_static).
    Triton's own launcher, which Triton 3.6 builds with the host's C compiler (0.3 s on the
    H200's host), is built only where it is used: with hooks, or where torch has none."""
    try:
        runtime = triton.knobs.runtime
        runtime.launch_enter_hook, runtime.launch_exit_hook  # noqa: B018 (must exist)
        kernel.packed_metadata, kernel.launch_metadata  # noqa: B018
        current_stream = triton.runtime.driver.active.get_current_stream
    except AttributeError as e:
        _fall_back(e)
        return None
    static = _static(kernel, device)

    def launch(grid, device, args):
        stream = current_stream(device)
        enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
        hooked = _hooked(enter) or _hooked(leave)
        if static is not None and not hooked:
            static(grid, stream, args)
            return
        run = kernel.run  # Triton's launcher: built, and the kernel loaded, at its first use
        args = (*args, *const_args)
        if hooked:  # profilers: Triton's launcher calls them
            meta = kernel.launch_metadata(grid, stream, *args)
            run(grid[0], grid[1], 1, stream, kernel.function, kernel.packed_metadata, meta, enter, leave, *args)
        else:  # Triton's hooks are empty chains by default: calling them costs host time for nothing
            run(grid[0], grid[1], 1, stream, kernel.function, kernel.packed_metadata, None, None, None, *args)

    return launch


def _static(kernel, device):
    """A launch (grid, stream, args) of `kernel` through torch's launcher of compiled Triton
    kernels, the one inductor launches its own with. It loads the cubin from Triton's cache
    itself, takes the runtime arguments alone, not every constexpr, and costs about 6 us per
    launch on the H200's host against 15 for Triton's (benchmarks/NOTES.md). torch internals:
    None where this torch or this kernel does not take it (no such launcher, scratch memory,
    cooperative launch)."""
    try:
        from torch._C import _StaticCudaLauncher

        launch_kernel = _StaticCudaLauncher._launch_kernel
        md = kernel.metadata
        if md.num_ctas != 1 or getattr(md, "launch_cooperative_grid", False) or getattr(md, "launch_pdl", False):
            return None
        types = {"i32": "i", "i64": "l"}
        arg_tys = "".join("O" if t[0] == "*" else types[t] for t in kernel.src.signature.values() if t != "constexpr")
        # Kernels of recent Tritons (3.6, 3.9) take global and profile scratch pointers last: null when unused.
        scratch = [getattr(md, n, None) for n in ("global_scratch_size", "profile_scratch_size")]
        if any(scratch):
            return None
        num_warps, shared = md.num_warps, md.shared
        cubin = next(path for name, path in kernel.metadata_group.items() if name.endswith(".cubin"))
        function = _load(cubin, kernel.name, shared, device)
    except (ImportError, AttributeError, KeyError, StopIteration, RuntimeError):
        return None
    scratch = tuple(None for size in scratch if size is not None)
    arg_tys += "O" * len(scratch)

    def launch(grid, stream, args):
        launch_kernel(function, grid[0], grid[1], 1, num_warps, shared, arg_tys, (*args, *scratch), stream)

    return launch


@functools.cache
def _load(cubin, name, shared, device):
    """The function torch's launcher loads from a cubin file onto a device: once per process, so
    that a plan built again (its cache cleared or full) loads no second copy of the module."""
    from torch._C import _StaticCudaLauncher

    return _StaticCudaLauncher._load_kernel(cubin, name, shared, device)[0]


def _hooked(hook):
    """Whether a launch hook would do something: set, and not an empty HookChain."""
    return hook is not None and getattr(hook, "calls", True) != []


def _fall_back(error):
    """Every launch through rotary_kernel[grid] from now on, with a warning once."""
    if _DIRECT["ok"]:
        import warnings

        warnings.warn(
            f"rope_bwd: this Triton ({triton.__version__}) does not take the direct launch "
            f"({type(error).__name__}: {error}); launching through rotary_kernel[grid], which "
            "costs more host time per call",
            RuntimeWarning,
            stacklevel=5,
        )
    _DIRECT["ok"] = False


@functools.cache
def _start_up():
    """Once per process, before our first compilation. Triton's first compilation in a process
    builds its driver's C utilities (the host's C compiler, 0.3-0.4 s on the H200's host, when
    its cache is empty) and only then hashes its own libraries for its cache key (0.4 s). The
    two are independent: where the driver is not yet up, the hash starts now in a thread and
    runs during the build (triton_key is cached; file reads and hashing release the GIL). The
    thread holds no lock a forked child could need, and ends within the first call."""
    try:
        from triton.runtime.cache import triton_key
    except ImportError:
        return
    if getattr(triton.runtime.driver, "_active", None) is None:
        threading.Thread(target=triton_key, name="rope_bwd: triton_key", daemon=True).start()


class _Plan:
    """One layout's launch: constexprs (the kernel's parameter order too, since the launcher
    takes them) and, once Triton has compiled the kernel, the direct launcher."""

    def __init__(self, consts):
        self.consts = consts
        self.const_args = tuple(consts[n] for n in rotary_kernel.arg_names if n in consts)
        self.block_s = consts["BLOCK_S"]
        self.n_d = triton.cdiv(consts["HALF"], consts["BLOCK_D"])
        self.launch = None  # the direct launcher, once Triton has compiled the kernel
        self.proven = False  # whether it has launched once: until then a failure falls back


@functools.lru_cache(maxsize=1024)
def _plan(HQ, D, HK, adjoint, layout, config, device):
    """The _Plan of a layout, cached: its key holds nothing that changes with S, so the
    cache does not grow with the number of sizes (`device` keys the compiled kernel)."""
    return _Plan(_constexprs(HQ, D, HK, adjoint, layout, config))


def _key(tensors, S):
    """The ten tensors' addresses (0 for None) and their layout (see _constexprs). This key is
    most of the host time of a launch seen before: one pass over the tensors, and _encode only
    for strides that reach past the tokens (the test is _encode's first)."""
    ptrs, layout = [], []
    for t in tensors:
        if t is None:
            ptrs.append(0)
            layout.append(None)
        else:
            p, st = t.data_ptr(), t.stride()
            ptrs.append(p)
            layout.append((st if max(st) < S * st[0] else _encode(st, S), t.dtype, p % 16 == 0))
    return ptrs, tuple(layout)


def _launch(tensors, adjoint, config):
    x_q = tensors[0]
    S, HQ, D = x_q.shape
    if S == 0:
        return
    if type(x_q) is not torch.Tensor:  # traced by torch.compile
        _launch_traced(tensors, adjoint, config)
        return
    ptrs, layout = _key(tensors, S)
    device = x_q.device.index
    plan = _plan(HQ, D, tensors[1].shape[1], adjoint, layout, tuple(config.items()), device)
    grid = (-(-S // plan.block_s), plan.n_d)  # triton.cdiv is a JIT function: slower on the host
    if plan.launch is None and _DIRECT["ok"] and _JIT:
        # Compiled by Triton (its binder, specialization and caches) without a launch, so that
        # the first launch goes through the direct launcher too (see _direct).
        _start_up()
        kernel = rotary_kernel.warmup(*_pointer_args(*tensors), S, grid=grid, **plan.consts)
        plan.launch = _direct(kernel, plan.const_args, device)
    if plan.launch is not None:
        # Addresses as ints: for a tensor the launcher would call data_ptr() again and ask
        # the driver about the pointer (cuPointerGetAttribute), for each of the ten. Unused
        # pointers are null: the kernel's constexpr flags compile their accesses away.
        try:
            plan.launch(grid, device, (*ptrs, S))
            plan.proven = True
            return
        except (AttributeError, TypeError) as e:  # Triton's launcher takes other arguments:
            if plan.proven:  # it raises before it launches
                raise
            _fall_back(e)
            plan.launch = None
    # Triton's path: the interpreter's, and every launch once the direct launch has failed.
    rotary_kernel[grid](*_pointer_args(*tensors), S, **plan.consts)


def _encode_traced(strides, S):
    """_encode for torch.compile's traced tensors, where S and the strides that grow with it
    may be symbolic: such a stride is a*S, whose coefficient sympy reads off. None for a
    symbolic stride of any other form."""
    if isinstance(S, int) and all(isinstance(st, int) for st in strides):
        return _encode(strides, S)
    import sympy

    out = [strides[0]] if isinstance(strides[0], int) else None
    for st in strides[1:] if out is not None else ():
        if isinstance(st, int):  # S is symbolic: an int stride does not depend on it
            out.append(st)
            continue
        ratio = sympy.simplify(st.node.expr / S.node.expr)
        if not (ratio.is_Integer and ratio > 0):
            return None
        out.append(-int(ratio))
    return tuple(out) if out is not None else None


def _launch_traced(tensors, adjoint, config):
    """The launch for torch.compile's tracing (fake or functional tensors; head counts and
    head_dim ints, S may be symbolic): through torch.library.wrap_triton, so that inductor
    sees the kernel and launches it from its generated code, with no Python op left on the
    step's host path. Called with real tensors (a triton_op run eagerly), it is Triton's
    own launch. Strides are encoded as eager launches encode them, so the transposed
    upstream gradient (head stride S*D) is read in place, S symbolic or not; an input with
    a symbolic stride of another form is copied to contiguous strides first."""
    from torch.library import wrap_triton

    x_q, x_k, y_q, y_k, p_q, p_k, t0, t1, g0, g1 = tensors
    S, HQ, D = x_q.shape
    x_q, x_k, p_q, p_k, t0, t1 = (
        t if t is None or _encode_traced(t.stride(), S) is not None else t.contiguous()
        for t in (x_q, x_k, p_q, p_k, t0, t1)
    )
    tensors = (x_q, x_k, y_q, y_k, p_q, p_k, t0, t1, g0, g1)
    # No pointer alignment in the key: traced tensors have no address (inductor specializes).
    layout = tuple(None if t is None else (_encode_traced(t.stride(), S), t.dtype, None) for t in tensors)
    consts = _constexprs(HQ, D, x_k.shape[1], adjoint, layout, tuple(config.items()))
    grid = (triton.cdiv(S, consts["BLOCK_S"]), triton.cdiv(D // 2, consts["BLOCK_D"]))
    wrap_triton(rotary_kernel)[grid](*_pointer_args(*tensors), S, **consts)


def launch_fwd(q, k, table, sin, q_out, k_out, *, config):
    """q_out, k_out = q, k rotated by the table: angles when sin is None, else (cos, sin).
    q [S, HQ, D], k [S, HK, D], table and sin [S, D]; any strides and float dtypes (math in
    float32, each output stored in its own dtype). `config` holds BLOCK_S, BLOCK_D,
    BLOCK_R, num_warps (see tuning.py). Runs on the current device."""
    _launch((q, k, q_out, k_out, None, None, table, sin, None, None), False, config)


def launch_bwd(gq, gk, table, sin, *, dq=None, dk=None, q=None, k=None, dtable=None, dsin=None, config):
    """The backward: dq, dk (the adjoint rotation of the upstream gradients gq, gk) where
    given; with q and k given, the table's gradient: into dtable (angles: grad embeddings;
    cos/sin: grad cos) and dsin (grad sin). What is not given is neither read nor written."""
    _launch((gq, gk, dq, dk, q, k, table, sin, dtable, dsin), True, config)
