"""Special values and layouts, for every public function (and the vision rotary with
interleaved pairs over part of each head), against float64: NaN/inf propagate exactly as
in the reference (same NaN and inf positions, same inf signs, including through the sum
over heads in the table gradient); S = 0 and S = 1; non-contiguous upstream gradients,
strided q/k (views of one qkv projection), strided tables. Shapes are tiny so that the
file also runs under TRITON_INTERPRET=1, where the Triton kernel itself computes on the CPU.

Tolerances (norm-wise relative error against float64 of the same rounded inputs):
fp32 2e-6: every output is a short sum (at most 2 products per head, at most
2*(HQ + HK) terms) in fp32 with sin/cos good to ~1 ulp, i.e. ~1e-7; a wrong sign,
partner or table entry costs O(1). bf16 1e-2 and fp16 2e-3: a few times the
rounding of the output itself (2^-8, 2^-11)."""

import pytest
import torch

from .helpers import DEVICES
from .reference import reference_backward, reference_rotary_grads, rel_err

# rope_fwd and the vision forms run forward and backward; "vision_interleaved_partial" is
# apply_rotary_pos_emb_vision(interleaved=True) with cos/sin [S, R], R < D.
FUNCS = ["rope_bwd", "rope_fwd", "apply_rotary_pos_emb_vision", "vision_interleaved_partial"]
TABLES = {
    "rope_fwd": ("embeddings",),
    "apply_rotary_pos_emb_vision": ("cos", "sin"),
    "vision_interleaved_partial": ("cos", "sin"),
}
TOL = {torch.float32: 2e-6, torch.bfloat16: 1e-2, torch.float16: 2e-3}
SENTINEL = 1234.5  # poison of out= buffers: finite, so that an unwritten element cannot pass as NaN


def rnd(gen, *shape):
    return torch.randn(*shape, generator=gen)


def restride(t, layout, gen):
    """The same values in another memory layout."""
    if layout == "transposed":  # the first two dimensions swapped in memory
        return t.transpose(0, 1).contiguous().transpose(0, 1)
    if layout == "step":  # every other element of a larger buffer of random junk, in every dimension
        buf = rnd(gen, *(2 * n for n in t.shape)).to(device=t.device, dtype=t.dtype)
        view = buf[tuple(slice(None, None, 2) for _ in t.shape)]
        view.copy_(t)
        return view
    return t


def make(
    fn,
    gen,
    device,
    *,
    S=5,
    HQ=3,
    HK=2,
    D=12,
    dtype=torch.float32,
    grads="contiguous",
    qk="contiguous",
    table="contiguous",
    requires_grad=False,
):
    """Random inputs of fn, by name. D = 12: a half of 6 exercises the masked channels; the
    partial form rotates R = 6 of them (3 pairs) and passes 6 through.
    qk = "qkv": q and k are views of one [S, 3*H*D] projection (then HK = HQ)."""
    HK = HQ if qk == "qkv" else HK
    R = D // 2 if fn == "vision_interleaved_partial" else D

    def x(*shape, dtype=dtype):
        return rnd(gen, *shape).to(device=device, dtype=dtype)

    args = {"grad_q_embed": restride(x(S, HQ, D), grads, gen), "grad_k_embed": restride(x(S, HK, D), grads, gen)}
    if qk == "qkv":
        qkv = x(S, 3 * HQ * D).requires_grad_(requires_grad)
        args["q"], args["k"], _ = qkv.reshape(S, 3, HQ, D).permute(1, 0, 2, 3).unbind(0)
    else:
        args["q"], args["k"] = (restride(x(S, h, D), qk, gen).requires_grad_(requires_grad) for h in (HQ, HK))
    for n in TABLES.get(fn, ("embeddings",)):
        args[n] = restride(x(S, R, dtype=torch.float32), table, gen).requires_grad_(requires_grad)
    return args


def reference(fn, args):
    """float64: the outputs fn returns, then (autograd forms) the gradients of q, k and the table."""
    if fn == "rope_bwd":
        return list(reference_backward(*args.values()))
    outs, grads = reference_rotary_grads(
        *(args[n] for n in ("grad_q_embed", "grad_k_embed", "q", "k", *TABLES[fn])),
        interleaved=fn == "vision_interleaved_partial",
    )
    return outs + grads


def call(kernel, fn, *inputs):
    if fn == "vision_interleaved_partial":
        return kernel.apply_rotary_pos_emb_vision(*inputs, interleaved=True)
    return getattr(kernel, fn)(*inputs)


def evaluate(kernel, fn, args):
    """fn on args; rope_bwd runs twice (into poisoned out= buffers, and allocating),
    the others forward and backward. Returns (results, reference)."""
    ref = reference(fn, args)
    if fn == "rope_bwd":
        inputs = list(args.values())
        out = tuple(torch.full_like(args[n], SENTINEL) for n in ("q", "k", "embeddings"))
        got = kernel.rope_bwd(*inputs, out=out)
        assert all(g is o for g, o in zip(got, out))
        return [*got, *kernel.rope_bwd(*inputs)], ref + ref
    inputs = [args[n] for n in ("q", "k", *TABLES[fn])]
    outs = call(kernel, fn, *inputs)
    grads = torch.autograd.grad(outs, inputs, [args["grad_q_embed"], args["grad_k_embed"]])
    return [o.detach() for o in outs] + list(grads), ref


