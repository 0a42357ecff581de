"""The bad-input matrix (docs/design.md, section 8): every public function, on every device.

Each case asserts the exception type, that the message names the argument and
what was expected, that no kernel ran (both compute paths are replaced by a
tripwire), and that nothing was written: inputs and poisoned out= buffers are
bitwise unchanged. Then the valid edge cases next to them: S = 0, q and k with
different head counts, a table dtype other than q's, out= as interleaved views of
one gradient buffer, partial rotary tables of every even width up to D."""

import re

import pytest
import torch

from . import reference
from .helpers import DEVICES

S, HQ, HK, D = 6, 2, 3, 8
OTHER_DEVICE = {"cpu": "meta", "cuda": "cpu"}  # meta: a real second device on CPU-only machines
INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
FP32_TOL = 2e-6  # see test_special_values: a few fp32 roundings, far below any real error


def rnd(gen, device, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)


def make_args(fn, gen, device, *, s=S, hq=HQ, hk=HK, d=D, dtype=torch.float32):
    """Valid random arguments of one public function, by parameter name."""
    heads = {"q": rnd(gen, device, s, hq, d, dtype=dtype), "k": rnd(gen, device, s, hk, d, dtype=dtype)}
    if fn == "apply_rotary_pos_emb_vision":
        return {**heads, "cos": rnd(gen, device, s, d), "sin": rnd(gen, device, s, d)}
    args = {**heads, "embeddings": rnd(gen, device, s, d)}
    if fn == "rope_bwd":
        args = {
            "grad_q_embed": rnd(gen, device, s, hq, d, dtype=dtype),
            "grad_k_embed": rnd(gen, device, s, hk, d, dtype=dtype),
            **args,
        }
    return args


def fresh_out(args, fill=float("nan")):
    """Poisoned out= buffers for rope_bwd."""
    return tuple(torch.full_like(args[n], fill) for n in ("q", "k", "embeddings"))


def bits(t):
    """A copy of t's bits (NaN-safe bitwise comparison); None where there is no memory."""
    if not isinstance(t, torch.Tensor) or t.device.type == "meta":
        return None
    return t.detach().view(INT_OF_SIZE[t.element_size()]).cpu().clone()


def snapshot(values):
    return [bits(v) for v in values]


@pytest.fixture
def tripwire(kernel, monkeypatch):
    """Any kernel launch or CPU-path computation fails the test: errors come first."""

    def boom(*args, **kwargs):
        raise AssertionError("a kernel ran before the bad input was rejected")

    monkeypatch.setattr(kernel.ops, "_launch", boom)
    monkeypatch.setattr(kernel.rotary_torch, "forward", boom)
    monkeypatch.setattr(kernel.rotary_torch, "backward", boom)


def expect_error(kernel, fn, args, exc, match, out=None):
    """Call fn with args (and out=), expect exc whose message matches `match`; check
    that inputs and out= buffers kept every bit."""
    values = list(args.values()) + list(out if isinstance(out, (tuple, list)) else [out])
    before = snapshot(values)
    kwargs = {} if out is None else {"out": out}
    with pytest.raises(exc, match=match):
        getattr(kernel, fn)(*args.values(), **kwargs)
    for b0, b1 in zip(before, snapshot(values)):
        if b0 is not None:
            assert torch.equal(b0, b1), "a failed call wrote into an argument"


# --------------------------------------------------------------- input cases

FUNCS = ["rope_bwd", "rope_fwd", "apply_rotary_pos_emb_vision"]
TABLE_WIDTH_ERROR = (
    r"{name} must be \[S, R\] with R even and at most head_dim 8 \(R < D: partial rotary\), got \(6, {R}\)"
)
GRAD_OF = {"grad_q_embed": "q", "grad_k_embed": "k"}
TABLES = ("embeddings", "cos", "sin")


def _rank(args, name, gen):
    t = args[name]
    args[name] = t[:, 0] if t.dim() == 3 else t[:, None]
    want = r"3-D tensor \[S, H, D\]" if t.dim() == 3 else r"2-D tensor \[S, D\]"
    return ValueError, f"{name} must be a {want}"


