"""The dtype policy, as the public functions' docstrings state it:
    float32, bfloat16, float16   the kernel (CUDA; CPU under TRITON_INTERPRET=1), math in float32
    float64                      accepted on every device: math in float64 on the PyTorch path
    q and k of different dtypes  accepted, as transformers does: each output and gradient in the
                                 dtype of its own tensor (the table's gradient in the table's)
    out=                         not differentiable (as torch's out= functions): a tensor that
                                 requires grad is refused under grad mode, accepted under no_grad
Every result is compared with a float64 evaluation of the math (reference.py)."""

import importlib
import inspect
import itertools

import pytest
import torch
import torch.autograd.forward_ad as fwAD

from . import reference as ref64
from .helpers import DEVICES, kernel_path

S, HQ, HK, D = 9, 2, 3, 16
TOL = {torch.float32: 2e-6, torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float64: 1e-12}
HALF_AND_FULL = [torch.float32, torch.bfloat16, torch.float16]
PAIRS = [p for p in itertools.permutations(HALF_AND_FULL, 2)]
# rope_fwd and the vision forms run forward and backward; "vision_interleaved_partial" is
# apply_rotary_pos_emb_vision(interleaved=True) with cos/sin [S, 10] (6 channels pass through).
FUNCS = ["rope_bwd", "rope_fwd", "apply_rotary_pos_emb_vision", "vision_interleaved_partial"]


def rnd(gen, device, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)


def call(kernel, fn, *args):
    if fn == "vision_interleaved_partial":
        return kernel.apply_rotary_pos_emb_vision(*args, interleaved=True)
    return getattr(kernel, fn)(*args)


def run(kernel, fn, q, k, tables, grads):
    """fn's results: outputs, then (autograd forms) the gradients of q, k and the tables;
    each with the dtype its result must have."""
    if fn == "rope_bwd":
        out = kernel.rope_bwd(*grads, q, k, *tables)
        return list(zip(out, (q.dtype, k.dtype, tables[0].dtype)))
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, *tables)]
    outs = call(kernel, fn, *leaves)
    torch.autograd.backward(outs, grads)
    return list(zip([*outs, *(t.grad for t in leaves)], [q.dtype, k.dtype, *(t.dtype for t in leaves)]))


def reference(fn, q, k, tables, grads):
    """float64: outputs, then gradients of q, k and the tables (rope_bwd: its three results)."""
    outs, grad = ref64.reference_rotary_grads(*grads, q, k, *tables, interleaved=fn == "vision_interleaved_partial")
    return grad if fn == "rope_bwd" else outs + grad


def make(fn, gen, device, q_dtype, k_dtype, table_dtype=torch.float32):
    q, k = rnd(gen, device, S, HQ, D, dtype=q_dtype), rnd(gen, device, S, HK, D, dtype=k_dtype)
    R = 10 if fn == "vision_interleaved_partial" else D
    tables = [rnd(gen, device, S, R, dtype=table_dtype) for _ in range(1 if fn.startswith("rope") else 2)]
    grads = [rnd(gen, device, S, HQ, D, dtype=q_dtype), rnd(gen, device, S, HK, D, dtype=k_dtype)]
    return q, k, tables, grads


def check(got, ref, what):
    assert len(got) == len(ref)
    for i, ((g, dtype), r) in enumerate(zip(got, ref)):
        assert g.dtype == dtype, f"{what} result {i}: dtype {g.dtype}, expected {dtype}"
        # a table's gradient is float32 math on exactly widened inputs: float32 accuracy
        tol = TOL[torch.float32] if g.dim() == 2 and dtype == torch.float32 else TOL[dtype]
        err = ref64.rel_err(g, r)
        assert err <= tol, f"{what} result {i} ({dtype}): rel err {err:.2e} > {tol:.0e}"


@pytest.mark.kernels_ci
@pytest.mark.interpret(fn="rope_bwd", pair=[PAIRS[0], PAIRS[5]])
@pytest.mark.interpret(fn="rope_fwd", pair=PAIRS[1])
@pytest.mark.interpret(fn="apply_rotary_pos_emb_vision", pair=[PAIRS[2], PAIRS[3]])
@pytest.mark.interpret(fn="vision_interleaved_partial", pair=PAIRS[4])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{str(p[0])[6:]}-{str(p[1])[6:]}")
@pytest.mark.parametrize("fn", FUNCS)
def test_q_and_k_of_different_dtypes(kernel, launches, fn, pair, device, gen):
    """transformers' vision rotary casts q and k to float32 and each result back to its own
    dtype; so do we, on the kernel's path too (each tensor converted on load and store)."""
    q, k, tables, grads = make(fn, gen, device, *pair)
    check(run(kernel, fn, q, k, tables, grads), reference(fn, q, k, tables, grads), f"{fn} q {pair[0]}, k {pair[1]}")
    assert (len(launches) > 0) == kernel_path(device)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_omni_moe"])
