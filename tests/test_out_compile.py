"""rope_bwd(out=...) under torch.compile(dynamic=True, fullgraph=True): it compiles once
for every sequence length, writes the caller's buffers, and keeps every check on out=
(strides are symbolic and addresses do not exist while dynamo traces, so the memory
checks run in the op itself, on the real tensors, before anything is written)."""

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from . import reference
from .helpers import DEVICES

HQ, HK, D = 2, 3, 8
FP32_TOL = 2e-6


def rnd(gen, device, *shape):
    return torch.randn(*shape, generator=gen).to(device)


def make_args(gen, device, S, hk=HK):
    return [
        rnd(gen, device, S, HQ, D),
        rnd(gen, device, S, hk, D),
        rnd(gen, device, S, HQ, D),
        rnd(gen, device, S, hk, D),
        rnd(gen, device, S, D),
    ]


@pytest.fixture
def compiled(kernel):
    """rope_bwd(out=) compiled dynamic and fullgraph, with a counter of compilations."""
    torch.compiler.reset()
    counter = CompileCounterWithBackend("inductor")

    def fn(gq, gk, q, k, emb, dq, dk, demb):
        return kernel.rope_bwd(gq, gk, q, k, emb, out=(dq, dk, demb))

    yield torch.compile(fn, dynamic=True, fullgraph=True, backend=counter), counter
    torch.compiler.reset()


@pytest.mark.kernels_ci
@pytest.mark.parametrize("device", DEVICES)
def test_out_compiles_dynamic_fullgraph(compiled, gen, device):
    fn, counter = compiled
    for S in (5, 11, 23):
        args = make_args(gen, device, S)
        out = [torch.full_like(t, float("nan")) for t in args[2:]]
        got = fn(*args, *out)
        assert all(g is o for g, o in zip(got, out)), "out= buffers not returned"
        for o, r in zip(out, reference.reference_backward(*args)):
            assert reference.rel_err(o, r) <= FP32_TOL
    assert counter.frame_count == 1


@pytest.mark.parametrize("device", DEVICES)
def test_out_interleaved_views_under_compile(compiled, gen, device):
    """grad_q and grad_k as views of one [S, 3, H, D] gradient buffer: valid, written there."""
    fn, _ = compiled
    S = 9
    args = make_args(gen, device, S, hk=HQ)
    dqkv = torch.full((S, 3, HQ, D), float("nan"), device=device)
    demb = torch.full_like(args[4], float("nan"))
    fn(*args, dqkv[:, 0], dqkv[:, 1], demb)
    for o, r in zip((dqkv[:, 0], dqkv[:, 1], demb), reference.reference_backward(*args)):
        assert reference.rel_err(o, r) <= FP32_TOL
    assert dqkv[:, 2].isnan().all(), "the third slot was written"


def _bits(tensors):
    return [t.detach().cpu().clone() for t in tensors]


def _aliased(args, out, case):
    """(args, out, message) of one aliasing case."""
    if case == "is_input":
        return args, [args[2], *out[1:]], r"out\[grad_q\] overlaps the input q; outputs must not alias inputs"
    if case == "shifted":  # out[grad_q] is the upstream gradient, one token further
        buf = torch.cat([args[0], args[0][:1]])
        return [buf[:-1], *args[1:]], [buf[1:], *out[1:]], r"out\[grad_q\] overlaps the input grad_q_embed"
    if case == "outputs_share":
        args = [args[0], args[1][:, :HQ], args[2], args[3][:, :HQ], args[4]]
        return args, [out[0], out[0], out[2]], r"out\[grad_q\] and out\[grad_k\] overlap"
    if case == "expanded":
        return args, [*out[:2], out[2][:1].expand_as(out[2])], r"out\[grad_embeddings\] has elements that share memory"
    raise ValueError(case)


@pytest.mark.kernels_ci
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", ["is_input", "shifted", "outputs_share", "expanded"])
def test_out_checks_hold_under_compile(compiled, gen, device, case):
    """Each aliasing case gets its named error from the compiled function (after a valid
    call compiled it with S dynamic), and no argument is written."""
    fn, _ = compiled
    valid = make_args(gen, device, 7)
    fn(*valid, *[torch.empty_like(t) for t in valid[2:]])
    args = make_args(gen, device, 12)
    args, out, message = _aliased(args, [torch.full_like(t, float("nan")) for t in args[2:]], case)
    before = _bits([*args, *out])
    # fullgraph: dynamo reports an error raised while it traces (the expanded layout, visible in
    # the trace) as Unsupported, carrying our message; the others come from the op as raised.
    exc = torch._dynamo.exc.Unsupported if case == "expanded" else ValueError
    with pytest.raises(exc, match=message):
        fn(*args, *out)
    for b, t in zip(before, _bits([*args, *out])):
        assert torch.equal(b.view(torch.int32), t.view(torch.int32)), "a failed call wrote into an argument"
