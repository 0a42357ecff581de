"""The decoders' rotary, transformers' `apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)`:
q [B, HQ, S, D] and k [B, HK, S, D] as the attention classes pass them (transposed views of the
q and k projections), or [B, S, H, D] with unsqueeze_dim=2; cos/sin [B, S, R] or one table for the
batch, [1, S, R]. Judged against a float64 evaluation of Llama's body (partial rotary: the first
R channels rotated, the rest passed through), on the PyTorch path, in Triton's interpreter and
on CUDA; the kernel's batched launches with poisoned outputs."""

import gc

import pytest
import torch

from . import reference
from .helpers import DEVICES, HAS_CUDA, kernel_path, submodule


def llama_rotary(q, k, cos, sin, unsqueeze_dim=1):
    """transformers' decoder rotary (Llama's body, with recurrent_gemma's partial slice)."""
    R = cos.shape[-1]
    c, s = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)

    def apply(x):
        x_rot, x_pass = x[..., :R], x[..., R:]
        return torch.cat((x_rot * c + reference.rotate_half(x_rot) * s, x_pass), dim=-1)

    return apply(q), apply(k)


def make_call(B, S, HQ, HK, D, R, *, dtype, device, gen, table_batch=None, unsqueeze_dim=1, table_grad=False):
    """q, k as views of one [B, S, (HQ + HK) * D] projection in the layout of `unsqueeze_dim`,
    cos/sin [table_batch or B, S, R] (of random angles), leaves requiring grad."""
    proj = torch.randn(B, S, (HQ + HK) * D, generator=gen).to(device=device, dtype=dtype)
    q, k = (x.unflatten(-1, (-1, D)) for x in proj.split([HQ * D, HK * D], -1))
    if unsqueeze_dim == 1:
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    angles = torch.randn(B if table_batch is None else table_batch, S, R, generator=gen, dtype=torch.float64)
    cos, sin = (f(angles).to(device=device, dtype=dtype).requires_grad_(table_grad) for f in (torch.cos, torch.sin))
    return q.detach().requires_grad_(), k.detach().requires_grad_(), cos, sin


def tolerance(dtype):
    return {torch.float32: 2e-6, torch.bfloat16: 8e-3, torch.float16: 1e-3}[dtype]


def check_call(kernel, args, gen, unsqueeze_dim=1):
    """Values, dtypes and every gradient of apply_rotary_pos_emb against float64."""
    q, k, cos, sin = args
    snapshot = [t.detach().clone() for t in args]
    outs = kernel.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)
    assert [o.shape for o in outs] == [q.shape, k.shape]
    assert [o.dtype for o in outs] == [torch.promote_types(x.dtype, cos.dtype) for x in (q, k)]
    leaves = [t.detach().double().requires_grad_(t.requires_grad) for t in args]
    refs = llama_rotary(*leaves, unsqueeze_dim)
    tol = tolerance(q.dtype)
    for o, r in zip(outs, refs):
        assert reference.rel_err(o, r) <= tol
    cot = [torch.randn(o.shape, generator=gen).to(o) for o in outs]
    wrt = [t for t in args if t.requires_grad]
    grads = torch.autograd.grad(outs, wrt, cot)
    ref_grads = torch.autograd.grad(refs, [t for t in leaves if t.requires_grad], [c.double() for c in cot])
    for g, r, t in zip(grads, ref_grads, wrt):
        assert g.shape == t.shape and g.dtype == t.dtype
        assert reference.rel_err(g, r) <= tol
    for t, before in zip(args, snapshot):  # nothing of the caller's is written
        assert torch.equal(t.detach(), before)


@pytest.mark.kernels_ci
@pytest.mark.interpret(D=[64, 80], dtype=torch.bfloat16)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("D", [64, 72, 80, 128])
def test_attention_views(kernel, device, dtype, D, gen):
    """The attention classes' call: [B, H, S, D] views with GQA, a table per sequence."""
    check_call(kernel, make_call(2, 9, 4, 2, D, D, dtype=dtype, device=device, gen=gen), gen)