def test_mixed_dtypes_as_transformers(kernel, family, gen):
    """Same dtypes out as transformers' own function, and the same values up to the rounding
    of the outputs (both compute in float32)."""
    original = importlib.import_module(f"transformers.models.{family}.modeling_{family}").apply_rotary_pos_emb_vision
    assert inspect.isfunction(original), "transformers' function is patched (a kernelize test leaked)"
    q, k, (cos, sin), _ = make("apply_rotary_pos_emb_vision", gen, "cpu", torch.bfloat16, torch.float32)
    ours, theirs = kernel.apply_rotary_pos_emb_vision(q, k, cos, sin), original(q, k, cos, sin)
    for a, b in zip(ours, theirs):
        assert a.dtype == b.dtype and ref64.rel_err(a, b) <= TOL[b.dtype]


@pytest.mark.kernels_ci
@pytest.mark.interpret
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fn", FUNCS)
def test_float64_on_every_device(kernel, launches, fn, device, gen):
    """float64 (gradcheck, references) is accepted on every device and computed in float64 by
    the PyTorch path: the kernel computes in float32, so it does not run."""
    q, k, tables, grads = make(fn, gen, device, torch.float64, torch.float64, torch.float64)
    check(run(kernel, fn, q, k, tables, grads), reference(fn, q, k, tables, grads), f"{fn} float64")
    assert not launches


@pytest.mark.interpret
@pytest.mark.parametrize("device", DEVICES)
def test_float64_table_with_float32_heads(kernel, launches, device, gen):
    """A float64 table with float32 q/k: float32 math (as for any table dtype), gradient float64;
    the PyTorch path computes it (the kernel takes no float64 table)."""
    q, k, tables, grads = make("rope_fwd", gen, device, torch.float32, torch.float32, torch.float64)
    got = run(kernel, "rope_fwd", q, k, tables, grads)
    assert got[-1][0].dtype == torch.float64
    ref = reference("rope_fwd", q, k, tables, grads)
    for (g, _), r in zip(got, ref):
        assert ref64.rel_err(g, r) <= TOL[torch.float32]
    assert not launches


@pytest.mark.parametrize("device", DEVICES)
def test_out_under_no_grad_accepts_tensors_that_require_grad(kernel, device, gen):
    """As torch's in-place rule: under no_grad, out= may be a leaf that requires grad, and inputs
    may require grad; the results are written there, and carry no graph."""
    gq, gk, q, k = (rnd(gen, device, S, h, D) for h in (HQ, HK, HQ, HK))
    e = rnd(gen, device, S, D)
    out = [torch.full_like(t, float("nan")).requires_grad_() for t in (q, k, e)]
    with torch.no_grad():
        got = kernel.rope_bwd(gq, gk, q.requires_grad_(), k, e, out=out)
    assert all(g is o for g, o in zip(got, out)) and all(o.grad_fn is None for o in out)
    for o, r in zip(out, ref64.reference_backward(gq, gk, q, k, e)):
        assert ref64.rel_err(o, r) <= TOL[torch.float32]


@pytest.mark.parametrize("device", DEVICES)
def test_out_refuses_a_forward_mode_tangent(kernel, device, gen):
    gq, gk, q, k = (rnd(gen, device, S, h, D) for h in (HQ, HK, HQ, HK))
    e = rnd(gen, device, S, D)
    out = [torch.full_like(t, float("nan")) for t in (q, k, e)]
    with fwAD.dual_level():
        dual = fwAD.make_dual(k, torch.ones_like(k))
        with pytest.raises(ValueError, match="^rope_bwd: k carries a forward-mode tangent, but results written"):
            kernel.rope_bwd(gq, gk, q, dual, e, out=out)
        # without out=, the tangent goes through
        tangent = fwAD.unpack_dual(kernel.rope_bwd(gq, gk, q, dual, e)[2]).tangent
    assert tangent is not None and tangent.abs().sum() > 0
    assert all(o.isnan().all() for o in out), "a refused call wrote into out="


@pytest.mark.parametrize("device", DEVICES)
def test_mixed_dtypes_compile(kernel, device, gen):
    """The ops' fake implementations give each output its own dtype: torch.compile agrees."""
    torch.compiler.reset()
    q, k, tables, grads = make("apply_rotary_pos_emb_vision", gen, device, torch.bfloat16, torch.float32)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, *tables)]
    outs = torch.compile(kernel.apply_rotary_pos_emb_vision, fullgraph=True)(*leaves)
    torch.autograd.backward(outs, grads)
    dtypes = [torch.bfloat16, torch.float32] * 2 + [torch.float32] * 2
    got = list(zip([*outs, *(t.grad for t in leaves)], dtypes))
    check(got, reference("apply_rotary_pos_emb_vision", q, k, tables, grads), "compiled")
    torch.compiler.reset()
