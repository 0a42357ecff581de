"""Launches of kernel.rotary_kernel: the configuration, the constexprs, the grid.

Compiled once per layout, never per sequence length or batch size: the runtime arguments are the
pointers and seq_len, the batch is the grid's, and a stride that grows with S (the heads of sdpa's
[B, H, S, D] gradient seen as [B, S, H, D], the batch of most tensors) is passed as the constexpr
-a for a*S (`encode_strides`). Eager calls find their _Route by the call's signature (one dict
lookup), its plan cached by layout, and launch through fast_launch where it works, else through
`rotary_kernel[grid]`; calls traced by torch.compile through wrap_triton.
"""

import functools

import torch
import triton

from . import fast_launch, tuning
from .kernel import rotary_kernel
from .rotary_torch import INTERLEAVED, LAST, PAIR_TABLE

# Where a tile's pair axis (of size 2, after the contiguous channels) stays in each thread's registers
# (kernel._load_pairs): up to Triton 3.6 the last of two tied axes, from 3.7 the first.
REGS_FIRST = tuning.version_tuple(tuning.triton_version()) >= (3, 7)

TENSORS = ("in_q", "in_k", "out_q", "out_k", "q", "k", "table", "sin", "grad_table", "grad_sin")
_JIT = isinstance(rotary_kernel, triton.runtime.JITFunction)  # False under the interpreter
_ROUTES = {}  # a call's signature -> its _Route


def launch_fwd(
    *, q, k, q_out, k_out, cos=None, sin=None, angles=None, pairs=False, config=None, heads_first=False,
    route=None,
):  # fmt: skip
    """q_out, k_out = q, k rotated by (cos, sin), or by the cos/sin of `angles` (or of cos without sin).

    q [(B,) S, HQ, D], k [(B,) S, HK, D], tables [(B or 1,) S, R], R even, R <= D (channels R..
    pass through), any strides; float32/bfloat16/float16, math in float32, each output in its own
    dtype. pairs: rotary_torch's flags. config: {BLOCK_S, BLOCK_D, BLOCK_R, num_warps}, or None for
    tuning.get_config's. heads_first: q, k and their outputs [B, H, S, D], read with no view made.

    Returns the launch's _Route (None where nothing was launched, or traced). Given back as `route`
    with tensors of the call's dtypes and layouts (views in another order serve), it launches on their
    addresses alone, or launches nothing and returns None where an alignment differs."""
    table = angles if angles is not None else cos
    tensors = (q, k, q_out, k_out, None, None, table, sin, None, None)
    return _launch(tensors, False, pairs, config, heads_first, route)


def launch_bwd(
    *, grad_q_embed, grad_k_embed, grad_q=None, grad_k=None, q=None, k=None, cos=None, sin=None, angles=None,
    grad_cos=None, grad_sin=None, grad_angles=None, pairs=False, config=None, heads_first=False,
):  # fmt: skip
    """The backward of launch_fwd: grad_q, grad_k (the adjoint rotation of the upstream gradients)
    where given; with q and k given, the table gradient into grad_angles or grad_cos and grad_sin
    ([B, S, R] when q is batched). What is not given is neither read nor written."""
    table = angles if angles is not None else cos
    grad_table = grad_angles if angles is not None else grad_cos
    tensors = (grad_q_embed, grad_k_embed, grad_q, grad_k, q, k, table, sin, grad_table, grad_sin)
    _launch(tensors, True, pairs, config, heads_first)


def _launch(tensors, adjoint, pairs, config, heads_first=False, route=None):
    x_q = tensors[0]
    if type(x_q) is not torch.Tensor:  # traced: nothing to give back
        return _launch_traced(tensors, adjoint, pairs, config, heads_first)
    device = x_q.device
    if device.type == "cuda" and _several_gpus() and device.index != torch.cuda.current_device():
        with torch.cuda.device(device):  # Triton launches on the current device
            return _launch(tensors, adjoint, pairs, config, heads_first, route)
    if route is None:
        route, ptrs = _route(tensors, adjoint, pairs, config, heads_first)
    else:
        ptrs = [0 if t is None else t.data_ptr() for t in tensors]
        if tuple([p % 16 == 0 for p in ptrs]) != route.aligned:  # the caller's tensors may be other views:
            return None  # no lookup on them
    if route is not None:
        route.run(tensors, ptrs)
    return route