@pytest.mark.interpret(case="shared-table-grad")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "case",
    ["shared-table", "shared-table-grad", "table-grad", "seq-first", "partial", "partial-odd-half", "mha"],
)
def test_layouts(kernel, device, case, gen):
    """Tables shared by the batch (by stride 0; their gradient summed over it), the tables'
    gradient, [B, S, H, D] with unsqueeze_dim=2, partial rotary (R/2 even and odd), HQ == HK."""
    B, S, HQ, HK, D, R = 3, 7, 6, 2, 80, 80
    kw = {"table_batch": 1} if case.startswith("shared") else {}
    kw |= {"table_grad": case.endswith("grad"), "unsqueeze_dim": 2 if case == "seq-first" else 1}
    R = {"partial": 48, "partial-odd-half": 78}.get(case, R)
    HK = HQ if case == "mha" else HK
    args = make_call(B, S, HQ, HK, D, R, dtype=torch.bfloat16, device=device, gen=gen, **kw)
    check_call(kernel, args, gen, kw["unsqueeze_dim"])


@pytest.mark.interpret(S=[0, 1])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("B,S", [(1, 0), (3, 0), (1, 1), (4, 1), (1, 300)])
def test_sizes(kernel, device, B, S, gen):
    """Empty and one-token sequences, one sequence of many tokens."""
    args = make_call(B, S, 4, 2, 64, 64, dtype=torch.float32, device=device, gen=gen, table_grad=True)
    if S == 0:
        outs = kernel.apply_rotary_pos_emb(*args)
        assert [o.shape for o in outs] == [args[0].shape, args[1].shape]
        return
    check_call(kernel, args, gen)


@pytest.mark.interpret(mode=["fwd", "bwd"])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["fwd", "bwd", "bwd_qk"])
def test_batched_launch_writes_every_output(kernel, device, mode, gen):
    """The kernel's batched launches into NaN-poisoned outputs: the sdpa gradient layout
    [B, H, S, D] seen as [B, S, H, D], a shared table, and the table gradient per sequence."""
    if not kernel_path(device):
        pytest.skip("the Triton kernel on CPU tensors: runs only under TRITON_INTERPRET=1")
    launch = submodule(kernel, "launch")
    B, S, HQ, HK, D = 3, 11, 4, 2, 72
    q, k, cos, sin = (t.detach() for t in make_call(B, S, HQ, HK, D, D, dtype=torch.bfloat16, device=device, gen=gen))
    cos, sin = cos[:1], sin[:1]  # one table for the batch

    def poisoned(*shape, dtype=torch.bfloat16):
        return torch.full(shape, float("nan"), dtype=dtype, device=device)

    gq = torch.randn(B, HQ, S, D, generator=gen).to(device, torch.bfloat16).transpose(1, 2)
    gk = torch.randn(B, HK, S, D, generator=gen).to(device, torch.bfloat16).transpose(1, 2)
    qs, ks = q.transpose(1, 2), k.transpose(1, 2)
    leaves = [t.double().requires_grad_() for t in (qs, ks, cos, sin)]
    refs = llama_rotary(*leaves, unsqueeze_dim=2)
    if mode == "fwd":
        outs = {"q_out": poisoned(B, S, HQ, D), "k_out": poisoned(B, S, HK, D)}
        launch.launch_fwd(q=qs, k=ks, cos=cos, sin=sin, **outs)
        want = dict(zip(outs, refs))
    else:
        outs = {"grad_q": poisoned(B, S, HQ, D), "grad_k": poisoned(B, S, HK, D)}
        read = {}
        if mode == "bwd":
            read = {"q": qs, "k": ks}
            outs |= {"grad_cos": poisoned(B, S, D), "grad_sin": poisoned(B, S, D)}
        launch.launch_bwd(grad_q_embed=gq, grad_k_embed=gk, cos=cos, sin=sin, **read, **outs)
        grads = torch.autograd.grad(refs, leaves, (gq.double(), gk.double()))
        want = {"grad_q": grads[0], "grad_k": grads[1]}
        if mode == "bwd":  # per sequence: the shared table's gradient is their sum
            want |= {"grad_cos": grads[2], "grad_sin": grads[3]}
            outs = {n: (o.sum(0, keepdim=True, dtype=torch.float64) if "cos" in n or "sin" in n else o)
                    for n, o in outs.items()}  # fmt: skip
    for name, o in outs.items():
        assert not o.isnan().any(), f"{name}: not every element written"
        assert reference.rel_err(o, want[name]) <= 8e-3, name