def assert_close(got, ref, *, what=""):
    assert len(got) == len(ref)
    for i, (g, r) in enumerate(zip(got, ref)):
        assert g.shape == r.shape, f"{what} result {i}: shape"
        g64 = g.detach().cpu().double()
        assert torch.equal(g64.isnan(), r.isnan()), f"{what} result {i}: NaN positions differ from the reference"
        assert torch.equal(g64.isinf(), r.isinf()), f"{what} result {i}: inf positions differ from the reference"
        assert torch.equal(g64[r.isinf()], r[r.isinf()]), f"{what} result {i}: inf signs differ"
        fin = r.isfinite()
        err = rel_err(g64[fin], r[fin])
        assert err <= TOL[g.dtype], f"{what} result {i} ({g.dtype}): rel err {err:.3g}"


# ------------------------------------------------------------- NaN and inf

SPECIAL_INPUTS = {
    "rope_bwd": ["grad_q_embed", "grad_k_embed", "q", "k", "embeddings"],
    "rope_fwd": ["grad_q_embed", "q", "k", "embeddings"],
    "apply_rotary_pos_emb_vision": ["grad_k_embed", "k", "cos", "sin"],
    "vision_interleaved_partial": ["grad_q_embed", "q", "cos", "sin"],
}


def plant_specials(t, gen):
    """NaN in token 0, +inf in token 2, and in token 4 +inf and -inf in one channel of
    two heads (of a table: two channels): besides plain propagation, a sum over heads
    that meets inf - inf or inf + inf, depending on the signs of the other factors."""
    t = t.detach()
    if t.dim() == 2:
        d0, d1 = torch.randperm(t.shape[1], generator=gen)[:2].tolist()
        t[0, d0], t[2, d1], t[4, d0], t[4, d1] = float("nan"), float("inf"), float("inf"), float("-inf")
        return
    H, D = t.shape[1:]
    h = torch.randint(H, (), generator=gen).item()
    d = torch.randint(D, (), generator=gen).item()
    t[0, h, d], t[2, h, d] = float("nan"), float("inf")
    t[4, h, d], t[4, (h + 1) % H, d] = float("inf"), float("-inf")


# Under TRITON_INTERPRET numpy evaluates the kernel and warns about the NaNs it is meant to make.
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.interpret(dtype=torch.float32)
@pytest.mark.interpret(dtype=torch.bfloat16, where=["q", "k"])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("fn,where", [(f, w) for f in FUNCS for w in SPECIAL_INPUTS[f]])
def test_nan_inf_propagate_like_reference(kernel, gen, device, dtype, fn, where):
    args = make(fn, gen, device, dtype=dtype, requires_grad=fn != "rope_bwd")
    plant_specials(args[where], gen)
    got, ref = evaluate(kernel, fn, args)
    assert any(not r.isfinite().all() for r in ref), "the special values reach no output: the case tests nothing"
    assert_close(got, ref, what=f"{fn} with NaN/inf in {where}")


# ------------------------------------------------------------ S = 0 and 1


@pytest.mark.kernels_ci
@pytest.mark.interpret
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("S", [0, 1])
@pytest.mark.parametrize("fn", FUNCS)
def test_tiny_sequence(kernel, gen, device, S, fn):
    args = make(fn, gen, device, S=S, requires_grad=fn != "rope_bwd")
    got, ref = evaluate(kernel, fn, args)
    assert_close(got, ref, what=f"{fn} S={S}")


# ----------------------------------------------------------------- layouts

LAYOUTS = [  # (upstream gradients, q and k, table)
    ("transposed", "contiguous", "contiguous"),
    ("step", "contiguous", "contiguous"),
    ("contiguous", "qkv", "contiguous"),
    ("transposed", "qkv", "step"),
    ("step", "step", "transposed"),
]


@pytest.mark.interpret(dtype=torch.float32)
@pytest.mark.interpret(grads="transposed", qk="qkv", table="step")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("grads,qk,table", LAYOUTS, ids=["-".join(lay) for lay in LAYOUTS])
@pytest.mark.parametrize("fn", FUNCS)
def test_strided_layouts(kernel, gen, device, dtype, grads, qk, table, fn):
    """Same values in other layouts: results as exact as for contiguous inputs, and
    the strided inputs themselves untouched."""
    args = make(fn, gen, device, dtype=dtype, grads=grads, qk=qk, table=table, requires_grad=fn != "rope_bwd")
    assert not all(t.is_contiguous() for t in args.values())
    before = [t.detach().clone() for t in args.values()]
    got, ref = evaluate(kernel, fn, args)
    assert_close(got, ref, what=f"{fn} layouts {grads}/{qk}/{table}")
    for b, t in zip(before, args.values()):
        assert torch.equal(b, t.detach())


@pytest.mark.interpret
@pytest.mark.parametrize("device", DEVICES)
def test_real_model_pattern_gradient_reaches_qkv(kernel, gen, device):
    """Qwen-style bf16 training step: q, k views of one qkv projection, cos/sin buffers
    (no gradient); the gradient that reaches the projection output is exact, and v's
    third of it is zero."""
    S, H, D = 7, 2, 72
    qkv = rnd(gen, S, 3 * H * D).to(device=device, dtype=torch.bfloat16).requires_grad_()
    q, k, _ = qkv.reshape(S, 3, H, D).permute(1, 0, 2, 3).unbind(0)
    freqs = rnd(gen, S, D // 2).to(device)
    emb = torch.cat((freqs, freqs), dim=-1)
    gq, gk = (rnd(gen, S, H, D).to(device=device, dtype=torch.bfloat16) for _ in range(2))
    outs = kernel.apply_rotary_pos_emb_vision(q, k, emb.cos(), emb.sin())
    torch.autograd.backward(outs, [gq, gk])
    dq, dk, _ = reference_backward(gq, gk, q, k, emb)
    grad = qkv.grad.reshape(S, 3, H, D)
    assert rel_err(grad[:, 0], dq) <= TOL[torch.bfloat16]
    assert rel_err(grad[:, 1], dk) <= TOL[torch.bfloat16]
    assert not grad[:, 2].any()