def _route(tensors, adjoint, pairs, config, heads_first):
    """(the _Route of a call, None for no tokens; the tensors' addresses, 0 for None). Cached by the
    call's signature (shapes, strides, dtypes, 16-byte alignment), unless the configuration is
    given (the tuner's); its plan by what does not change with S (_layout). A new signature is read
    from that key's tuples, not the tensors: its host time stays that of the lookup it replaces."""
    ptrs, sig = [], [adjoint, pairs, heads_first, tensors[0].device]
    for t in tensors:  # one pass: host time
        p = 0 if t is None else t.data_ptr()
        ptrs.append(p)
        # plain tuples (a torch.Size stays tracked): the garbage collector drops a cached key, of
        # ints alone, from its lists, and a new S's key does not bring on its full collections
        sig.append(t if t is None else (tuple(t.shape), t.stride(), t.dtype, p % 16 == 0))
    sig = tuple(sig)
    route = _ROUTES.get(sig) if config is None else None
    if route is not None:
        return route, ptrs
    metas = sig[4:]
    if heads_first:  # [B, H, S, D] read as the kernel's [B, S, H, D]
        metas = [m if m is None or i >= 6 else (*((x[0], x[2], x[1], x[3]) for x in m[:2]), *m[2:])
                 for i, m in enumerate(metas)]  # fmt: skip
    sized = _sized(metas, adjoint, config, tensors[0].device)
    if sized is None:
        return None, ptrs
    B, S, sizes, chosen = sized
    plan = _plan(*sizes, adjoint, pairs, _layout(metas, S), chosen, tensors[0].device.index)
    route = _Route(plan, plan.grid(B, S), S, tuple([p % 16 == 0 for p in ptrs]))
    if config is None:
        if len(_ROUTES) >= 1024:  # bounded: a new size costs one full lookup, not memory
            _ROUTES.clear()
        _ROUTES[sig] = route
    return route, ptrs


def _sized(metas, adjoint, config, device):
    """(B, S, (HQ, HK, D, R), the configuration's items), None for no tokens; metas: per tensor None or
    (shape, strides, dtype, ...), in the kernel's order. A trace's symbolic HQ, HK, D, R are specialized;
    no config: tuning.get_config's, B, S and q's strides read as hints (sdpa's gradient has its own)."""
    (shape, strides, dtype), k, table = metas[0][:3], metas[1][0], metas[6][0]
    B, S = (shape[0], shape[1]) if len(shape) == 4 else (1, shape[0])
    if S == 0 or B == 0:
        return None
    HQ, HK, D, R = sizes = (int(shape[-2]), int(k[-2]), int(shape[-1]), int(table[-1]))
    if not config:
        mode = "fwd" if not adjoint else ("bwd" if metas[8] is not None else "bwd_qk")
        hint, st_s, st_h = (_size_hint(n) for n in (S, strides[-3], strides[-2]))
        layout = "sdpa" if adjoint and _outside(hint, HQ, st_s, st_h) else ""
        config = tuning.get_config(mode, _size_hint(B) * hint, HQ, HK, R, dtype.itemsize, device, layout)
    return B, S, sizes, tuple(config.items())


class _Route:
    """The launch of every call of one signature: the plan, grid and seq_len, and which of the
    ten addresses were 16-byte aligned (the plan's kernel is compiled for that)."""

    __slots__ = ("plan", "grid", "S", "aligned")

    def __init__(self, plan, grid, S, aligned):
        self.plan, self.grid, self.S, self.aligned = plan, grid, S, aligned

    def run(self, tensors, ptrs):
        """Launches on the tensors (read for their addresses and dtypes) at ptrs, their addresses."""
        plan, grid, S = self.plan, self.grid, self.S
        if plan.fast is None and fast_launch.ENABLED and _JIT:
            fast_launch.start_up()
            compiled = rotary_kernel.warmup(*_pointer_args(tensors), S, grid=grid, **plan.consts)
            plan.fast = fast_launch.launcher(compiled, plan.const_args, tensors[0].device.index) or False
        if plan.fast:
            # Addresses as ints: for tensors the launcher would ask the driver about each pointer.
            try:
                plan.fast(grid, (*ptrs, S))
                plan.proven = True
                return
            except (AttributeError, TypeError) as e:  # a launcher that takes other arguments raises
                if plan.proven:  # before it launches
                    raise
                fast_launch.warn(e)
                plan.fast = False
        rotary_kernel[grid](*_pointer_args(tensors), S, **plan.consts)