@pytest.mark.interpret
@pytest.mark.parametrize("device", DEVICES)
def test_calls_after_a_remembered_one(kernel, device, gen, monkeypatch, launches):
    """A call is remembered by its signature (ops._SEEN: checked once; under no grad on the kernel's
    path, relaunched with no lookup): calls after it of another stride, dtype, sequence length or
    a misaligned address take the full path, a like one the relaunch; grad mode and a bad call
    too. Every output is written (allocations poisoned) and matches float64."""
    ops = kernel.ops

    def poisoning(alloc):
        def poisoned(*args, **kwargs):
            t = alloc(*args, **kwargs)
            return t.fill_(float("nan")) if t.is_floating_point() else t

        return poisoned

    for name in ("empty_strided", "empty_like"):  # what the package allocates its outputs with
        monkeypatch.setattr(torch, name, poisoning(getattr(torch, name)))
    full, forward = [], ops._forward
    monkeypatch.setattr(ops, "_forward", lambda *a: full.append(True) or forward(*a))

    def make(S=1, dtype=torch.bfloat16):
        return [t.detach() for t in make_call(2, S, 4, 2, 64, 64, dtype=dtype, device=device, gen=gen)]

    def misaligned(t):  # t's strides, at an address 2 bytes past a 16-byte boundary
        buf = torch.empty(t.untyped_storage().nbytes() // t.element_size() + 1, dtype=t.dtype, device=device)
        return buf.as_strided(t.shape, t.stride(), 1).copy_(t)

    base = make()
    calls = [
        ("first", base, False),
        ("like the first", make(), True),
        ("q contiguous", [base[0].contiguous(), *base[1:]], False),
        ("float16", make(dtype=torch.float16), False),
        ("S = 5", make(5), False),
        ("q misaligned", [misaligned(base[0]), *base[1:]], False),
        ("like the first again", make(), True),
    ]
    for what, args, relaunched in calls:
        full.clear()
        with torch.no_grad():
            outs = kernel.apply_rotary_pos_emb(*args)
        refs = llama_rotary(*(t.double() for t in args))
        for o, r in zip(outs, refs):
            assert reference.rel_err(o, r) <= tolerance(args[0].dtype), what
        assert full == ([] if relaunched and kernel_path(device) else [True]), what
    # one launch each; the misaligned call's relaunch asked first, and was declined (nothing launched)
    assert launches == (["fwd"] * (len(calls) + 1) if kernel_path(device) else [])
    check_call(kernel, [t.requires_grad_() for t in make()], gen)  # the seen signature, in grad mode
    q, k, cos, sin = make()
    with pytest.raises(ValueError, match="k must have q's batch size B = 2"), torch.no_grad():
        kernel.apply_rotary_pos_emb(q, k[:1], cos, sin)


@pytest.mark.interpret
@pytest.mark.parametrize("device", DEVICES)
def test_remembered_calls_leave_nothing_for_the_collector(kernel, device, gen):
    """Training on varying sizes meets a new S at nearly every step: the signatures rotary_call
    remembers (ops._SEEN) hold nothing the garbage collector keeps tracking, and a call with no
    launch to repeat (grad mode) shares one entry, so new sizes bring on no full collections."""
    ops = kernel.ops
    for S in (3, 4, 6, 7):
        q, k, cos, sin = make_call(2, S, 4, 2, 64, 64, dtype=torch.bfloat16, device=device, gen=gen)
        q_embed, _ = kernel.apply_rotary_pos_emb(q, k, cos, sin)  # grad mode: q and k require grad
        q_embed.sum().backward()
    for _ in range(3):  # a tuple is let go a collection after its items: three levels of them
        gc.collect()
    assert ops._SEEN and not [key for key in ops._SEEN if gc.is_tracked(key)]
    shared = [entry for entry in ops._SEEN.values() if entry.route is None]
    assert shared and all(entry is ops._CHECKED for entry in shared)


@pytest.mark.parametrize(
    "bad,error,match",
    [
        ({"unsqueeze_dim": 0}, ValueError, "unsqueeze_dim must be 1"),
        ({"unsqueeze_dim": 3}, ValueError, "unsqueeze_dim must be 1"),
        ({"k_batch": 2}, ValueError, "k must have q's batch size B = 3"),
        ({"table_batch": 2}, ValueError, "cos must have batch size 1 or q's batch size 3"),
        ({"table_tokens": 6}, ValueError, "cos must have q's token count S = 5"),
        ({"rot": 7}, ValueError, "R even and at most head_dim"),
        ({"rot": 18}, ValueError, "R even and at most head_dim"),
        ({"head_dim": 15}, ValueError, "head_dim"),
        ({"q_dtype": torch.int32}, TypeError, "q must be float32"),
        ({"table_rank": 2}, ValueError, "cos must be a 3-D tensor"),
    ],
)
def test_bad_input_is_refused_before_any_kernel_runs(kernel, launches, bad, error, match, gen):
    """Clear errors naming the argument, raised before any kernel launch; nothing mutated."""
    B, S, D = 3, 5, bad.get("head_dim", 16)

    def rnd(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=gen).to(dtype)

    q = rnd(B, 4, S, D).to(bad.get("q_dtype", torch.float32))
    k = rnd(bad.get("k_batch", B), 2, S, D)
    rot = bad.get("rot", D)
    table_shape = (bad.get("table_batch", B), bad.get("table_tokens", S), rot)
    cos, sin = rnd(*table_shape), rnd(*table_shape)
    if bad.get("table_rank") == 2:
        cos, sin = cos[0], sin[0]
    snapshot = [t.clone() for t in (q, k, cos, sin)]
    with pytest.raises(error, match=match):
        kernel.apply_rotary_pos_emb(q, k, cos, sin, bad.get("unsqueeze_dim", 1))
    assert launches == []
    assert all(torch.equal(t, s) for t, s in zip((q, k, cos, sin), snapshot))


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph_new_lengths_and_batches(kernel, device, gen):
    """A decoder attention's rotary under torch.compile(fullgraph=True): no graph break, and a
    second sequence length and batch size reuse the first compilation (dynamic sizes)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch.compiler.reset()

    def step(q, k, cos, sin):
        q_embed, k_embed = kernel.apply_rotary_pos_emb(q, k, cos, sin)
        return torch.nn.functional.scaled_dot_product_attention(q_embed, k_embed.repeat_interleave(2, 1), q_embed)

    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(step, backend=counter, fullgraph=True, dynamic=True)
    for i, (B, S) in enumerate(((3, 7), (5, 12))):
        args = make_call(B, S, 4, 2, 64, 64, dtype=torch.float32, device=device, gen=gen, table_grad=True)
        with torch._dynamo.config.patch(error_on_recompile=i > 0):
            out = compiled(*args)
        ref = step(*args)
        assert reference.rel_err(out, ref) <= 1e-5
        w = torch.randn(out.shape, generator=gen).to(out)
        got = torch.autograd.grad(out, args, w)
        want = torch.autograd.grad(ref, args, w)
        assert all(reference.rel_err(g, r) <= 1e-5 for g, r in zip(got, want))
    assert counter.frame_count == 1


@pytest.mark.gpu
def test_deterministic_table_gradient_cuda(kernel, gen):
    """The tables' gradient is summed over heads and, for a shared table, over the batch in a
    fixed order: bit-identical run to run."""
    args = make_call(4, 2048, 32, 8, 128, 128, dtype=torch.bfloat16, device="cuda", gen=gen, table_batch=1)
    args[2].requires_grad_(), args[3].requires_grad_()
    outs = kernel.apply_rotary_pos_emb(*args)
    w = [torch.randn(o.shape, generator=gen).to(o) for o in outs]
    first = torch.autograd.grad(kernel.apply_rotary_pos_emb(*args), args, w)
    for _ in range(3):
        again = torch.autograd.grad(kernel.apply_rotary_pos_emb(*args), args, w)
        assert all(torch.equal(a, b) for a, b in zip(first, again))


@pytest.mark.gpu
@pytest.mark.whole_gpu
@pytest.mark.skipif(
    HAS_CUDA and torch.cuda.get_device_properties(0).total_memory < 60 * 2**30, reason="needs a GPU of 60 GiB"
)
def test_past_2_31_elements_cuda(kernel, gen):
    """A batch whose q has more than 2^31 elements (offsets past int32): the last sequence's
    last tokens, forward and q's gradient, against float64."""
    B, S, HQ, HK, D = 2, 2**18 + 64, 32, 1, 128  # q: 2 * 2^18 * 4096 > 2^31 elements
    q = torch.randn(B, S, HQ * D, device="cuda", dtype=torch.bfloat16).unflatten(-1, (HQ, D)).transpose(1, 2)
    k = torch.randn(B, HK, S, D, device="cuda", dtype=torch.bfloat16)
    angles = torch.randn(1, S, D, device="cuda")
    cos, sin = angles.cos().bfloat16(), angles.sin().bfloat16()
    q.requires_grad_()
    assert q.numel() > 2**31
    q_embed, _ = kernel.apply_rotary_pos_emb(q, k, cos, sin)
    g = torch.randn_like(q_embed)
    (dq,) = torch.autograd.grad(q_embed, q, g)
    tail = slice(S - 16, S)
    ref_q, _ = llama_rotary(*(t[-1:, :, tail].double() for t in (q.detach(), k)), cos[:, tail].double(),
                            sin[:, tail].double())  # fmt: skip
    assert reference.rel_err(q_embed[-1:, :, tail], ref_q) <= 8e-3
    leaf = q.detach()[-1:, :, tail].double().requires_grad_()
    (ref_dq,) = torch.autograd.grad(llama_rotary(leaf, leaf, cos[:, tail].double(), sin[:, tail].double())[0], leaf,
                                    g[-1:, :, tail].double())  # fmt: skip
    assert reference.rel_err(dq[-1:, :, tail], ref_dq) <= 8e-3


@pytest.mark.interpret
@pytest.mark.parametrize("device", DEVICES)
def test_torch_func_transforms(kernel, device, gen):
    """vmap over samples of a batched call with a shared table (the table's per-sample gradient
    summed over its sequences), jvp in q and the tables, and double backward, against the same
    transforms of the float64 reference."""
    q, k, cos, sin = (t.detach() for t in make_call(2, 5, 4, 2, 16, 16, dtype=torch.float32, device=device, gen=gen,
                                                    table_batch=1))  # fmt: skip
    qs = torch.randn(3, *q.shape, generator=gen).to(q)

    def loss(fn, q, cos):
        return sum((o * o).sum() for o in fn(q, k.to(q.dtype), cos, sin.to(cos.dtype)))

    ours = kernel.apply_rotary_pos_emb
    grads = torch.func.vmap(torch.func.grad(lambda q, c: loss(ours, q, c), argnums=(0, 1)), in_dims=(0, None))(qs, cos)
    want = torch.func.vmap(torch.func.grad(lambda q, c: loss(llama_rotary, q, c), argnums=(0, 1)), in_dims=(0, None))(
        qs.double(), cos.double()
    )
    assert grads[1].shape == (3, *cos.shape)
    assert all(reference.rel_err(g, w) <= 2e-6 for g, w in zip(grads, want))
    tangents = (torch.randn(q.shape, generator=gen).to(q), torch.randn(cos.shape, generator=gen).to(cos))
    _, got = torch.func.jvp(lambda q, c: ours(q, k, c, sin)[0], (q, cos), tangents)
    _, ref = torch.func.jvp(lambda q, c: llama_rotary(q, k.double(), c, sin.double())[0], (q.double(), cos.double()),
                            tuple(t.double() for t in tangents))  # fmt: skip
    assert reference.rel_err(got, ref) <= 2e-6
    leaves = [t.clone().requires_grad_() for t in (q, cos)]
    (gq,) = torch.autograd.grad(loss(ours, *leaves), leaves[0], create_graph=True)
    (h,) = torch.autograd.grad(gq.sum(), leaves[1])
    ref_leaves = [t.double().requires_grad_() for t in (q, cos)]
    (ref_gq,) = torch.autograd.grad(loss(llama_rotary, *ref_leaves), ref_leaves[0], create_graph=True)
    (ref_h,) = torch.autograd.grad(ref_gq.sum(), ref_leaves[1])
    assert reference.rel_err(h, ref_h) <= 2e-6


def test_one_compile_key_for_every_batch_and_length(kernel):
    """The launch's layout key (what keys a compiled kernel, with the configuration) of the
    decoders' forward and backward is the same for every batch size above one and every sequence
    length: the attention views, sdpa's [B, H, S, D] gradient, tables per sequence or shared. A
    batch of one keys the vision call's code (batch strides 0)."""
    launch = submodule(kernel, "launch")
    HQ, HK, D = 8, 2, 64

    def key(tensors, S):  # what keys a plan, with the sizes and the configuration
        metas = [t if t is None else (t.shape, t.stride(), t.dtype, t.data_ptr() % 16 == 0) for t in tensors]
        return launch._layout(metas, S)

    def keys(B, S, table_batch):
        q, k = torch.empty(B, S, (HQ + HK) * D).unflatten(-1, (-1, D)).split([HQ, HK], 2)
        cos = torch.empty(table_batch or B, S, D)
        gq, gk = (torch.empty(B, H, S, D).transpose(1, 2) for H in (HQ, HK))
        out_q, out_k = torch.empty(B, S, HQ, D), torch.empty(B, S, HK, D)
        fwd = key((q, k, out_q, out_k, None, None, cos, cos, None, None), S)
        bwd = key((gq, gk, out_q, out_k, q, k, cos, cos, torch.empty(B, S, D), torch.empty(B, S, D)), S)
        return fwd, bwd

    for table_batch in (None, 1):
        batched = {keys(B, S, table_batch) for B in (2, 3, 7) for S in (1, 2, 17, 100, 4097)}
        assert len(batched) == 1, batched
        single = {keys(1, S, table_batch) for S in (1, 2, 17, 100, 4097)}
        assert len(single) == 1 and single != batched
        ((fwd, _),) = single
        assert all(lay is None or lay[0][1] == 0 for lay in fwd)  # no batch stride: BATCHED off


def family_rotary(variant, q, k, cos, sin, unsqueeze_dim=1):
    """A decoder family's rotary in `variant`, written as transformers' families write it, in the
    inputs' dtypes: rotate_half, rotate_pairwise, or pairwise from a table repeated per pair
    (GLM); a table of one value per pair (GPT-OSS: for both halves; DeepSeek-V4: repeated); the
    first cos.shape[-1] channels rotated, or the last (DeepSeek-V4); outputs as the variant's dtype
    rule says."""
    if variant.pairs == "repeated":
        cos, sin = (t[..., : t.shape[-1] // 2].repeat_interleave(2, dim=-1) for t in (cos, sin))
    if variant.table == "pair" and variant.pairs == "halves":
        cos, sin = (torch.cat((t, t), dim=-1) for t in (cos, sin))
    elif variant.table == "pair":
        cos, sin = (t.repeat_interleave(2, dim=-1) for t in (cos, sin))
    R = cos.shape[-1]
    c, s = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    turn = reference.rotate_half if variant.pairs == "halves" else reference.rotate_pairwise
    last = variant.rotated == "last"

    def apply(x):
        x_rot, x_pass = (x[..., -R:], x[..., :-R]) if last else (x[..., :R], x[..., R:])
        parts = (x_rot * c + turn(x_rot) * s, x_pass.to(torch.promote_types(x.dtype, c.dtype)))
        y = torch.cat(parts[::-1] if last else parts, dim=-1)
        return y.to({"kept": x.dtype, "q": q.dtype}[variant.dtypes]) if variant.dtypes != "promoted" else y

    return apply(q), (None if k is None else apply(k))


DECODER_VARIANTS = [
    *(
        (form, pairs, dtypes, "channel", "first")
        for form in ("decoder", "single")
        for pairs in ("halves", "interleaved", "repeated")
        for dtypes in ("kept", "promoted", "q")
        if not (form == "single" and dtypes == "q")
    ),
    ("decoder", "halves", "promoted", "pair", "first"),  # GPT-OSS
    ("decoder", "interleaved", "promoted", "pair", "first"),  # OpenAI's privacy filter
    ("single", "interleaved", "kept", "pair", "last"),  # DeepSeek-V4
]


@pytest.mark.interpret(
    device="cpu",
    variant=[
        ("decoder", "repeated", "promoted", "channel", "first"),
        ("single", "halves", "promoted", "channel", "first"),
        ("decoder", "interleaved", "q", "channel", "first"),
        ("decoder", "halves", "kept", "channel", "first"),
        ("decoder", "halves", "promoted", "pair", "first"),
        ("single", "interleaved", "kept", "pair", "last"),
    ],
)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", DECODER_VARIANTS, ids="-".join)
def test_decoder_layers(kernel, device, variant, gen):
    """Each decoder layer on its family's call: values, dtypes (bf16 q, float32 k and tables, on
    which the dtype rules differ) and gradients against the family's own function in float64
    (values) and in the inputs' dtypes (the dtypes), a partial table, unsqueeze_dim 1 and 2."""
    assert sorted(v for v in kernel.layers.VARIANTS if v.form in ("decoder", "single")) == sorted(DECODER_VARIANTS)
    variant = next(v for v in kernel.layers.VARIANTS if tuple(v) == variant)
    layer = variant.layer_name
    module = getattr(kernel.layers, layer)()
    for unsqueeze_dim, R in ((1, 64), (2, 48)):
        R //= 2 if variant.table == "pair" else 1  # the table's width
        q, k, cos, sin = make_call(2, 7, 4, 2, 64, R, dtype=torch.float32, device=device, gen=gen, table_grad=True,
                                   unsqueeze_dim=unsqueeze_dim)  # fmt: skip
        q = q.detach().bfloat16().requires_grad_()
        args = (q, cos, sin) if variant.form == "single" else (q, k, cos, sin)
        outs = module(*args, unsqueeze_dim)
        outs = [outs] if variant.form == "single" else list(outs)
        with torch.no_grad():
            own = [o for o in family_rotary(variant, q, None if variant.form == "single" else k, cos, sin,
                                            unsqueeze_dim) if o is not None]  # fmt: skip
        assert [o.dtype for o in outs] == [o.dtype for o in own] and [o.shape for o in outs] == [o.shape for o in own]
        leaves = [t.detach().double().requires_grad_() for t in args]
        ref = family_rotary(variant._replace(dtypes="promoted"), leaves[0], None if len(leaves) == 3 else leaves[1],
                            *leaves[-2:], unsqueeze_dim)  # fmt: skip
        ref = [r for r in ref if r is not None]
        for o, r in zip(outs, ref):
            assert reference.rel_err(o, r) <= 8e-3, (layer, unsqueeze_dim)
        cot = [torch.randn(o.shape, generator=gen).to(o) for o in outs]
        grads = torch.autograd.grad(outs, args, cot)
        ref_grads = torch.autograd.grad(ref, leaves, [c.double() for c in cot])
        for g, r, a in zip(grads, ref_grads, args):
            assert g.dtype == a.dtype and reference.rel_err(g, r) <= 8e-3, (layer, unsqueeze_dim)


@pytest.mark.interpret(device="cpu", dtype=torch.bfloat16)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefix_layer(kernel, device, dtype, gen):
    """DINOv3's call: q, k [B, H, N, D] views of one projection, cos/sin [P, D] for the last P
    tokens (the class and register tokens before them pass through): values, dtypes and every
    gradient against the family's function in float64, with P = N, N - 5 and 0."""
    variant = next(v for v in kernel.layers.VARIANTS if v.form == "prefix")
    module = getattr(kernel.layers, variant.layer_name)()
    B, N, H, D = 2, 9, 4, 64
    for P in (N, N - 5, 0):
        proj = torch.randn(B, N, 2 * H * D, generator=gen).to(device=device, dtype=dtype)
        q, k = (x.unflatten(-1, (H, D)).transpose(1, 2).detach().requires_grad_() for x in proj.chunk(2, -1))
        angles = torch.randn(P, D, generator=gen, dtype=torch.float64)
        cos, sin = (f(angles).to(device=device, dtype=dtype).requires_grad_() for f in (torch.cos, torch.sin))
        outs = module(q, k, cos, sin)
        assert [(o.shape, o.dtype) for o in outs] == [(x.shape, x.dtype) for x in (q, k)]
        leaves = [t.detach().double().requires_grad_() for t in (q, k, cos, sin)]

        def own(x, c, s):  # transformers' DINOv3 function
            pre, patches = x.split((N - P, P), dim=-2)
            return torch.cat((pre, patches * c + reference.rotate_half(patches) * s), dim=-2)

        ref = [own(x, *leaves[2:]) for x in leaves[:2]]
        for o, r in zip(outs, ref):
            assert reference.rel_err(o, r) <= tolerance(dtype)
        cot = [torch.randn(o.shape, generator=gen).to(o) for o in outs]
        grads = torch.autograd.grad(outs, (q, k, cos, sin), cot)
        ref_grads = torch.autograd.grad(ref, leaves, [c.double() for c in cot])
        for g, r in zip(grads, ref_grads):
            assert reference.rel_err(g, r) <= tolerance(dtype)


@pytest.mark.interpret(device="cpu")
@pytest.mark.parametrize("device", DEVICES)
def test_heads_of_512_with_a_trailing_rope_slice(kernel, device, gen):
    """DeepSeek-V4's call: heads of 512 channels whose last 64 rotate (a table of 32 values per
    pair), the other 448 passed through; q with 64 heads, the key/value with one, bf16, each called
    alone: values and every gradient against float64."""
    variant = next(v for v in kernel.layers.VARIANTS if v.rotated == "last")
    module = getattr(kernel.layers, variant.layer_name)()
    for H in (64, 1):
        x, _, cos, sin = make_call(1, 7, H, 1, 512, 32, dtype=torch.bfloat16, device=device, gen=gen, table_grad=True)
        out = module(x, cos, sin)
        assert out.shape == x.shape and out.dtype == x.dtype
        leaves = [t.detach().double().requires_grad_() for t in (x, cos, sin)]
        ref, _ = family_rotary(variant, leaves[0], None, *leaves[1:])
        assert reference.rel_err(out, ref) <= tolerance(torch.bfloat16)
        assert torch.equal(out[..., :448], x[..., :448])  # passed through, bit for bit
        cot = torch.randn(out.shape, generator=gen).to(out)
        grads = torch.autograd.grad(out, (x, cos, sin), cot)
        for g, r in zip(grads, torch.autograd.grad(ref, leaves, cot.double())):
            assert reference.rel_err(g, r) <= tolerance(torch.bfloat16)
