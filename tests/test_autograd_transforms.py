"""Derivatives past the first backward, for the public functions: double backward
(create_graph), torch.func (grad, vmap, jvp, hessian, per-sample gradients) and
forward-mode AD; rope_fwd's angles, the vision rotary's cos/sin, and cos/sin of
interleaved pairs over part of each head (the channels past them pass through, so their
derivatives in the table are zero).

float64 runs the PyTorch path on every device: gradcheck and gradgradcheck there (forward
mode, batched, i.e. vmap, and forward-over-reverse included) hold the package's rules to
finite differences. The kernel's path (CUDA tensors; CPU tensors when the process has
TRITON_INTERPRET=1, as scripts/test.sh runs this file) is then held, on float32 inputs, to
a float64 evaluation of the same derivatives through reference.py's plain-PyTorch references;
kernel launches are counted, so that a silent fall back to the PyTorch path fails.
"""

import pytest
import torch
import torch.autograd.forward_ad as fwAD
from torch.autograd import gradcheck, gradgradcheck

from . import reference
from .helpers import DEVICES, kernel_path

S, HQ, HK, D = 7, 2, 3, 8
FP32_TOL = 2e-6  # a few fp32 roundings per element (as in test_ops)
# form -> (public function, interleaved pairs, names of its table arguments, their width: R < D is
# partial rotary, here 3 pairs and 2 channels passed through)
FORMS = {
    "angles": ("rope_fwd", False, ("embeddings",), D),
    "vision": ("apply_rotary_pos_emb_vision", False, ("cos", "sin"), D),
    "vision_interleaved_partial": ("apply_rotary_pos_emb_vision", True, ("cos", "sin"), 6),
}


def public(kernel, form):
    name, interleaved = FORMS[form][:2]
    fn = getattr(kernel, name)
    return (lambda *a: fn(*a, interleaved=True)) if interleaved else fn


def plain(form):
    """The form's reference in plain PyTorch (tests/reference.py)."""
    if form == "angles":
        return reference.reference_forward
    return lambda *a: reference.reference_vision_forward(*a, FORMS[form][1])


def rnd(gen, *shape, device="cpu", dtype=torch.float32):
    return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)


def make_inputs(form, gen, device="cpu", dtype=torch.float32, s=S, hq=HQ, hk=HK):
    """(q, k, *tables): fresh random data; the tables are general (halves not equal)."""
    tables = [rnd(gen, s, FORMS[form][3], device=device, dtype=dtype) for _ in FORMS[form][2]]
    return [rnd(gen, s, hq, D, device=device, dtype=dtype), rnd(gen, s, hk, D, device=device, dtype=dtype), *tables]


def f64(tensors):
    return [t.detach().cpu().double() for t in tensors]


def assert_close(got, ref, what):
    for i, (g, r) in enumerate(zip(got, ref)):
        assert g.shape == r.shape, f"{what}[{i}]: shape {tuple(g.shape)} != {tuple(r.shape)}"
        err = reference.rel_err(g, r)
        assert err <= FP32_TOL, f"{what}[{i}]: rel err {err:.2e}"


# ------------------------------------------------------------ float64 vs finite differences

GRAD_SETS = {"all": None, "heads": (True, True, False, False), "tables": (False, False, True, True)}
# Finite differences perturb each input element twice per output: fewer tokens and heads (GQA kept)
SMALL = dict(s=2, hq=2, hk=1)


@pytest.mark.parametrize("which", GRAD_SETS)
@pytest.mark.parametrize("form", FORMS)
def test_gradcheck_gradgradcheck_float64(kernel, form, which, gen):
    """First and second derivatives of the rotation, reverse and forward mode, batched (vmap),
    for every subset of inputs that needs a gradient: the real models' (heads only) included."""
    args = make_inputs(form, gen, dtype=torch.float64, **SMALL)
    mask = GRAD_SETS[which] or (True,) * len(args)
    args = [t.requires_grad_(m) for t, m in zip(args, mask)]
    fn = public(kernel, form)
    assert gradcheck(fn, args, check_forward_ad=True, check_batched_grad=True, check_batched_forward_grad=True)
    assert gradgradcheck(fn, args, check_fwd_over_rev=True, check_batched_grad=True)


@pytest.mark.kernels_ci
def test_rope_bwd_is_differentiable_float64(kernel, gen):
    """rope_bwd (no out=) is the rotation's backward as a function: linear in the upstream
    gradients, bilinear in them and (q, k) or the table; its derivatives, both orders and modes."""
    s, hq, hk = SMALL.values()
    args = [rnd(gen, s, hq, D), rnd(gen, s, hk, D), rnd(gen, s, hq, D), rnd(gen, s, hk, D), rnd(gen, s, D)]
    args = [t.double().requires_grad_() for t in args]
    assert gradcheck(
        kernel.rope_bwd, args, check_forward_ad=True, check_batched_grad=True, check_batched_forward_grad=True
    )
    assert gradgradcheck(kernel.rope_bwd, args, check_fwd_over_rev=True)