def _mismatch_expectation(name):
    if name in GRAD_OF:
        return rf"{name} must have the shape of {GRAD_OF[name]}"
    if name == "k":
        return r"k must have \(S, D\) equal to q's"
    return rf"{name} must have q's token count S = {S}, got {S - 1}"


def _seq(args, name, gen):
    args[name] = args[name][:-1]
    return ValueError, _mismatch_expectation(name)


def _dim(args, name, gen):
    args[name] = args[name][..., :-2]
    return ValueError, _mismatch_expectation(name)


def _heads(args, name, gen):
    t = args[name]
    args[name] = torch.cat([t, t[:, :1]], dim=1)
    return ValueError, _mismatch_expectation(name)


def _int(args, name, gen):
    args[name] = (args[name] * 10).to(torch.int32)
    return TypeError, rf"{name} must be float32, bfloat16, float16 or float64, got torch.int32"


def _dtype(args, name, gen):
    args[name] = args[name].to(torch.bfloat16)
    of = GRAD_OF.get(name) or {"sin": "cos"}[name]
    return ValueError, rf"{name} must have the dtype of {of}"


def _device(args, name, gen):
    t = args[name]
    other = OTHER_DEVICE[t.device.type]
    args[name] = t.to(other)
    return ValueError, rf"{name} is on {other}, but q is on {t.device.type}.*all tensors must be on one device"


def _not_tensor(args, name, gen):
    args[name] = args[name].tolist()
    return TypeError, rf"{name} must be a torch.Tensor, got list"


def _odd_head_dim(args, name, gen):
    for n, t in args.items():
        args[n] = t[..., :-1]
    return ValueError, r"q head_dim \(last dimension\) must be even and in 2\.\.512, got 7"


def _table_width(R):
    """cos or sin [S, R] of a width partial rotary does not take (odd, over head_dim, zero)."""

    def mutate(args, name, gen):
        args[name] = rnd(gen, args[name].device, S, R)
        return ValueError, TABLE_WIDTH_ERROR.format(name=name, R=R)

    return mutate


def _table_mismatch(args, name, gen):
    """cos and sin of two valid widths (one partial): they must agree."""
    args[name] = args[name][:, :6]
    return ValueError, r"sin must have the shape of cos"


def _big_head_dim(args, name, gen):
    for n, t in args.items():
        args[n] = rnd(gen, t.device, *t.shape[:-1], 514)
    return ValueError, r"q head_dim \(last dimension\) must be even and in 2\.\.512, got 514"


# (case, mutation, arguments it applies to: None = every argument, or a filter)
CASES = [
    ("rank", _rank, None),
    ("seq_len", _seq, lambda n: n != "q"),
    ("head_dim_mismatch", _dim, lambda n: n not in ("q", *TABLES)),  # tables: partial rotary
    ("odd_table_width", _table_width(7), lambda n: n in TABLES),
    ("table_wider_than_head_dim", _table_width(10), lambda n: n in TABLES),
    ("empty_table_width", _table_width(0), lambda n: n in TABLES),
    ("table_widths_differ", _table_mismatch, lambda n: n in ("cos", "sin")),
    ("heads_mismatch", _heads, lambda n: n in GRAD_OF),
    ("int_dtype", _int, None),
    ("mixed_dtype", _dtype, lambda n: n in ("sin", *GRAD_OF)),  # q and k may differ: test_dtypes
    ("device", _device, lambda n: n != "q"),
    ("not_tensor", _not_tensor, None),
    ("odd_head_dim", _odd_head_dim, lambda n: n == "q"),
    ("head_dim_over_512", _big_head_dim, lambda n: n == "q"),
]
CI_CASES = {"rank", "int_dtype", "mixed_dtype", "odd_head_dim", "odd_table_width"}


