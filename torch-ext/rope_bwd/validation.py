"""Argument checks of the public functions, before any kernel runs or output is written: each
message names the argument and what was expected."""

import torch
from torch.autograd import forward_ad

MAX_HEAD_DIM = 512  # DeepSeek-V4: heads of 512 with a 64-channel rope slice
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_PASSED = set()  # _passed_key of the calls whose checks passed


def _tensor(fn, name, t, ndim, layout):
    if t.dim() != ndim:
        raise ValueError(f"{fn}: {name} must be a {ndim}-D tensor {layout}, got shape {tuple(t.shape)}")
    if t.dtype not in _FLOATS:
        raise TypeError(f"{fn}: {name} must be float32, bfloat16, float16 or float64, got {t.dtype}")


def _same(fn, name, got, want, what):
    if got != want:
        raise ValueError(f"{fn}: {name} must have {what} {want}, got {got}")


def check_inputs(fn, heads, tables, grads=(), batched=False, pair_table=False, prefix=False):
    """heads: [(name, tensor)] for q and k ([S, H, D]); tables: [(name, tensor)] for embeddings or
    (cos, sin) ([S, R], R even, R <= D; pair_table: [S, R/2]); grads: [(name, tensor)], the heads'
    upstream gradients, in their order. batched: heads [B, S, H, D], tables [B or 1, S, R].
    prefix: tables of S' <= S tokens (the first S - S' pass through)."""
    named = (*heads, *tables, *grads)
    # A call like one that passed passes (host time: what a training step at small S waits on).
    key = _passed_key((fn, pair_table, prefix), named, batched)
    if key is not None and key in _PASSED:
        return
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{fn}: {name} must be a torch.Tensor, got {type(t).__name__}")
    b = int(batched)  # past the batch's checks, each tensor's shape[b:]
    for name, t in (*heads, *grads):
        _tensor(fn, name, t, 3 + b, "[B, S, H, D]" if batched else "[S, H, D]")
    for name, t in tables:
        _tensor(fn, name, t, 2 + b, "[B, S, R]" if batched else "[S, D]")
    (qn, q), (kn, k) = heads
    if batched:
        B = q.shape[0]
        for name, t in (*heads[1:], *grads):
            _same(fn, name, t.shape[0], B, "q's batch size B =")
        for name, t in tables:
            if t.shape[0] not in (1, B):
                raise ValueError(f"{fn}: {name} must have batch size 1 or q's batch size {B}, got {t.shape[0]}")
    S, _, D = q.shape[b:]
    if D % 2 or not 0 < D <= MAX_HEAD_DIM:
        raise ValueError(f"{fn}: {qn} head_dim (last dimension) must be even and in 2..{MAX_HEAD_DIM}, got {D}")
    _same(fn, kn, (k.shape[b], k.shape[b + 2]), (S, D), "(S, D) equal to q's")
    # q and k may differ in dtype (transformers casts each to float32 and back); a gradient
    # comes in the dtype of its tensor, as autograd hands it over.
    for (name, g), (of_name, x) in zip(grads, heads):
        _same(fn, name, tuple(g.shape[b:]), tuple(x.shape[b:]), f"the shape of {of_name}")
        _same(fn, name, g.dtype, x.dtype, f"the dtype of {of_name}")
    for name, t in tables:
        if not prefix:
            _same(fn, name, t.shape[b], S, "q's token count S =")
        elif t.shape[b] > S:
            raise ValueError(f"{fn}: {name} must have at most q's token count S = {S} tokens, got {t.shape[b]}")
        R = 2 * t.shape[-1] if pair_table else t.shape[-1]
        if R % 2 or not 0 < R <= D:
            what = "/2], one value per rotated pair, with R" if pair_table else "] with R even and"
            tail = "" if pair_table else " (R < D: partial rotary)"
            raise ValueError(f"{fn}: {name} must be [S, R{what} at most head_dim {D}{tail}, got {tuple(t.shape[b:])}")
    if len(tables) == 2:
        (cn, c), (sn, sin) = tables
        _same(fn, sn, tuple(sin.shape[b:]), tuple(c.shape[b:]), f"the shape of {cn}")
        _same(fn, sn, sin.dtype, c.dtype, f"the dtype of {cn}")
    for name, t in named:
        if t.device != q.device:
            raise ValueError(
                f"{fn}: {name} is on {t.device}, but {qn} is on {q.device}; all tensors must be on one device"
            )
    if key is not None:
        if len(_PASSED) >= 1024:  # bounded, as a cache; in practice a few layouts per model
            _PASSED.clear()
        _PASSED.add(key)


