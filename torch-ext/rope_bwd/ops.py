"""Custom ops (torch.library) and the public functions.

Ops, named through add_op_namespace_prefix so that several builds can be loaded
in one process:
    rotary_fwd    (q, k, table, sin?) -> (q_embed, k_embed)          autograd: rotary_bwd
    rotary_bwd    (gq, gk, q?, k?, table, sin?, need_q, need_k) -> (dq, dk, dtable, dsin)
    rope_bwd_out  the same backward written into caller buffers (destination passing)
`table` is the angle table `embeddings` when `sin` is None, else `cos`. Outputs
that are not asked for come back as empty tensors.

Dispatch: CUDA tensors run the Triton kernel; CPU tensors run rotary_torch,
or the Triton kernel in Triton's interpreter when TRITON_INTERPRET=1; float64
runs rotary_torch on any device. The public functions reach the same
implementations through an autograd.Function in eager mode (no dispatcher round
trip: host time), through a twin with setup_context under torch.func transforms,
and through the ops when traced. rotary_bwd has an autograd of its own: the
backward is differentiable (derivatives.py).

rotary_fwd and rotary_bwd are triton_ops: torch.compile traces into them, so that
inductor launches the kernel from its generated code (or fuses rotary_torch's math
on CPU) instead of calling a Python op in every step, with S static or dynamic.
The kernel's head counts, head_dim and strides are constexprs, so a trace with
those symbolic, or one that runs the kernel in the interpreter, calls an opaque
twin (`*_opaque`) instead, which launches as eager calls do.
"""

import functools
import logging
import os
from typing import Optional

import torch
from torch import Tensor
from torch.autograd import forward_ad

from . import derivatives, rotary_torch, tuning
from ._ops import add_op_namespace_prefix
from .validation import check_inputs, check_out, check_out_autograd, check_out_memory


def _use_triton(q: Tensor, k: Tensor, table: Tensor) -> bool:
    """CUDA tensors (and CPU ones under TRITON_INTERPRET=1) run the Triton kernel, unless
    q, k or the table is float64: the kernel computes in float32, so float64 (gradcheck,
    references) runs the PyTorch path, on any device. q/k's gradients share their dtypes."""
    return (q.is_cuda or os.environ.get("TRITON_INTERPRET") == "1") and torch.float64 not in (
        q.dtype,
        k.dtype,
        table.dtype,
    )


@functools.cache
def _rotary_triton():
    from . import rotary_triton  # first GPU/interpreter use only: CPU machines need no Triton

    return rotary_triton


def _opaque_in_trace(*tensors) -> bool:
    """Whether a traced call (fake or functional tensors) must run the kernel through an
    opaque op: inductor can launch it only on CUDA, and only with the head counts and
    head_dim ints (constexprs of the kernel); S may be symbolic (launch_traced)."""
    t = tensors[0]
    # (q, k, table, sin) or (gq, gk, q, k, table, sin): the table is second to last
    if type(t) is Tensor or not _use_triton(t, tensors[1], tensors[-2]):
        return False
    return not (t.is_cuda and all(isinstance(n, int) for x in tensors if x is not None for n in x.shape[1:]))


def _size_hint(n) -> int:
    """An int for a size that may be symbolic, without adding a guard: what S is expected
    to be, to choose a launch configuration (every configuration is correct for every S)."""
    if isinstance(n, int):
        return n
    # The value seen when the trace started (torch's hint_int/optimization_hint read the same
    # but change name and warn across releases); none for data-dependent sizes.
    hint = n.node.hint
    return hint if isinstance(hint, int) else 4096


def _triton_op(name):
    """torch.library.triton_op(<namespace>::name). Defining one looks for Triton kernels in
    the function and logs a warning when Triton cannot be imported: CPU machines need no
    Triton (traced, the op is rotary_torch's math there), so that warning is kept quiet."""

    def define(fn):
        log = logging.getLogger("torch._library.triton")
        level = log.level
        log.setLevel(logging.ERROR)
        try:
            return torch.library.triton_op(add_op_namespace_prefix(name), mutates_args=())(fn)
        finally:
            log.setLevel(level)

    return define