def _input_params():
    for fn in FUNCS:
        for name in make_args(fn, torch.Generator(), "meta"):
            for case, mutate, applies in CASES:
                if applies is None or applies(name):
                    marks = [pytest.mark.kernels_ci] if case in CI_CASES else []
                    yield pytest.param(fn, name, mutate, id=f"{fn}-{case}-{name}", marks=marks)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fn,name,mutate", list(_input_params()))
def test_bad_input(kernel, tripwire, gen, device, fn, name, mutate):
    args = make_args(fn, gen, device)
    exc, match = mutate(args, name, gen)
    expect_error(kernel, fn, args, exc, f"^{fn}: {match}")


@pytest.mark.parametrize("device", DEVICES)
def test_bad_input_with_out_is_checked_first(kernel, tripwire, gen, device):
    """A bad input with valid out= buffers: the input error, and the buffers keep their poison."""
    args = make_args("rope_bwd", gen, device)
    out = fresh_out(args)
    args["grad_k_embed"] = args["grad_k_embed"].to(torch.float16)
    expect_error(kernel, "rope_bwd", args, ValueError, r"grad_k_embed must have the dtype of k", out=out)


# ----------------------------------------------------------------- out= cases

OUT_NAMES = ("grad_q", "grad_k", "grad_embeddings")
OF_INPUT = dict(zip(OUT_NAMES, ("q", "k", "embeddings")))


def _wrong_shape(args, i):
    out = list(fresh_out(args))
    out[i] = out[i][1:]
    want = re.escape(str(tuple(args[OF_INPUT[OUT_NAMES[i]]].shape)))
    return out, ValueError, rf"out\[{OUT_NAMES[i]}\] must have shape {want}"


def _wrong_dtype(args, i):
    out = list(fresh_out(args))
    out[i] = out[i].to(torch.float16)
    return out, TypeError, rf"out\[{OUT_NAMES[i]}\] must have dtype torch.float32, got torch.float16"


def _wrong_device(args, i):
    out = list(fresh_out(args))
    dev = args["q"].device
    out[i] = out[i].to(OTHER_DEVICE[dev.type])
    return out, ValueError, rf"out\[{OUT_NAMES[i]}\] must have device {dev}"


def _not_tensor_out(args, i):
    out = list(fresh_out(args))
    out[i] = out[i].tolist()
    return out, TypeError, rf"out\[{OUT_NAMES[i]}\] must be a torch.Tensor, got list"


def _expanded(args, i):
    out = list(fresh_out(args))
    out[i] = out[i][:1].expand_as(out[i])  # every token row writes the same memory
    return out, ValueError, rf"out\[{OUT_NAMES[i]}\] has elements that share memory"


def _is_input(args, i):
    out = list(fresh_out(args))
    src = OF_INPUT[OUT_NAMES[i]]
    out[i] = args[src]
    return out, ValueError, rf"out\[{OUT_NAMES[i]}\] overlaps the input {src}; outputs must not alias inputs"


def _overlaps_grad_input(args, i):
    """Partial aliasing: out[grad_q] is the upstream gradient, shifted by one token."""
    gq = args["grad_q_embed"]
    buf = torch.cat([gq, gq[:1]])
    args["grad_q_embed"] = buf[:-1]
    out = list(fresh_out(args))
    out[0] = buf[1:]
    return out, ValueError, r"out\[grad_q\] overlaps the input grad_q_embed"


def _outputs_share(args, i):
    """grad_q and grad_k in one buffer (same heads, so that the shapes are valid):
    the same memory (i = 0), or shifted by one token (i = 1)."""
    args["k"], args["grad_k_embed"] = args["k"][:, :HQ], args["grad_k_embed"][:, :HQ]
    n = S * HQ * D
    buf = torch.full(((S + 1) * HQ * D,), float("nan"), device=args["q"].device)
    out = [buf[:n].view(S, HQ, D), buf[i * HQ * D :][:n].view(S, HQ, D), fresh_out(args)[2]]
    return out, ValueError, r"out\[grad_q\] and out\[grad_k\] overlap; each output needs its own memory"