@functools.cache
def _several_gpus() -> bool:
    return torch.cuda.device_count() > 1


def _size_hint(n) -> int:
    """An int for a size that may be symbolic, without adding a guard: what S is expected to be
    when choosing a configuration (every configuration is correct for every S)."""
    if isinstance(n, int):
        return n
    hint = n.node.hint
    return hint if isinstance(hint, int) else 4096


def _outside(S, H, st_s, st_h) -> bool:
    """Whether heads lie outside the tokens, as in sdpa's gradient."""
    return S > 1 and H > 1 and st_h >= S * st_s > 0


def _roles(shape, st, heads: bool) -> tuple:
    """Strides by role, the tokens' first: (seq, batch, head, dim) of q-like tensors ([(B,) S, H,
    D]), (seq, batch, dim) of tables ([(B,) S, R]); batch 0 for one sequence or one table for all."""
    n = 3 if heads else 2
    return (st[-n], st[0] if len(shape) > n and shape[0] != 1 else 0, *st[-n + 1 :])


def encode_strides(strides, S):
    """Strides as constexprs that do not change with S: a stride that is a multiple of S token
    strides (a dimension laid out outside the tokens) becomes -(stride // S). The token stride
    (strides[0]) itself never depends on S."""
    unit = S * abs(strides[0])
    if unit == 0 or max(strides) < unit:  # nothing outside the tokens
        return tuple(strides)
    return tuple([strides[0]] + [-(st // S) if st and st % unit == 0 else st for st in strides[1:]])


def _encode_traced(strides, S):
    """encode_strides where S and the strides growing with it may be symbolic (a*S: sympy reads
    off a); None for a symbolic stride of another form."""
    # ints where they are, or symbols with a known value (specialized sizes); else None
    ints = [n if isinstance(n, int) else int(n.node.expr) if n.node.expr.is_number else None for n in (S, *strides)]
    if None not in ints:
        return encode_strides(ints[1:], ints[0])
    import sympy

    if ints[1] is None:
        return None
    out = [ints[1]]
    for st, n in zip(strides[1:], ints[2:]):
        if n is None:
            n = sympy.simplify(st.node.expr / S.node.expr)
            if not (n.is_Integer and n > 0):
                return None
            n = -int(n)
        out.append(n)
    return tuple(out)


def _layout(metas, S, encode=encode_strides):
    """Per tensor None or (encoded strides by role, dtype, 16-byte alignment where known), of its metas."""
    return tuple(m if m is None else (encode(_roles(m[0], m[1], i < 6), S), *m[2:]) for i, m in enumerate(metas))


def _pointer_args(tensors):
    """The ten tensors, each unused one replaced by a used tensor of its kind (an output for
    outputs, an input for inputs): every argument is valid, and inductor, which reads what the
    kernel stores to, sees no input written. The constexpr flags compile their accesses away."""
    x_q, x_k, y_q, y_k, _, _, t0, _, g0, _ = tensors
    y = next(t for t in (y_q, y_k, g0) if t is not None)
    return tuple(t if t is not None else f for t, f in zip(tensors, (x_q, x_k, y, y, x_q, x_k, t0, t0, y, y)))


def _constexprs(HQ, HK, D, R, adjoint, pairs, layout, config):
    """The kernel's constexprs; layout: per tensor None (unused) or (encoded strides, dtype, ...)."""
    cfg = dict(config)
    strides = {}
    for i, (name, lay) in enumerate(zip(TENSORS, layout)):
        roles = ("seq", "batch", "head", "dim") if i < 6 else ("seq", "batch", "dim")
        for role, st in zip(roles, lay[0] if lay else (0,) * len(roles)):
            strides[f"stride_{name}_{role}"] = st
    out_q, out_k, grad_table, sin = layout[2], layout[3], layout[8], layout[7]
    out_dtype = (out_q or out_k or grad_table)[1]
    # Whole rows per store instruction where half rows share 32-byte sectors and no table
    # gradient is computed (with one, per-half stores are faster).
    half = R if pairs & PAIR_TABLE else R // 2
    row_store = grad_table is None and not pairs & INTERLEAVED and (half * out_dtype.itemsize) % 32 != 0
    tail = D - 2 * half
    return dict(
        HQ=HQ, HK=HK, HALF=half, TAIL=tail, BLOCK_TAIL=triton.next_power_of_2(tail) if tail else 0, **strides,
        BLOCK_S=cfg["BLOCK_S"], BLOCK_D=cfg["BLOCK_D"], BLOCK_R=cfg["BLOCK_R"], ADJOINT=adjoint, ANGLES=sin is None,
        INTERLEAVED=bool(pairs & INTERLEAVED), PAIR_TABLE=bool(pairs & PAIR_TABLE), LAST=bool(pairs & LAST),
        WRITE_Q=out_q is not None, WRITE_K=out_k is not None, GRAD_TABLE=grad_table is not None,
        BATCHED=any(v != 0 for n, v in strides.items() if n.endswith("_batch")), ROW_STORE=row_store,
        REGS_FIRST=REGS_FIRST, num_warps=cfg["num_warps"],
    )  # fmt: skip


class _Plan:
    """One layout's launch: the constexprs (also in the kernel's parameter order, as Triton's
    launcher takes them) and, once compiled, the fast launcher (False where there is none)."""

    def __init__(self, consts):
        self.consts = consts
        self.const_args = tuple(consts[n] for n in rotary_kernel.arg_names if n in consts)
        self.block_s = consts["BLOCK_S"]
        self.n_blocks = triton.cdiv(consts["HALF"], consts["BLOCK_D"])
        self.fast = None
        self.proven = False  # launched once: until then a failing fast launch falls back

    def grid(self, B, S):
        return (B * ((S + self.block_s - 1) // self.block_s), self.n_blocks)  # triton.cdiv: slower on the host


@functools.lru_cache(maxsize=1024)
def _plan(HQ, HK, D, R, adjoint, pairs, layout, config, device):
    """The _Plan of a layout: nothing in its key changes with S (`device` keys the compiled kernel)."""
    return _Plan(_constexprs(HQ, HK, D, R, adjoint, pairs, layout, config))


def _launch_traced(tensors, adjoint, pairs, config, heads_first):
    """The launch under torch.compile, through wrap_triton (inductor launches the kernel from its
    generated code). S may be symbolic, the other sizes are specialized; an input with a symbolic
    stride that is not a multiple of S is made contiguous first."""
    from torch.library import wrap_triton

    if heads_first:  # q-like tensors [B, H, S, D] seen as the kernel's [B, S, H, D]
        tensors = tuple(t if t is None or i >= 6 else t.transpose(-3, -2) for i, t in enumerate(tensors))

    def metas():  # of the tensors as they are when called
        return [t if t is None else (t.shape, tuple(t.stride()), t.dtype) for t in tensors]

    sized = _sized(metas(), adjoint, config, tensors[0].device)
    if sized is None:
        return
    B, S, sizes, config = sized
    kept = lambda i, t: t is None or i in (2, 3, 8, 9) or _encode_traced(_roles(t.shape, t.stride(), i < 6), S)
    tensors = [t if kept(i, t) else t.contiguous() for i, t in enumerate(tensors)]
    # int(pairs): the flags are constexprs; where one compiled layer code served a variant of other
    # flags, dynamo passes them symbolic (automatic dynamic): specialized, guarded by value
    plan = _plan(*sizes, adjoint, int(pairs), _layout(metas(), S, _encode_traced), config, tensors[0].device.index)
    wrap_triton(rotary_kernel)[plan.grid(B, S)](*_pointer_args(tensors), S, **plan.consts)
