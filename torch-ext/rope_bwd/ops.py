"""The custom ops, their autograd, and the public functions. Ops (add_op_namespace_prefix'd, so
that several builds load in one process), `table` the angles when `sin` is None, else cos, `pairs`
rotary_torch's flags, outputs not asked for empty:
    rotary_fwd(q, k, table, sin?, pairs) -> (q_embed, k_embed)
    rotary_bwd(gq, gk, q?, k?, table, sin?, need_q, need_k, pairs) -> (dq, dk, dtable, dsin)
    rope_bwd_out(..., interleaved)   the backward of rope_fwd written into the caller's buffers
The first two are triton_ops (torch.compile traces into them). Eager calls take EagerRotary (no
dispatcher round trip), torch.func transforms and higher derivatives RotaryFn and RotaryGrad
(derivatives.py's rules). CUDA tensors run the kernel, CPU and float64 rotary_torch.
"""

import functools
import logging
import os
import warnings
from typing import Optional

import torch
from torch import Tensor

from . import derivatives, rotary_torch
from ._ops import add_op_namespace_prefix
from .validation import check_inputs, check_out, check_out_autograd, check_out_memory

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
_OUT_AND_INPUTS = ("grad_q", "grad_k", "grad_embeddings", "grad_q_embed", "grad_k_embed", "q", "k", "embeddings")
_SEEN = {}  # _signature of the rotary_calls that passed the checks -> their _Relaunch


def _use_triton(q: Tensor, k: Tensor, table: Tensor) -> bool:
    """CUDA tensors run the kernel where Triton runs (_triton_runs_on); eager CPU tensors too under
    TRITON_INTERPRET=1. float64 runs rotary_torch: the kernel computes in float32."""
    if torch.float64 in (q.dtype, k.dtype, table.dtype):
        return False
    return _triton_runs_on(q.device) if q.is_cuda else _INTERPRET and type(q) is Tensor


@functools.cache
def _triton_runs_on(device: torch.device) -> bool:
    """Whether Triton imports and the GPU's capability is one build.toml declares ("8.0+PTX":
    8.0 and later). Else the GPU's tensors take rotary_torch, and a warning says why, once."""
    try:
        import triton  # noqa: F401
    except ImportError:
        reason = "Triton is not installed"
    else:
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) >= (8, 0):
            return True
        reason = f"CUDA capability {major}.{minor} is below 8.0, the oldest Triton supports"
    warnings.warn(f"rope-bwd: {reason}: {device} runs the PyTorch path, not the Triton kernel", stacklevel=2)
    return False


@functools.cache
def _launch():
    from . import launch  # on first kernel use: CPU-only machines need no Triton

    return launch


def _empty_like(t: Tensor, heads_first=False) -> Tensor:
    """An output for t, contiguous in the kernel's [(B,) S, H, D] order, made in t's order for t
    [B, H, S, D] (heads_first): a view would cost host time, and a Function's output may not be one."""
    if not heads_first:
        return torch.empty_like(t, memory_format=torch.contiguous_format)
    _, H, S, D = t.shape
    return torch.empty_strided(t.shape, (S * H * D, D, H * D, 1), dtype=t.dtype, device=t.device)


def _swap_heads(*tensors):
    """[B, H, S, D] tensors as [B, S, H, D] and back; anything else (None, an op's empty output) stays."""
    return [t.transpose(-3, -2) if isinstance(t, Tensor) and t.dim() == 4 else t for t in tensors]


def forward_impl(q, k, table, sin, pairs, heads_first=False):
    """(q_embed, k_embed); heads_first: q and k [B, H, S, D], and so the results."""
    return _forward(q, k, table, sin, pairs, heads_first)[:2]


def _forward(q, k, table, sin, pairs, heads_first=False):
    """(q_embed, k_embed, the kernel's launch._Route, None on the PyTorch path or with a prefix)."""
    heads = -3 if heads_first else -2
    if not _use_triton(q, k, table):
        return (*rotary_torch.forward(q, k, table, sin, pairs, heads), None)
    q_embed, k_embed = _empty_like(q, heads_first), _empty_like(k, heads_first)
    n = rotary_torch.prefix(q, table, heads)
    x_q, x_k, y_q, y_k = _pass_prefix(n, heads, (q, q_embed), (k, k_embed)) if n else (q, k, q_embed, k_embed)
    # cos without sin: launch.py reads it as the angles
    route = _launch().launch_fwd(q=x_q, k=x_k, q_out=y_q, k_out=y_k, cos=table, sin=sin, pairs=pairs,
                                 heads_first=heads_first)  # fmt: skip
    return q_embed, k_embed, None if n else route