def _embeddings_inside_grad_q(args, i):
    buf = fresh_out(args)[0]
    out = [buf, fresh_out(args)[1], buf.view(-1)[: S * D].view(S, D)]
    return out, ValueError, r"out\[grad_q\] and out\[grad_embeddings\] overlap"


def _not_a_tuple(args, i):
    out = fresh_out(args)
    return (
        (out[0] if i == 0 else out[:2]),
        TypeError,
        r"out must be a tuple of 3 tensors \(grad_q, grad_k, grad_embeddings\)",
    )


def _out_requires_grad(args, i):
    """A leaf that requires grad as out= (torch refuses in-place writes into one)."""
    out = list(fresh_out(args))
    out[i] = out[i].requires_grad_()
    return (
        out,
        ValueError,
        rf"out\[{OUT_NAMES[i]}\] requires grad, but results written into out= are not differentiable",
    )


def _input_requires_grad(args, i):
    """out= results carry no graph: an input that requires grad would lose its gradient."""
    name = ("grad_q_embed", "q", "embeddings")[i]
    args[name] = args[name].requires_grad_()
    return fresh_out(args), ValueError, rf"{name} requires grad, but results written into out= are not differentiable"


OUT_CASES = [
    ("wrong_shape", _wrong_shape, range(3)),
    ("wrong_dtype", _wrong_dtype, range(3)),
    ("wrong_device", _wrong_device, range(3)),
    ("not_tensor", _not_tensor_out, range(3)),
    ("expanded", _expanded, range(3)),
    ("is_input", _is_input, range(3)),
    ("overlaps_input", _overlaps_grad_input, [0]),
    ("outputs_share", _outputs_share, [0, 1]),
    ("outputs_overlap", _embeddings_inside_grad_q, [0]),
    ("not_a_tuple", _not_a_tuple, [0, 1]),
    ("out_requires_grad", _out_requires_grad, range(3)),
    ("input_requires_grad", _input_requires_grad, range(3)),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "make_out,i",
    [
        pytest.param(
            f, i, id=f"{case}-{i}", marks=[pytest.mark.kernels_ci] if case in ("wrong_dtype", "is_input") else []
        )
        for case, f, idx in OUT_CASES
        for i in idx
    ],
)
def test_bad_out(kernel, tripwire, gen, device, make_out, i):
    args = make_args("rope_bwd", gen, device)
    out, exc, match = make_out(args, i)
    expect_error(kernel, "rope_bwd", args, exc, f"^rope_bwd: {match}", out=out)


# --------------------------------------------------------- valid edge cases


def _outputs(kernel, fn, args):
    """Run fn forward (and backward for the autograd functions); every result tensor."""
    if fn in ("rope_bwd", "rope_fwd"):
        return list(getattr(kernel, fn)(*args.values()))
    leaves = {n: t.requires_grad_() for n, t in args.items()}
    outs = getattr(kernel, fn)(*leaves.values())
    grads = [torch.randn(o.shape, dtype=o.dtype).to(o.device) for o in outs]
    torch.autograd.backward(outs, grads)
    return [*outs, *(t.grad for t in leaves.values())]


@pytest.mark.kernels_ci
@pytest.mark.interpret
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fn", FUNCS)
def test_empty_sequence(kernel, gen, device, fn):
    """S = 0: empty results of the right shapes and dtypes, for outputs and gradients."""
    args = make_args(fn, gen, device, s=0)
    results = _outputs(kernel, fn, args)
    if fn == "rope_bwd":
        expected = [args["grad_q_embed"], args["grad_k_embed"], args["embeddings"]]
    elif fn == "rope_fwd":
        expected = [args["q"], args["k"]]
    else:
        expected = [args["q"], args["k"], *args.values()]
    assert len(results) == len(expected)
    for r, e in zip(results, expected):
        assert r.shape == e.shape and r.dtype == e.dtype and r.device == e.device