@pytest.mark.kernels_ci
def test_third_order_float64(kernel, gen):
    """The double backward is differentiable in turn (its rules call the same functions)."""
    args = [t.double().requires_grad_() for t in make_inputs("angles", gen, **SMALL)]
    weights = [rnd(gen, *t.shape, dtype=torch.float64) for t in args[:2]]

    def grads(*leaves):
        return torch.autograd.grad(kernel.rope_fwd(*leaves), leaves, weights, create_graph=True)

    assert gradgradcheck(grads, args)


# ------------------------------------------------------- the kernel's path against float64


def _double_backward(fn, leaves, weights):
    """Gradients of a loss on the outputs plus a penalty on their gradients (taken with
    create_graph), as gradient penalties do: a backward without a graph of its own would
    drop the penalty's part silently."""
    outs = fn(*leaves)
    first = torch.autograd.grad(outs, leaves, weights[:2], create_graph=True)
    loss = sum((o * w).sum() for o, w in zip(outs, weights[:2]))
    loss = loss + sum((g * w).sum() for g, w in zip(first, weights[2:]))
    return [g.detach() for g in torch.autograd.grad(loss, leaves)]


@pytest.mark.kernels_ci
@pytest.mark.interpret
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("form", FORMS)
def test_double_backward(kernel, launches, device, form, gen):
    """create_graph, then differentiate the gradients again: against plain-PyTorch float64."""
    args = make_inputs(form, gen, device)
    weights = [rnd(gen, *o.shape, device=device) for o in (args[0], args[1], *args)]
    got = _double_backward(public(kernel, form), [t.clone().requires_grad_() for t in args], weights)
    assert (len(launches) > 0) == kernel_path(device) and ("bwd" in launches) == kernel_path(device)
    ref = _double_backward(plain(form), [t.requires_grad_() for t in f64(args)], f64(weights))
    assert_close(got, ref, f"{form} double backward")


@pytest.mark.interpret
@pytest.mark.parametrize("device", DEVICES)
def test_double_backward_of_the_real_models_case(kernel, launches, device, gen):
    """cos/sin from a buffer (no table gradient, so q and k are not saved): the double backward
    in q and k is zero (the rotation is linear in them), in the upstream gradient not."""
    q, k, cos, sin = make_inputs("vision", gen, device)
    leaves = [q.requires_grad_(), k.requires_grad_()]
    gq, gk = (rnd(gen, *t.shape, device=device).requires_grad_() for t in leaves)
    first = torch.autograd.grad(
        kernel.apply_rotary_pos_emb_vision(*leaves, cos, sin), leaves, (gq, gk), create_graph=True
    )
    w = [rnd(gen, *t.shape, device=device) for t in first]
    got = torch.autograd.grad(sum((g * x).sum() for g, x in zip(first, w)), [*leaves, gq, gk], allow_unused=True)
    assert got[0] is None and got[1] is None
    # d/dg of <R^T g, w> = R w: the rotation of the weights
    ref = reference.reference_vision_forward(*f64(w), *f64([cos, sin]))
    assert_close(got[2:], ref, "gradient in the upstream gradients")
    assert (len(launches) > 0) == kernel_path(device)


def _loss(fn, weights):
    return lambda *a: sum((o * w).sum() for o, w in zip(fn(*a), weights))


@pytest.mark.kernels_ci
@pytest.mark.interpret
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("form", FORMS)
def test_func_grad_jvp_and_forward_ad(kernel, launches, device, form, gen):
    fn, reference = public(kernel, form), plain(form)
    args = make_inputs(form, gen, device)
    weights = [rnd(gen, S, HQ, D, device=device), rnd(gen, S, HK, D, device=device)]
    tangents = [rnd(gen, *t.shape, device=device) for t in args]
    argnums = tuple(range(len(args)))
    ref_args, ref_w, ref_t = f64(args), f64(weights), f64(tangents)

    got = torch.func.grad(_loss(fn, weights), argnums=argnums)(*args)
    assert_close(got, torch.func.grad(_loss(reference, ref_w), argnums=argnums)(*ref_args), "func.grad")

    ref_out, ref_tan = torch.func.jvp(reference, tuple(ref_args), tuple(ref_t))
    out, tan = torch.func.jvp(fn, tuple(args), tuple(tangents))
    assert_close(out, ref_out, "func.jvp primal")
    assert_close(tan, ref_tan, "func.jvp tangent")

    with fwAD.dual_level():
        outs = fn(*(fwAD.make_dual(a, t) for a, t in zip(args, tangents)))
        tan = [fwAD.unpack_dual(o).tangent for o in outs]
    assert_close(tan, ref_tan, "forward_ad tangent")
    assert (len(launches) > 0) == kernel_path(device)