def _passed_key(fn, named, batched):
    """What the checks read of a call, each tensor's token count replaced by its comparison with
    q's (its batch size by whether it is q's or 1): the outcome holds for every B and S, so the set
    does not grow with sizes. None while tracing (symbolic sizes) or for what is not a tensor of
    two dimensions or more."""
    if torch.compiler.is_compiling():
        return None
    try:
        if batched:
            (B, S), n = named[0][1].shape[:2], 2
            sizes = [(t.shape[0] == B, t.shape[0] == 1, (t.shape[1] > S) - (t.shape[1] < S)) for _, t in named]
        else:
            S, n = named[0][1].shape[0], 1
            sizes = [(t.shape[0] > S) - (t.shape[0] < S) for _, t in named]
        key = (fn, *[(type(t), t.shape[n:], t.dtype, t.device, m) for (_, t), m in zip(named, sizes)])
        hash(key)
    except (AttributeError, IndexError, TypeError):
        return None
    return key


def _span(t):
    """Byte range [lo, hi) that a tensor's elements occupy."""
    lo = t.data_ptr()
    extent = sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride()))
    return lo, lo + (extent + 1) * t.element_size()


def _self_overlapping(shape, strides):
    """True unless the layout provably gives every element its own address: in order of stride,
    each dimension steps past all that the smaller ones reach (exact for views)."""
    if 0 in shape:
        return False
    reach = 0
    for n, st in sorted(((n, abs(st)) for n, st in zip(shape, strides) if n > 1), key=lambda p: p[1]):
        if st <= reach:
            return True
        reach += st * (n - 1)
    return False


def _overlap(a, b):
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device or a.device.type == "meta":
        return False  # meta tensors have no memory
    (a0, a1), (b0, b1) = _span(a), _span(b)
    if not (a0 < b1 and b0 < a1):
        return False
    # Interleaved views of one buffer (grad_q and grad_k inside one qkv gradient) share a
    # span but no element: same layout at a distance d, i.e. one tensor with a dimension
    # of size 2 and stride d, which must not overlap itself.
    if a.shape != b.shape or a.stride() != b.stride() or a.dtype != b.dtype:
        return True
    step, rem = divmod(abs(a0 - b0), a.element_size())
    return rem != 0 or _self_overlapping((2, *a.shape), (step, *a.stride()))


def check_out(fn, out, likes):
    """out: the caller's output tensors, each shaped, typed and placed as its (name, tensor) of
    `likes`. Where they sit in memory: check_out_memory, when the op runs."""
    if not isinstance(out, (tuple, list)) or len(out) != len(likes):
        raise TypeError(f"{fn}: out must be a tuple of {len(likes)} tensors ({', '.join(n for n, _ in likes)})")
    for t, (name, like) in zip(out, likes):
        where = f"out[{name}]"
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{fn}: {where} must be a torch.Tensor, got {type(t).__name__}")
        _same(fn, where, tuple(t.shape), tuple(like.shape), "shape")
        if t.dtype != like.dtype:
            raise TypeError(f"{fn}: {where} must have dtype {like.dtype}, got {t.dtype}")
        _same(fn, where, t.device, like.device, "device")
        # Traced, strides may be symbolic (no sorting them): an expanded dimension is the
        # layout whose elements share memory that a trace can see; the op checks the rest.
        if torch.compiler.is_compiling() and any(st == 0 and n != 1 for n, st in zip(t.shape, t.stride())):
            _raise_self_overlapping(fn, name, t)


def check_out_autograd(fn, named):
    """Refuses out= buffers or inputs ([(name, tensor)]) that require grad under grad mode or carry
    a forward-mode tangent: what out= receives is not differentiable, a gradient not lost silently."""
    name = next((n for n, t in named if t.requires_grad), None) if torch.is_grad_enabled() else None
    what = "requires grad"
    if name is None and not torch.compiler.is_compiling() and forward_ad._current_level >= 0:
        name = next((n for n, t in named if forward_ad.unpack_dual(t).tangent is not None), None)
        what = "carries a forward-mode tangent"
    if name is None:
        return
    raise ValueError(
        f"{fn}: {name} {what}, but results written into out= are not differentiable; call {fn} "
        "without out= for differentiable results, or under torch.no_grad()"
    )


def _raise_self_overlapping(fn, name, t):
    raise ValueError(
        f"{fn}: out[{name}] has elements that share memory (strides {t.stride()}, e.g. an expanded "
        "tensor); each output element needs its own memory"
    )


def check_out_memory(fn, out, inputs):
    """out: [(name, tensor)] the op writes; inputs: [(name, tensor)] that no output may overlap.
    Called in the op's implementation, on real tensors (under torch.compile too: a trace has no
    addresses), before anything is written."""
    for name, t in out:
        if _self_overlapping(t.shape, t.stride()):
            _raise_self_overlapping(fn, name, t)
    for name, t in out:
        for in_name, x in inputs:
            if _overlap(t, x):
                raise ValueError(f"{fn}: out[{name}] overlaps the input {in_name}; outputs must not alias inputs")
    for i, (a_name, a) in enumerate(out):
        for b_name, b in out[i + 1 :]:
            if _overlap(a, b):
                raise ValueError(f"{fn}: out[{a_name}] and out[{b_name}] overlap; each output needs its own memory")