@pytest.mark.interpret
@pytest.mark.parametrize("device", DEVICES)
def test_empty_sequence_out(kernel, gen, device):
    args = make_args("rope_bwd", gen, device, s=0)
    out = fresh_out(args)
    got = kernel.rope_bwd(*args.values(), out=out)
    assert len(got) == 3 and all(g is o for g, o in zip(got, out))


@pytest.mark.kernels_ci
@pytest.mark.interpret
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("table_dtype", [torch.float32, torch.bfloat16])
def test_different_head_counts_and_table_dtype_are_valid(kernel, gen, device, table_dtype):
    """q and k with their own head counts, and a table in another dtype than q's
    (transformers passes fp32 cos/sin with bf16 q), are valid and exact."""
    args = make_args("rope_bwd", gen, device, hq=1, hk=5)
    args["embeddings"] = args["embeddings"].to(table_dtype)
    ref = reference.reference_backward(*args.values())
    out = fresh_out(args)
    got = kernel.rope_bwd(*args.values(), out=out)
    assert all(g is o for g, o in zip(got, out))
    tol = [FP32_TOL, FP32_TOL, FP32_TOL if table_dtype == torch.float32 else 1e-2]
    for g, r, t in zip(got, ref, tol):
        assert reference.rel_err(g, r) <= t
    fwd_ref = reference.reference_forward(*(args[n].double().cpu() for n in ("q", "k", "embeddings")))
    for g, r in zip(kernel.rope_fwd(args["q"], args["k"], args["embeddings"]), fwd_ref):
        assert reference.rel_err(g, r) <= FP32_TOL


@pytest.mark.interpret
@pytest.mark.parametrize("device", DEVICES)
def test_out_interleaved_in_one_gradient_buffer(kernel, gen, device):
    """grad_q and grad_k as views of one [S, 3, H, D] buffer (the qkv projection's
    gradient) share a byte range but no element: accepted, and written exactly there."""
    args = make_args("rope_bwd", gen, device, hk=HQ)
    dqkv = torch.full((S, 3, HQ, D), float("nan"), device=device)
    out = (dqkv[:, 0], dqkv[:, 1], torch.full_like(args["embeddings"], float("nan")))
    got = kernel.rope_bwd(*args.values(), out=out)
    for g, r in zip(got, reference.reference_backward(*args.values())):
        assert reference.rel_err(g, r) <= FP32_TOL
    assert dqkv[:, 2].isnan().all(), "the third slot was written"


@pytest.mark.interpret
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fn", FUNCS)
def test_checks_after_a_valid_call_of_the_same_shapes(kernel, gen, device, fn):
    """The checks remember the argument combinations that passed (host time per call): a
    valid call first must not let a bad one of the same shapes through afterwards."""
    args = make_args(fn, gen, device)
    getattr(kernel, fn)(*args.values())
    cases = [
        ("k", torch.int32, TypeError, "must be float32"),
        *((n, torch.float16, ValueError, "must have the dtype of ") for n in ("sin", "grad_k_embed") if n in args),
    ]
    for name, dtype, exc, match in cases:
        bad = dict(args, **{name: args[name].to(dtype)})
        with pytest.raises(exc, match=f"^{fn}: {name} {match}"):
            getattr(kernel, fn)(*bad.values())
    getattr(kernel, fn)(*args.values())


@pytest.mark.kernels_ci
@pytest.mark.interpret(R=2)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("R", [2, 4, 6, 8])
def test_every_even_table_width_is_valid(kernel, gen, device, R):
    """cos/sin [S, R], R even from 2 to D: valid, the first R channels rotated, both pair layouts."""
    args = make_args("apply_rotary_pos_emb_vision", gen, device)
    q, k = args["q"], args["k"]
    cos, sin = args["cos"][:, :R], args["sin"][:, :R]
    for interleaved in (False, True):
        got = kernel.apply_rotary_pos_emb_vision(q, k, cos, sin, interleaved=interleaved)
        ref = reference.reference_vision_forward(*(t.double().cpu() for t in (q, k, cos, sin)), interleaved)
        for g, r in zip(got, ref):
            assert reference.rel_err(g, r) <= FP32_TOL