def _pass_prefix(n, heads, *pairs_in_out):
    """Copies the first n tokens (those the table does not cover) of each (input, output) pair to
    the output; returns the rest of the inputs, then of the outputs: the views the kernel rotates."""
    for x, y in pairs_in_out:
        if x is not None and y is not None:
            rotary_torch.tokens(y, n, heads)[0].copy_(rotary_torch.tokens(x, n, heads)[0])
    rest = [[None if t is None else rotary_torch.tokens(t, n, heads)[1] for t in side] for side in zip(*pairs_in_out)]
    return (*rest[0], *rest[1])


def backward_impl(gq, gk, q, k, table, sin, need_q, need_k, pairs, out=None, heads_first=False):
    """(dq, dk, dtable, dsin), None where not asked for; the table gradient when q is given.
    out: the caller's (dq, dk, dtable) to write instead (rope_bwd_out: angles, all asked for).
    heads_first: gq, gk, q and k [B, H, S, D], and so dq and dk."""
    heads = -3 if heads_first else -2
    if not _use_triton(gq, gk, table):
        grads = rotary_torch.backward(gq, gk, q, k, table, sin, need_q, need_k, pairs, heads)
        return grads if out is None else (*(o.copy_(g) for o, g in zip(out, grads)), None)
    grad_table = q is not None
    dq, dk, dt = out or (
        _empty_like(gq, heads_first) if need_q else None,
        _empty_like(gk, heads_first) if need_k else None,
        _grad_rows(table, gq) if grad_table else None,
    )
    ds = _grad_rows(sin, gq) if grad_table and sin is not None else None
    n = rotary_torch.prefix(gq, table, heads)
    g_q, g_k, x_q, x_k, d_q, d_k = (
        _pass_prefix(n, heads, (gq, dq), (gk, dk), (q, None), (k, None))[:6] if n else (gq, gk, q, k, dq, dk)
    )
    _launch().launch_bwd(grad_q_embed=g_q, grad_k_embed=g_k, grad_q=d_q, grad_k=d_k, q=x_q, k=x_k, cos=table, sin=sin,
                         grad_cos=dt, grad_sin=ds, pairs=pairs, heads_first=heads_first)  # fmt: skip
    # A table shared by a batch: the kernel's per-sequence rows summed, in a fixed order.
    dt, ds = (g if g is None or g.shape == t.shape else g.sum(0, keepdim=True) for g, t in ((dt, table), (ds, sin)))
    return dq, dk, dt, ds


def _grad_rows(table: Tensor, gq: Tensor) -> Tensor:
    """The kernel's buffer for a table's gradient: [B, S, R] for a table [1, S, R] shared by B."""
    if gq.dim() == 4 and table.shape[0] != gq.shape[0]:
        return table.new_empty((gq.shape[0], *table.shape[1:]))
    return _empty_like(table)


def _triton_op(name):
    """torch.library.triton_op(<namespace>::name), without the warning it logs where Triton
    cannot be imported (CPU machines need none)."""

    def define(fn):
        log = logging.getLogger("torch._library.triton")
        level = log.level
        log.setLevel(logging.ERROR)
        try:
            return torch.library.triton_op(add_op_namespace_prefix(name), mutates_args=())(fn)
        finally:
            log.setLevel(level)

    return define


@_triton_op("rotary_fwd")
def rotary_fwd(q: Tensor, k: Tensor, table: Tensor, sin: Optional[Tensor], pairs: int) -> tuple[Tensor, Tensor]:
    return forward_impl(q, k, table, sin, pairs)