@pytest.mark.interpret(form="angles")  # the angles' curvature term; partial rotary's tail: above
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("form", FORMS)
def test_hessian(kernel, launches, device, form, gen):
    """torch.func.hessian (forward over reverse) in the tables and in q. Small: one batched
    launch per call, over one token row per basis vector (the interpreter's time grows with them)."""
    reference = plain(form)
    args = make_inputs(form, gen, device, s=2, hq=1, hk=2)
    weights = [rnd(gen, *t.shape, device=device) for t in args[:2]]
    nonlinear = lambda fn: lambda *a: _loss(fn, weights)(*a) ** 2  # noqa: E731 (a nonzero hessian in q)
    argnums = (0, 2)
    got = torch.func.hessian(nonlinear(public(kernel, form)), argnums=argnums)(*args)
    ref_w = f64(weights)
    ref = torch.func.hessian(lambda *a: _loss(reference, ref_w)(*a) ** 2, argnums=argnums)(*f64(args))
    for i in range(2):
        assert_close(got[i], ref[i], f"hessian row {i}")
    assert (len(launches) > 0) == kernel_path(device)


VMAPS = {  # in_dims of (q, k, *tables), and where the batch sits in the reference
    "heads": (0, 0, None),
    "tables": (None, None, 0),
    "all_dim1": (1, 1, 1),
    "q_only": (0, None, None),
}


@pytest.mark.interpret(form="angles", batching="tables")
@pytest.mark.interpret(form="vision", batching="all_dim1")
@pytest.mark.interpret(form="vision_interleaved_partial", batching="q_only")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("batching", VMAPS)
@pytest.mark.parametrize("form", FORMS)
def test_vmap(kernel, launches, device, form, batching, gen):
    B = 3
    dims = VMAPS[batching][:2] + (VMAPS[batching][2],) * len(FORMS[form][2])
    args = make_inputs(form, gen, device)
    batched = [
        t if d is None else torch.stack([rnd(gen, *t.shape, device=device) for _ in range(B)], d)
        for t, d in zip(args, dims)
    ]
    got = torch.vmap(public(kernel, form), in_dims=dims)(*batched)
    ref = torch.vmap(plain(form), in_dims=dims)(*f64(batched))
    assert_close(got, ref, f"vmap {batching}")
    assert (len(launches) > 0) == kernel_path(device)


@pytest.mark.kernels_ci
@pytest.mark.interpret
@pytest.mark.parametrize("device", DEVICES)
def test_per_sample_gradients(kernel, launches, device, gen):
    """vmap(grad): one table gradient per sample."""
    B = 4
    q, k, e = make_inputs("angles", gen, device)
    qs, ks = (torch.stack([rnd(gen, *t.shape, device=device) for _ in range(B)]) for t in (q, k))
    weights = [rnd(gen, S, HQ, D, device=device), rnd(gen, S, HK, D, device=device)]
    per_sample = torch.func.vmap(torch.func.grad(_loss(kernel.rope_fwd, weights), argnums=(0, 2)), in_dims=(0, 0, None))
    got = per_sample(qs, ks, e)
    for b in range(B):
        leaves = [t.requires_grad_() for t in f64([qs[b], ks[b], e])]
        ref = torch.autograd.grad(_loss(reference.reference_forward, f64(weights))(*leaves), [leaves[0], leaves[2]])
        assert_close([got[0][b], got[1][b]], ref, f"sample {b}")
    assert (len(launches) > 0) == kernel_path(device)


@pytest.mark.interpret
@pytest.mark.parametrize("device", DEVICES)
def test_rope_bwd_under_transforms(kernel, launches, device, gen):
    """rope_bwd under vmap and jvp: against plain-PyTorch float64 (vjp of the reference)."""
    B = 2
    gq, gk, q, k = (rnd(gen, B, S, h, D, device=device) for h in (HQ, HK, HQ, HK))
    e = rnd(gen, S, D, device=device)

    def ref_bwd(gq, gk, q, k, e):
        return torch.func.vjp(reference.reference_forward, q, k, e)[1]((gq, gk))

    dims = (0, 0, 0, 0, None)
    got = torch.vmap(kernel.rope_bwd, in_dims=dims)(gq, gk, q, k, e)
    assert_close(got, torch.vmap(ref_bwd, in_dims=dims)(*f64([gq, gk, q, k, e])), "vmap rope_bwd")
    args = [gq[0], gk[0], q[0], k[0], e]
    tangents = [rnd(gen, *t.shape, device=device) for t in args]
    _, tan = torch.func.jvp(kernel.rope_bwd, tuple(args), tuple(tangents))
    _, ref = torch.func.jvp(ref_bwd, tuple(f64(args)), tuple(f64(tangents)))
    assert_close(tan, ref, "jvp rope_bwd")
    assert (len(launches) > 0) == kernel_path(device)


def test_eager_calls_keep_the_fast_function(kernel, gen):
    """Ordinary eager autograd keeps the Function that sets its context in forward (host time);
    only torch.func transforms and forward-mode AD take the one with setup_context."""
    q, k, cos, sin = (t.requires_grad_() for t in make_inputs("vision", gen))
    assert "EagerRotary" in type(kernel.apply_rotary_pos_emb_vision(q, k, cos, sin)[0].grad_fn).__name__
    with fwAD.dual_level():
        out = kernel.apply_rotary_pos_emb_vision(fwAD.make_dual(q.detach(), torch.ones_like(q)), k, cos, sin)[0]
        assert "RotaryFn" in type(out.grad_fn).__name__