def _launch(x_q, x_k, y_q, y_k, p_q, p_k, t0, t1, g0, g1, *, adjoint: bool):
    S, HQ, D = x_q.shape
    device = x_q.device
    if _other_device(x_q, device):  # Triton launches on the current device: make it the tensors'
        with torch.cuda.device(device):
            return _launch(x_q, x_k, y_q, y_k, p_q, p_k, t0, t1, g0, g1, adjoint=adjoint)
    mode = "fwd" if not adjoint else ("bwd" if g0 is not None else "bwd_qk")
    layout = "sdpa" if adjoint and _heads_outside(x_q) else ""
    cfg = tuning.cached_config(mode, _size_hint(S), HQ, x_k.shape[1], D, x_q.element_size(), device, layout)
    rt = _rotary_triton()
    if adjoint:
        rt.launch_bwd(x_q, x_k, t0, t1, dq=y_q, dk=y_k, q=p_q, k=p_k, dtable=g0, dsin=g1, config=cfg)
    else:
        rt.launch_fwd(x_q, x_k, t0, t1, y_q, y_k, config=cfg)


def _heads_outside(x: Tensor) -> bool:
    """Whether x [S, H, D] has its heads laid out outside its tokens (head stride at least S token
    strides), as the upstream gradient that sdpa returns: the backward has launch configurations
    of its own there (tuning.bucket). Read from size hints: no guard on a symbolic S."""
    (S, H, _), (st_s, st_h, _) = x.shape, x.stride()
    if type(x) is not Tensor:  # traced: the sizes may be symbolic
        S, H, st_s, st_h = (_size_hint(n) for n in (S, H, st_s, st_h))
    return S > 1 and H > 1 and st_h >= S * st_s > 0


def _other_device(x: Tensor, device: torch.device) -> bool:
    """Whether x is on a GPU other than the current one. Asking costs host time per call, so
    only where there is a choice (a process that sees several GPUs)."""
    if device.type != "cuda" or type(x) is not Tensor or not _several_gpus():
        return False
    return device.index != torch.cuda.current_device()


@functools.cache
def _several_gpus() -> bool:
    return torch.cuda.device_count() > 1


def _empty_like(t: Tensor) -> Tensor:
    # empty_like: half the host time of torch.empty(shape, dtype=, device=) on a CUDA tensor
    return torch.empty_like(t, memory_format=torch.contiguous_format)


# ---------------------------------------------------------------- forward op