# torch.library reads the op's schema from the full signature.
@_triton_op("rotary_bwd")
def rotary_bwd(
    gq: Tensor, gk: Tensor, q: Optional[Tensor], k: Optional[Tensor], table: Tensor, sin: Optional[Tensor],
    need_q: bool, need_k: bool, pairs: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    outs = backward_impl(gq, gk, q, k, table, sin, need_q, need_k, pairs)
    return tuple(o if o is not None else like.new_empty((0,)) for o, like in zip(outs, (gq, gk, table, table)))


@torch.library.custom_op(add_op_namespace_prefix("rope_bwd_out"), mutates_args=("grad_q", "grad_k", "grad_embeddings"))
def rope_bwd_out(
    grad_q_embed: Tensor, grad_k_embed: Tensor, q: Tensor, k: Tensor, embeddings: Tensor, grad_q: Tensor,
    grad_k: Tensor, grad_embeddings: Tensor, interleaved: bool = False,
) -> None:  # fmt: skip
    outs, ins = (grad_q, grad_k, grad_embeddings), (grad_q_embed, grad_k_embed, q, k, embeddings)
    check_out_memory("rope_bwd", [*zip(_OUT_AND_INPUTS[:3], outs)], [*zip(_OUT_AND_INPUTS[3:], ins)])
    backward_impl(*ins[:4], embeddings, None, True, True, interleaved, outs)


@rope_bwd_out.register_fake
def _(grad_q_embed, grad_k_embed, q, k, embeddings, grad_q, grad_k, grad_embeddings, interleaved=False):
    return None


# ------------------------------------------------------------------ autograd


def setup_context(ctx, inputs, output, bwd=rotary_bwd, heads_first=False):
    """The context of rotary_fwd's autograd; bwd: the backward to run where no graph is recorded."""
    q, k, table, sin, ctx.pairs = inputs
    table_grad = ctx.needs_input_grad[2] or (sin is not None and ctx.needs_input_grad[3])
    # q and k are saved only for the table's gradient (the real models' cos/sin, buffers, need none)
    ctx.save_for_backward(q if table_grad else None, k if table_grad else None, table, sin)
    ctx.bwd, ctx.heads_first = bwd, heads_first


def backward(ctx, gq, gk):
    q, k, table, sin = ctx.saved_tensors
    need_q, need_k, need_table, need_sin = ctx.needs_input_grad[:4]
    args = (gq, gk, q, k, table, sin, need_q, need_k, ctx.pairs)
    # Under create_graph grad mode is on: the gradients then carry a graph of their own.
    if torch.is_grad_enabled():
        dq, dk, dt, ds = rotary_grad(*args, heads_first=ctx.heads_first)
    else:
        dq, dk, dt, ds = ctx.bwd(*args, heads_first=True) if ctx.heads_first else ctx.bwd(*args)
    return dq if need_q else None, dk if need_k else None, dt if need_table else None, ds if need_sin else None, None


def _maps(pairs):
    """derivatives.py's F and B, differentiable."""
    return (lambda *args: rotary(*args, pairs), lambda *args: rotary_grad(*args, pairs))


class RotaryFn(torch.autograd.Function):
    """The rotation for torch.func transforms and forward-mode AD, which need setup_context and
    jvp and vmap rules (eager calls take EagerRotary, whose context costs less host time)."""

    @staticmethod
    def forward(q, k, table, sin, pairs):
        return forward_impl(q, k, table, sin, pairs)

    @staticmethod
    def setup_context(ctx, inputs, output):
        setup_context(ctx, inputs, output, rotary_grad)  # the transforms run the backward on wrapped tensors
        ctx.save_for_forward(*inputs[:4])

    backward = staticmethod(backward)

    @staticmethod
    def jvp(ctx, tq, tk, t_table, t_sin, t_pairs):
        return derivatives.rotation_jvp(_maps(ctx.pairs)[0], *ctx.saved_tensors, tq, tk, t_table, t_sin)

    @staticmethod
    def vmap(info, in_dims, q, k, table, sin, pairs):
        return derivatives.vmap_folded(_maps(pairs)[0], info.batch_size, in_dims[:4], (q, k, table, sin))


def grad_setup_context(ctx, inputs, output):
    *saved, ctx.need_q, ctx.need_k, ctx.pairs = inputs
    ctx.save_for_backward(*saved)


def grad_backward(ctx, vq, vk, v_table, v_sin):
    F, B = _maps(ctx.pairs)
    cot = (vq, vk, v_table, v_sin)
    grads = derivatives.adjoint_vjp(F, B, ctx.saved_tensors, ctx.need_q, ctx.need_k, ctx.needs_input_grad[:6], cot)
    return (*grads, None, None, None)


class RotaryGrad(torch.autograd.Function):
    """The backward as a differentiable function: backward_impl, derivatives.py's rules for its
    backward, jvp and vmap."""

    @staticmethod
    def forward(gq, gk, q, k, table, sin, need_q, need_k, pairs):
        return backward_impl(gq, gk, q, k, table, sin, need_q, need_k, pairs)

    @staticmethod
    def setup_context(ctx, inputs, output):
        grad_setup_context(ctx, inputs, output)
        ctx.save_for_forward(*inputs[:6])

    backward = staticmethod(grad_backward)

    @staticmethod
    def jvp(ctx, *tangents):
        return derivatives.adjoint_jvp(_maps(ctx.pairs)[1], ctx.saved_tensors, ctx.need_q, ctx.need_k, tangents[:6])

    @staticmethod
    def vmap(info, in_dims, gq, gk, q, k, table, sin, need_q, need_k, pairs):
        B = _maps(pairs)[1]
        return derivatives.vmap_folded(B, info.batch_size, in_dims[:6], (gq, gk, q, k, table, sin), need_q, need_k)


def transforms_active() -> bool:
    """torch.func transforms or a forward-mode AD level are live."""
    return torch._C._are_functorch_transforms_active() or torch.autograd.forward_ad._current_level >= 0


rotary_fwd.register_autograd(backward, setup_context=setup_context)
rotary_bwd.register_autograd(grad_backward, setup_context=grad_setup_context)


class EagerRotary(torch.autograd.Function):
    """rotary_fwd with its autograd minus the dispatcher, for eager calls; heads_first: q and k
    [B, H, S, D], read with no view. The context is set in forward: a separate setup_context
    binds every apply()'s arguments through inspect."""

    @staticmethod
    def forward(ctx, q, k, table, sin, pairs, heads_first):
        out = forward_impl(q, k, table, sin, pairs, heads_first)
        setup_context(ctx, (q, k, table, sin, pairs), out, backward_impl, heads_first)
        return out

    @staticmethod
    def backward(ctx, gq, gk):
        return (*backward(ctx, gq, gk), None)


def rotary(q, k, table, sin, pairs, heads_first=False):
    """The differentiable rotation, through the cheapest path the caller's mode allows.
    heads_first: q and k [B, H, S, D] (the decoders' attention views), and so the results."""
    if type(q) is Tensor and not torch.compiler.is_compiling():
        if _untracked(q, k, table, sin):  # as Function.apply would: no node to record
            return forward_impl(q, k, table, sin, pairs, heads_first)
        if not transforms_active():
            return EagerRotary.apply(q, k, table, sin, pairs, heads_first)
        fn = RotaryFn.apply
    else:
        fn = rotary_fwd
    if heads_first:
        return tuple(_swap_heads(*fn(*_swap_heads(q, k), table, sin, pairs)))
    return fn(q, k, table, sin, pairs)


def _untracked(*tensors) -> bool:
    """Whether autograd records nothing of a call on these tensors (None where absent) and no
    torch.func transform or forward-mode AD level is live: the forward alone serves."""
    recorded = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
    return not recorded and not transforms_active()


def rotary_grad(gq, gk, q, k, table, sin, need_q, need_k, pairs, heads_first=False):
    """The differentiable backward (create_graph, transforms): (dq, dk, dtable, dsin);
    heads_first as for rotary (the graph records the views)."""
    if heads_first:
        dq, dk, dt, ds = rotary_grad(*_swap_heads(gq, gk, q, k), table, sin, need_q, need_k, pairs)
        return (*_swap_heads(dq, dk), dt, ds)
    if type(gq) is Tensor and not torch.compiler.is_compiling():
        return RotaryGrad.apply(gq, gk, q, k, table, sin, need_q, need_k, pairs)
    return rotary_bwd(gq, gk, q, k, table, sin, need_q, need_k, pairs)


# ------------------------------------------------------------------ public functions

_DTYPES = """Dtypes: float32, bfloat16 and float16 run the kernel with math in float32; float64 runs
    the PyTorch path in float64 on any device. q and k may differ in dtype (as in transformers):
    each result has the dtype of the tensor it is the value or gradient of.

    Raises:
        ValueError / TypeError naming the argument (rank, sizes, dtype, device), before any kernel
        runs or output is written."""


def rope_fwd(q: Tensor, k: Tensor, embeddings: Tensor, *, interleaved: bool = False) -> tuple[Tensor, Tensor]:
    """Rotate q and k by the angles `embeddings`: q * cos + rotate_half(q) * sin, same for k.

    Args:
        q, k: [S, HQ, D] and [S, HK, D], any strides (views of one qkv projection serve); D even,
            at most 512.
        embeddings: [S, R] angles, R even and at most D (R < D: the first R channels of each
            head are rotated, the rest pass through); cos and sin are taken per element.
        interleaved: rotate the pairs (2i, 2i + 1) (rotate_pairwise); default (i, i + R/2)
            (rotate_half).

    Returns:
        (q_embed, k_embed), contiguous, shaped and typed as q and k. Differentiable in q, k and
        embeddings to any order, under torch.func transforms and forward-mode AD.

    {dtypes}
    """
    check_inputs("rope_fwd", [("q", q), ("k", k)], [("embeddings", embeddings)])
    return rotary(q, k, embeddings, None, interleaved)


def apply_rotary_pos_emb_vision(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, *, interleaved: bool = False
) -> tuple[Tensor, Tensor]:
    """transformers' vision rotary, same signature and dtype behaviour.

    Args:
        q, k, interleaved: as for rope_fwd.
        cos, sin: [S, R], one dtype, R as rope_fwd's embeddings (R < D: partial rotary).

    Returns:
        (q_embed, k_embed) in the dtypes of q and k. Differentiable in q, k, cos and sin (to any
        order); without a gradient of cos and sin the backward reads only its upstream gradients
        and the tables.

    {dtypes}
    """
    check_inputs("apply_rotary_pos_emb_vision", [("q", q), ("k", k)], [("cos", cos), ("sin", sin)])
    return rotary(q, k, cos, sin, interleaved)


def rotary_call(fn, q, k, cos, sin, *, pairs=0, repeated=False, dtypes="kept", heads_axis=None, prefix=False):
    """A transformers rotary call, checked, through the kernel. Vision form (heads_axis None): q, k
    [(B,) S, H, D], cos and sin [S, T] shared by the batch. Decoder form: q, k [B, H, S, D]
    (heads_axis -3) or [B, S, H, D] (-2), cos and sin [B or 1, S, T]; with prefix, [S', T], S' <= S:
    the first S - S' tokens pass through (DINOv3). k None: a function of one tensor. pairs, repeated
    and dtypes: the variant's (variants.py; pairs as rotary_torch's flags). fn names it in errors.

    A call like one that passed (_signature) is not checked again, and under no grad repeats its
    launch (_Relaunch): the host time of a decoding step."""
    key = _signature(fn, (pairs, repeated, prefix), dtypes, heads_axis, q, k, cos, sin)
    seen = _SEEN.get(key) if key is not None else None
    if seen is not None and seen.route is not None and _untracked(q, k, cos, sin):
        out = seen(q, k, cos, sin)
        if out is not None:
            return out
    args, single = (q, k, cos, sin), k is None
    batched = isinstance(q, Tensor) and q.dim() == 4
    heads_first = heads_axis == -3 and batched  # q and k [B, H, S, D], read in place as [B, S, H, D]
    if single and isinstance(q, Tensor) and q.dim() >= 3:
        k = q[:, :0] if heads_first else q[..., :0, :]  # no heads: the kernel writes q's alone
    tables = isinstance(cos, Tensor) and isinstance(sin, Tensor)
    if (heads_axis is None or prefix) and batched and tables and cos.dim() == sin.dim() == 2:  # one for the batch
        cos, sin = cos[None], sin[None]
    if tables and sin.dtype != cos.dtype:
        table = torch.promote_types(cos.dtype, sin.dtype)
        cos, sin = cos.to(table), sin.to(table)
    if seen is None:  # on [B, S, H, D] views, as the messages name the sizes
        qc, kc = _swap_heads(q, k) if heads_axis == -3 else (q, k)
        names = [("x", qc), ("x", kc)] if single else [("q", qc), ("k", kc)]
        check_inputs(fn, names, [("cos", cos), ("sin", sin)], batched=batched,
                     pair_table=bool(pairs & rotary_torch.PAIR_TABLE) and not repeated, prefix=prefix)  # fmt: skip
    if dtypes == "promoted":  # computed from the unrounded inputs
        q, k = (_to(x, torch.promote_types(x.dtype, cos.dtype)) for x in (q, k))
    if repeated:  # a view: the second half gets a zero gradient
        cos, sin = (t[..., : t.shape[-1] // 2] for t in (cos, sin))
    # Outputs as the kernel writes them (not k's result cast to q's dtype)
    relaunchable = dtypes != "q" or single or k.dtype == q.dtype
    if key is not None and relaunchable and type(q) is Tensor and _untracked(*args):
        q_embed, k_embed, route = _forward(q, k, cos, sin, pairs, heads_first)
    else:
        (q_embed, k_embed), route = rotary(q, k, cos, sin, pairs, heads_first), None
    if dtypes == "q":
        k_embed = _to(k_embed, q_embed.dtype)
    # the launch runs again only on the inputs' own memory (no dtype conversion made a copy)
    if route is not None and any(a.data_ptr() != b.data_ptr() for a, b in zip((q, k, cos, sin), args) if b is not None):
        route = None
    if key is not None and (seen is None or route is not None and seen.route is None):
        if len(_SEEN) >= 1024:  # bounded, as a cache; in practice a few layouts per model
            _SEEN.clear()
        # a call with no launch to repeat (grad mode, say) shares one entry: nothing new per S
        _SEEN[key] = _CHECKED if route is None else _Relaunch(route, pairs, q_embed, None if single else k_embed)
    return q_embed if single else (q_embed, k_embed)


def _to(x: Tensor, dtype) -> Tensor:
    """x in dtype; x itself, without a call into torch, where it has it."""
    return x if x.dtype == dtype else x.to(dtype)


def _signature(fn, pairs, dtypes, heads_axis, *tensors):
    """What rotary_call's checks and launch read of a call; None while tracing or for an argument
    neither a tensor nor None. Plain tuples (no torch.Size): the garbage collector stops tracking
    such a key, so a new S at every step adds nothing for its full collections to walk."""
    if torch.compiler.is_compiling():
        return None
    try:
        return (fn, pairs, dtypes, heads_axis,
                *[t if t is None else (type(t) is Tensor, tuple(t.shape), t.stride(), t.dtype, t.device)
                  for t in tensors])  # fmt: skip
    except (AttributeError, TypeError):
        return None


class _Relaunch:
    """A rotary_call that passed the checks and, where it ran the kernel on its inputs' own memory
    under no grad, its launch (launch._Route) and outputs' layout."""

    __slots__ = ("route", "pairs", "outs")

    def __init__(self, route, pairs, *outs):
        self.route, self.pairs = route, pairs
        self.outs = [o if o is None else (tuple(o.shape), o.stride(), o.dtype, o.device) for o in outs]

    def __call__(self, q, k, cos, sin):
        """(q_embed, k_embed), q_embed alone for a function of one tensor (k None); None where an
        address's 16-byte alignment differs from the route's (nothing launched)."""
        (shape, stride, dtype, device), k_out = self.outs
        q_embed = torch.empty_strided(shape, stride, dtype=dtype, device=device)
        # one tensor: k is q's slice of no heads, whose result is never written
        k_embed = q_embed if k_out is None else torch.empty_strided(k_out[0], k_out[1], dtype=k_out[2], device=device)
        launched = _launch().launch_fwd(q=q, k=q if k is None else k, q_out=q_embed, k_out=k_embed, cos=cos, sin=sin,
                                        pairs=self.pairs, route=self.route)  # fmt: skip
        if launched is None:
            return None
        return q_embed if k is None else (q_embed, k_embed)


_CHECKED = _Relaunch(None, False, None, None)  # the _SEEN entry of a call whose checks passed, no launch kept


def heads_axis(fn: str, unsqueeze_dim) -> int:
    """The heads' axis of transformers' [B, H, S, D] (unsqueeze_dim 1) or [B, S, H, D] (2) q/k."""
    axis = {1: -3, -3: -3, 2: -2, -2: -2}.get(unsqueeze_dim) if type(unsqueeze_dim) is int else None
    if axis is None:
        raise ValueError(
            f"{fn}: unsqueeze_dim must be 1 (q/k [B, H, S, D]) or 2 (q/k [B, S, H, D]) with cos/sin "
            f"[B, S, R], got {unsqueeze_dim!r}"
        )
    return axis


def apply_rotary_pos_emb(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1):
    """transformers' decoder rotary (Llama's and most families'), same signature and dtypes.

    Args:
        q, k: [B, HQ, S, D] and [B, HK, S, D] (unsqueeze_dim=1, the views attention classes pass)
            or [B, S, HQ, D] and [B, S, HK, D] (unsqueeze_dim=2), any strides; D even, at most 512.
        cos, sin: [B, S, R] or [1, S, R] (one table for the batch, read without a copy), R even
            and at most D: the first R channels rotated as rotate_half does, the rest passed through.
        unsqueeze_dim: where transformers unsqueezes cos and sin, i.e. q's heads axis (1 or 2).

    Returns:
        (q_embed, k_embed) shaped as q and k, each in the promotion of its input's dtype with
        cos's and sin's (bf16 q with bf16 tables: bf16). Differentiable as
        apply_rotary_pos_emb_vision; the tables' gradient is summed over heads (and over the batch
        for a shared table) in a fixed order.

    {dtypes}
    """
    fn = "apply_rotary_pos_emb"
    return rotary_call(fn, q, k, cos, sin, dtypes="promoted", heads_axis=heads_axis(fn, unsqueeze_dim))


def rope_bwd(
    grad_q_embed: Tensor, grad_k_embed: Tensor, q: Tensor, k: Tensor, embeddings: Tensor, *, interleaved: bool = False,
    out=None,
):  # fmt: skip
    """The backward of rope_fwd (SOL-ExecBench 019): (grad_q, grad_k, grad_embeddings).

    Args:
        grad_q_embed, q: [S, HQ, D]; grad_k_embed, k: [S, HK, D]; any strides. Each upstream
            gradient has the dtype of its tensor.
        embeddings: [S, R] angles, as for rope_fwd (R < D: partial rotary).
        interleaved: as for rope_fwd.
        out: optional (grad_q, grad_k, grad_embeddings) to write instead of allocating: shaped
            and typed as q, k and embeddings, not overlapping the inputs or each other. As with
            torch's out= functions, what is written there is not differentiable: under grad mode
            a buffer or input that requires grad (or has a forward-mode tangent) is refused.

    Returns:
        (grad_q, grad_k, grad_embeddings) in the dtypes of q, k and embeddings (the out= tensors
        when given). Without out=, differentiable: linear in the upstream gradients, bilinear in
        them and q/k or the table. The sum over heads runs in a fixed order: deterministic.

    {dtypes}
    """
    fn = "rope_bwd"
    grads = [("grad_q_embed", grad_q_embed), ("grad_k_embed", grad_k_embed)]
    check_inputs(fn, [("q", q), ("k", k)], [("embeddings", embeddings)], grads)
    if out is None:
        # The op has no forward-mode or vmap rule: under those, the function that has them.
        bwd = rotary_grad if transforms_active() else rotary_bwd
        dq, dk, de, _ = bwd(grad_q_embed, grad_k_embed, q, k, embeddings, None, True, True, interleaved)
        return dq, dk, de
    check_out(fn, out, [*zip(_OUT_AND_INPUTS, (q, k, embeddings))])
    names = [f"out[{n}]" if i < 3 else n for i, n in enumerate(_OUT_AND_INPUTS)]
    check_out_autograd(fn, [*zip(names, (*out, grad_q_embed, grad_k_embed, q, k, embeddings))])
    rope_bwd_out(grad_q_embed, grad_k_embed, q, k, embeddings, *out, interleaved)
    return tuple(out)


for _fn in (rope_fwd, apply_rotary_pos_emb_vision, apply_rotary_pos_emb, rope_bwd):
    _fn.__doc__ = _fn.__doc__.replace("{dtypes}", _DTYPES)