def _rotary_fwd(q: Tensor, k: Tensor, table: Tensor, sin: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    if not _use_triton(q, k, table):
        return rotary_torch.forward(q, k, table, sin)
    q_embed, k_embed = _empty_like(q), _empty_like(k)
    _launch(q, k, q_embed, k_embed, None, None, table, sin, None, None, adjoint=False)
    return q_embed, k_embed


_rotary_fwd_opaque = torch.library.custom_op(add_op_namespace_prefix("rotary_fwd_opaque"), mutates_args=())(_rotary_fwd)


@_rotary_fwd_opaque.register_fake
def _(q, k, table, sin):
    return _empty_like(q), _empty_like(k)


@_triton_op("rotary_fwd")
def rotary_fwd(q: Tensor, k: Tensor, table: Tensor, sin: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    fn = _rotary_fwd_opaque if _opaque_in_trace(q, k, table, sin) else _rotary_fwd
    return fn(q, k, table, sin)


# --------------------------------------------------------------- backward op


def _bwd_outputs(gq, gk, q, table, sin, need_q, need_k):
    """(dq, dk, dtable, dsin): new tensors for what is asked for, None for the rest."""
    table_grad = q is not None
    return (
        _empty_like(gq) if need_q else None,
        _empty_like(gk) if need_k else None,
        _empty_like(table) if table_grad else None,
        _empty_like(sin) if table_grad and sin is not None else None,
    )


def _markers(outs, likes):
    """Empty tensors in place of the outputs not asked for (custom ops return tensors)."""
    return tuple(o if o is not None else like.new_empty((0,)) for o, like in zip(outs, likes))


# The ops' functions each spell out the full signature: torch.library reads their schemas from it.
def _rotary_bwd_eager(
    gq: Tensor,
    gk: Tensor,
    q: Optional[Tensor],
    k: Optional[Tensor],
    table: Tensor,
    sin: Optional[Tensor],
    need_q: bool,
    need_k: bool,
) -> tuple[Optional[Tensor], ...]:
    """The backward; None for the outputs not asked for (the op returns empty tensors)."""
    if not _use_triton(gq, gk, table):
        return rotary_torch.backward(gq, gk, q, k, table, sin, need_q=need_q, need_k=need_k)
    outs = _bwd_outputs(gq, gk, q, table, sin, need_q, need_k)
    _launch(gq, gk, outs[0], outs[1], q, k, table, sin, outs[2], outs[3], adjoint=True)
    return outs


def _rotary_bwd(
    gq: Tensor,
    gk: Tensor,
    q: Optional[Tensor],
    k: Optional[Tensor],
    table: Tensor,
    sin: Optional[Tensor],
    need_q: bool,
    need_k: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return _markers(_rotary_bwd_eager(gq, gk, q, k, table, sin, need_q, need_k), (gq, gk, table, table))


_rotary_bwd_opaque = torch.library.custom_op(add_op_namespace_prefix("rotary_bwd_opaque"), mutates_args=())(_rotary_bwd)


@_rotary_bwd_opaque.register_fake
def _(gq, gk, q, k, table, sin, need_q, need_k):
    return _markers(_bwd_outputs(gq, gk, q, table, sin, need_q, need_k), (gq, gk, table, table))


@_triton_op("rotary_bwd")
def rotary_bwd(
    gq: Tensor,
    gk: Tensor,
    q: Optional[Tensor],
    k: Optional[Tensor],
    table: Tensor,
    sin: Optional[Tensor],
    need_q: bool,
    need_k: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    fn = _rotary_bwd_opaque if _opaque_in_trace(gq, gk, q, k, table, sin) else _rotary_bwd
    return fn(gq, gk, q, k, table, sin, need_q, need_k)


@torch.library.custom_op(add_op_namespace_prefix("rope_bwd_out"), mutates_args=("grad_q", "grad_k", "grad_embeddings"))
def rope_bwd_out(
    grad_q_embed: Tensor,
    grad_k_embed: Tensor,
    q: Tensor,
    k: Tensor,
    embeddings: Tensor,
    grad_q: Tensor,
    grad_k: Tensor,
    grad_embeddings: Tensor,
) -> None:
    check_out_memory(
        "rope_bwd",
        [("grad_q", grad_q), ("grad_k", grad_k), ("grad_embeddings", grad_embeddings)],
        [
            ("grad_q_embed", grad_q_embed),
            ("grad_k_embed", grad_k_embed),
            ("q", q),
            ("k", k),
            ("embeddings", embeddings),
        ],
    )
    if not _use_triton(q, k, embeddings):
        dq, dk, de, _ = rotary_torch.backward(grad_q_embed, grad_k_embed, q, k, embeddings)
        grad_q.copy_(dq)
        grad_k.copy_(dk)
        grad_embeddings.copy_(de)
        return
    _launch(
        grad_q_embed,
        grad_k_embed,
        grad_q,
        grad_k,
        q,
        k,
        embeddings,
        None,
        grad_embeddings,
        None,
        adjoint=True,
    )


@rope_bwd_out.register_fake
def _(grad_q_embed, grad_k_embed, q, k, embeddings, grad_q, grad_k, grad_embeddings):
    return None


# ------------------------------------------------------------------ autograd
#
# Three ways into the rotation's autograd, one backward (_backward):
#   _EagerRotary   eager calls: the context is set in forward (host time; see its docstring)
#   _RotaryFn      under torch.func transforms and forward-mode AD, which need setup_context,
#                  a vmap rule and a jvp rule
#   rotary_fwd     traced calls (torch.compile, export): the op's registered autograd
# The backward is differentiable in turn (double backward, torch.func.hessian): under
# create_graph it runs as _RotaryGrad (eager) or the rotary_bwd op, whose own backward and
# jvp are derivatives.py's sums of calls of the same maps.


def _transforms_active() -> bool:
    """torch.func transforms (grad, vmap, jvp, ...) or a forward-mode AD level are live."""
    return torch._C._are_functorch_transforms_active() or forward_ad._current_level >= 0


def _rotary(q, k, table, sin):
    """The differentiable rotation, through the cheapest path the caller's mode allows."""
    if type(q) is Tensor and not torch.compiler.is_compiling():
        return (_RotaryFn if _transforms_active() else _EagerRotary).apply(q, k, table, sin)
    return rotary_fwd(q, k, table, sin)


def _rotary_grad(gq, gk, q, k, table, sin, need_q, need_k):
    """The differentiable backward: (dq, dk, dtable, dsin), those not asked for None (or empty)."""
    if type(gq) is Tensor and not torch.compiler.is_compiling():
        return _RotaryGrad.apply(gq, gk, q, k, table, sin, need_q, need_k)
    return rotary_bwd(gq, gk, q, k, table, sin, need_q, need_k)


def _setup_context(ctx, inputs, output):
    q, k, table, sin = inputs
    ctx.table_grad = ctx.needs_input_grad[2] or (sin is not None and ctx.needs_input_grad[3])
    # q and k are kept only when the table needs a gradient (the real models'
    # cos/sin come from buffers): that backward then never reads them.
    ctx.save_for_backward(q if ctx.table_grad else None, k if ctx.table_grad else None, table, sin)
    ctx.rotary_bwd = rotary_bwd


def _backward(ctx, gq, gk):
    q, k, table, sin = ctx.saved_tensors
    need_q, need_k = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    # Grad mode is on under create_graph: the gradients must then carry a graph of their own.
    bwd = _rotary_grad if torch.is_grad_enabled() else ctx.rotary_bwd
    dq, dk, dt, ds = bwd(gq, gk, q, k, table, sin, need_q, need_k)
    return (
        dq if need_q else None,
        dk if need_k else None,
        dt if ctx.needs_input_grad[2] else None,
        ds if sin is not None and ctx.needs_input_grad[3] else None,
    )


rotary_fwd.register_autograd(_backward, setup_context=_setup_context)


class _EagerRotary(torch.autograd.Function):
    """rotary_fwd with its autograd, minus the dispatcher: the same forward, context and
    backward, calling the implementations directly. Eager calls take this path, since host
    time per call is what a training step at a few thousand tokens waits on; traced calls
    (torch.compile, fake or functional tensors) take the custom ops. The context is set in
    forward: a separate setup_context makes every apply() bind arguments through inspect."""

    @staticmethod
    def forward(ctx, q, k, table, sin):
        out = _rotary_fwd(q, k, table, sin)
        _setup_context(ctx, (q, k, table, sin), out)
        ctx.rotary_bwd = _rotary_bwd_eager
        return out

    backward = staticmethod(_backward)


class _RotaryFn(torch.autograd.Function):
    """_EagerRotary for torch.func transforms and forward-mode AD, which need the context set
    in setup_context, a jvp rule and a vmap rule."""

    @staticmethod
    def forward(q, k, table, sin):
        return _rotary_fwd(q, k, table, sin)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _setup_context(ctx, inputs, output)
        ctx.rotary_bwd = _rotary_grad  # the transforms run the backward on wrapped tensors
        ctx.save_for_forward(*inputs)

    backward = staticmethod(_backward)

    @staticmethod
    def jvp(ctx, tq, tk, t_table, t_sin):
        return derivatives.rotation_jvp(_rotary, *ctx.saved_tensors, tq, tk, t_table, t_sin)

    @staticmethod
    def vmap(info, in_dims, q, k, table, sin):
        return derivatives.vmap_folded(_rotary, info.batch_size, in_dims, (q, k, table, sin))


def _grad_setup_context(ctx, inputs, output):
    *saved, ctx.need_q, ctx.need_k = inputs
    ctx.save_for_backward(*saved)


def _grad_backward(ctx, vq, vk, v_table, v_sin):
    grads = derivatives.adjoint_vjp(
        _rotary,
        _rotary_grad,
        ctx.saved_tensors,
        ctx.need_q,
        ctx.need_k,
        ctx.needs_input_grad[:6],
        (vq, vk, v_table, v_sin),
    )
    return (*grads, None, None)


rotary_bwd.register_autograd(_grad_backward, setup_context=_grad_setup_context)


class _RotaryGrad(torch.autograd.Function):
    """The backward as a differentiable function (for create_graph and torch.func): the
    eager backward forward, derivatives.py's rules for its backward, jvp and vmap."""

    @staticmethod
    def forward(gq, gk, q, k, table, sin, need_q, need_k):
        return _rotary_bwd_eager(gq, gk, q, k, table, sin, need_q, need_k)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _grad_setup_context(ctx, inputs, output)
        ctx.save_for_forward(*inputs[:6])

    backward = staticmethod(_grad_backward)

    @staticmethod
    def jvp(ctx, *tangents):
        return derivatives.adjoint_jvp(_rotary_grad, ctx.saved_tensors, ctx.need_q, ctx.need_k, tangents[:6])

    @staticmethod
    def vmap(info, in_dims, gq, gk, q, k, table, sin, need_q, need_k):
        return derivatives.vmap_folded(
            _rotary_grad, info.batch_size, in_dims[:6], (gq, gk, q, k, table, sin), need_q, need_k
        )


# ------------------------------------------------------------ public functions


def _rotary_angles(fn, q, k, embeddings):
    check_inputs(fn, [("q", q), ("k", k)], [("embeddings", embeddings)])
    return _rotary(q, k, embeddings, None)


def rope_fwd(q: Tensor, k: Tensor, embeddings: Tensor) -> tuple[Tensor, Tensor]:
    """q_embed, k_embed = q*cos + rotate_half(q)*sin (same for k), cos/sin of `embeddings`.

    q [S, HQ, D], k [S, HK, D] (any strides), embeddings [S, D] angles.

    Dtypes (every public function): float32, bfloat16 and float16 run the kernel, math
    in float32. float64 is accepted on every device and computed in float64 by the
    PyTorch path (for gradcheck and references; the kernel computes in float32). q and
    k may have different dtypes, as transformers allows: each result (output or
    gradient) has the dtype of the tensor it belongs to. The table may have any of
    these dtypes. Differentiable as apply_rotary_emb."""
    return _rotary_angles("rope_fwd", q, k, embeddings)


def apply_rotary_emb(q: Tensor, k: Tensor, embeddings: Tensor) -> tuple[Tensor, Tensor]:
    """rope_fwd for autograd users: differentiable in q, k and embeddings, to any order
    (create_graph=True: the backward is differentiable too), under torch.func transforms
    (grad, vmap, jvp, hessian) and forward-mode AD. Gradients come in the dtype of
    their tensor."""
    return _rotary_angles("apply_rotary_emb", q, k, embeddings)


def apply_rotary_pos_emb_vision(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """transformers' vision rotary, same signature and dtype behaviour: q, k [S, H, D];
    cos, sin [S, D]; math in float32 (float64 for float64 q or k), each output in its
    input's dtype, q and k may differ in dtype (see rope_fwd); cos and sin share one
    dtype. Differentiable in q, k, cos and sin as apply_rotary_emb; when cos/sin need
    no gradient the backward reads only the upstream gradients and the table."""
    check_inputs("apply_rotary_pos_emb_vision", [("q", q), ("k", k)], [("cos", cos), ("sin", sin)])
    return _rotary(q, k, cos, sin)


_OUT_AND_INPUTS = (
    "out[grad_q]",
    "out[grad_k]",
    "out[grad_embeddings]",
    "grad_q_embed",
    "grad_k_embed",
    "q",
    "k",
    "embeddings",
)


def rope_bwd(grad_q_embed: Tensor, grad_k_embed: Tensor, q: Tensor, k: Tensor, embeddings: Tensor, *, out=None):
    """Backward of rope_fwd (SOL-ExecBench 019): (grad_q, grad_k, grad_embeddings).

    grad_q_embed/q [S, HQ, D], grad_k_embed/k [S, HK, D], embeddings [S, D]. Each
    upstream gradient has the dtype of its tensor (grad_q_embed q's, grad_k_embed k's);
    grad_q, grad_k and grad_embeddings come in the dtypes of q, k and embeddings (see
    rope_fwd). Differentiable as apply_rotary_emb: it is linear in the upstream
    gradients, bilinear in them and q/k or the table.

    out: optional (grad_q, grad_k, grad_embeddings) buffers to write instead of
    allocating; they must not overlap the inputs or each other. As with torch's out=
    functions the results written there are not differentiable: under grad mode a
    buffer or input that requires grad (or carries a forward-mode tangent) is refused
    with a ValueError; under torch.no_grad() it is accepted."""
    fn = "rope_bwd"
    check_inputs(
        fn,
        [("q", q), ("k", k)],
        [("embeddings", embeddings)],
        [("grad_q_embed", grad_q_embed), ("grad_k_embed", grad_k_embed)],
    )
    if out is None:
        # The op has no forward-mode or vmap rule: under those, the function that has them.
        bwd = _rotary_grad if _transforms_active() else rotary_bwd
        dq, dk, de, _ = bwd(grad_q_embed, grad_k_embed, q, k, embeddings, None, True, True)
        return dq, dk, de
    check_out(
        fn,
        out,
        [
            ("grad_q", q.shape, q.dtype, q.device),
            ("grad_k", k.shape, k.dtype, k.device),
            ("grad_embeddings", embeddings.shape, embeddings.dtype, embeddings.device),
        ],
    )
    check_out_autograd(fn, _OUT_AND_INPUTS, (*out, grad_q_embed, grad_k_embed, q, k, embeddings))
    rope_bwd_out(grad_q_embed, grad_k_embed, q, k, embeddings, *out)
    return tuple(out)
