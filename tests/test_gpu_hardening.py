"""GPU hardening (bad input, compile, determinism, huge sizes, CUDA graphs and
streams, memory): what only a real GPU can show. Every test needs CUDA.

    determinism       every output bitwise identical over repeated runs
    huge sizes        S*H*D past 2^31 elements, sampled rows (the last ones included) vs float64
    CUDA graphs       rope_bwd(out=), the allocating form and the autograd path captured and
                      replayed on new values, equal to eager
    streams           runs on the caller's non-default stream
    memory            out= allocates nothing; the other forms exactly their outputs
    no host sync      torch.cuda.set_sync_debug_mode("error") around every public call
"""

import contextlib

import pytest
import torch

from . import reference

pytestmark = pytest.mark.gpu

FP32_TOL, BF16_TOL = 2e-6, 1e-2  # see test_special_values for why


def cuda_gen(gen):
    """A CUDA generator seeded from the test's own: big inputs are drawn on the GPU."""
    return torch.Generator(device="cuda").manual_seed(int(torch.randint(2**62, (), generator=gen)))


def inputs(gen, S, HQ, D, *, HK=None, dtype=torch.float32):
    g = cuda_gen(gen)
    HK = HQ if HK is None else HK

    def r(*shape, dt=dtype):
        return torch.randn(*shape, generator=g, device="cuda", dtype=dt)

    return [r(S, HQ, D), r(S, HK, D), r(S, HQ, D), r(S, HK, D), r(S, D, dt=torch.float32)]


def poisoned_out(args):
    return tuple(torch.full_like(t, float("nan")) for t in args[2:])


def partial_width(D):
    """Rotated channels of the partial-rotary cases: 24 of each head pass through."""
    return D - 24


def interleaved_vision(kernel):
    return lambda *args: kernel.apply_rotary_pos_emb_vision(*args, interleaved=True)


def all_outputs(kernel, args, out):
    """Every output of every public function on one set of inputs: rope_bwd into out=
    and allocating, outputs and gradients of rope_fwd and of the vision function (with
    cos/sin gradients, and without them: the q/k-only kernel; and interleaved pairs over
    part of each head)."""
    gq, gk, q, k, emb = args
    res = [*kernel.rope_bwd(*args, out=out), *kernel.rope_bwd(*args)]
    cos, sin = emb.cos(), emb.sin()
    R = partial_width(q.shape[-1])
    for fn, tables, table_grad in [
        (kernel.rope_fwd, (emb,), True),
        (kernel.apply_rotary_pos_emb_vision, (cos, sin), True),
        (kernel.apply_rotary_pos_emb_vision, (cos, sin), False),
        (interleaved_vision(kernel), (cos[:, :R], sin[:, :R]), True),
        (interleaved_vision(kernel), (cos[:, :R], sin[:, :R]), False),
    ]:
        leaves = [
            q.detach().requires_grad_(),
            k.detach().requires_grad_(),
            *(t.detach().requires_grad_(table_grad) for t in tables),
        ]
        outs = fn(*leaves)
        res += [*outs, *torch.autograd.grad(outs, leaves if table_grad else leaves[:2], [gq, gk])]
    return [r.detach().clone() for r in res]


# --------------------------------------------------------------- determinism

DETERMINISM_SHAPES = (
    [pytest.param(S, 16, 16, 128, torch.float32, id=f"suite-S{S}") for S in reference.SEQ_LENS]
    + [pytest.param(S, 16, 16, 72, torch.bfloat16, id=f"qwen3omni-S{S}") for S in (1, 977, 4096, 16384)]
    + [
        pytest.param(3001, 16, 16, 80, torch.bfloat16, id="qwen25vl-S3001"),
        pytest.param(2048, 16, 4, 128, torch.float16, id="gqa-fp16-S2048"),
    ]
)


@pytest.mark.parametrize("S,HQ,HK,D,dtype", DETERMINISM_SHAPES)
def test_bitwise_deterministic(kernel, gen, S, HQ, HK, D, dtype):
    args = inputs(gen, S, HQ, D, HK=HK, dtype=dtype)
    first = None
    for _ in range(5):
        got = all_outputs(kernel, args, poisoned_out(args))
        assert all(g.isfinite().all() for g in got)
        if first is None:
            first = got
            continue
        for i, (a, b) in enumerate(zip(first, got)):
            assert torch.equal(a, b), f"output {i} differs between runs"


# ---------------------------------------------------------------- huge sizes


@pytest.mark.whole_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_past_2_31_elements(kernel, gen, dtype):
    """S*H*D = 2.25e9 > 2^31: an int32 offset would wrap. Rows around the 2^31-element
    mark and the last rows are checked against float64, with a random sample: rope_bwd,
    rope_fwd, and interleaved pairs over part of each head (forward, q/k-only backward)."""
    S, H, D = 1_100_000, 16, 128
    assert S * H * D > 2**31
    need = 6 * S * H * D * torch.finfo(dtype).bits // 8  # 4 inputs and 2 outputs: bf16 27 GB, fp32 54 GB
    torch.cuda.empty_cache()  # the blocks earlier tests of this process left cached count as used
    if torch.cuda.mem_get_info()[0] < need * 1.1:
        pytest.skip(f"needs {need / 2**30:.0f} GiB of free GPU memory")
    args = inputs(gen, S, H, D, dtype=dtype)
    mark = 2**31 // (H * D)  # first row whose elements lie past 2^31
    rows = torch.cat(
        [
            torch.arange(0, 16),
            torch.arange(mark - 16, mark + 16),
            torch.arange(S - 64, S),
            torch.randint(S, (256,), generator=gen),
        ]
    ).cuda()
    tol = [BF16_TOL if dtype == torch.bfloat16 else FP32_TOL] * 2 + [FP32_TOL]

    got = kernel.rope_bwd(*args)
    ref = reference.reference_backward(*(a[rows] for a in args))
    for g, r, t in zip(got, ref, tol):
        assert reference.rel_err(g[rows], r) <= t
    del got

    # the q/k-only backward of interleaved pairs over part of each head (the op autograd calls)
    R = partial_width(D)
    cos, sin = args[4][:, :R].cos(), args[4][:, :R].sin()
    got = kernel.ops.rotary_bwd(args[0], args[1], None, None, cos, sin, True, True, True)[:2]
    _, ref = reference.reference_rotary_grads(*(a[rows] for a in args[:4]), cos[rows], sin[rows], interleaved=True)
    for g, r, t in zip(got, ref, tol):
        assert reference.rel_err(g[rows], r) <= t
    del got, cos, sin

    gq, gk, q, k, emb = args
    del gq, gk, args
    got = kernel.rope_fwd(q, k, emb)
    ref = reference.reference_forward(*(a[rows].double().cpu() for a in (q, k, emb)))
    for g, r, t in zip(got, ref, tol):
        assert reference.rel_err(g[rows], r) <= t
    del got

    # interleaved pairs over part of each head, forward: the tail is copied past 2^31 too
    R = partial_width(D)
    cos, sin = emb[:, :R].cos(), emb[:, :R].sin()
    got = interleaved_vision(kernel)(q, k, cos, sin)
    ref = reference.reference_rotary(*(a[rows].double().cpu() for a in (q, k, cos, sin)), interleaved=True)
    for g, r, t in zip(got, ref, tol):
        assert reference.rel_err(g[rows], r) <= t
    del got, q, k, emb
    torch.cuda.empty_cache()


# ---------------------------------------------------------------- CUDA graphs


def _warm_up_on_side_stream(fn, n=3):
    """As torch.cuda.graphs asks: run once before capture (Triton compiles here) on a side stream."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(n):
            fn()
    torch.cuda.current_stream().wait_stream(s)


@pytest.mark.parametrize("S,H,D,dtype", [(1024, 16, 128, torch.float32), (777, 16, 72, torch.bfloat16)])
def test_cuda_graph_rope_bwd(kernel, gen, S, H, D, dtype):
    static = inputs(gen, S, H, D, dtype=dtype)
    out = poisoned_out(static)
    holder = {}

    def step():
        kernel.rope_bwd(*static, out=out)
        holder["alloc"] = kernel.rope_bwd(*static)

    _warm_up_on_side_stream(step)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(2):
        for t, new in zip(static, inputs(gen, S, H, D, dtype=dtype)):
            t.copy_(new)
        for t in (*out, *holder["alloc"]):
            t.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        eager = kernel.rope_bwd(*static)
        for a, b, e in zip(out, holder["alloc"], eager):
            assert torch.equal(a, e) and torch.equal(b, e)


@pytest.mark.parametrize("table_grad", [True, False], ids=["cos_sin_grad", "cos_sin_buffers"])
def test_cuda_graph_autograd(kernel, gen, table_grad):
    """Forward and backward of apply_rotary_pos_emb_vision captured together, as in a
    graphed training step; replays on new values match eager autograd."""
    S, H, D = 640, 16, 72
    gq, gk, q, k, emb = inputs(gen, S, H, D, dtype=torch.bfloat16)
    q.requires_grad_()
    k.requires_grad_()
    cos, sin = emb.cos().requires_grad_(table_grad), emb.sin().requires_grad_(table_grad)
    leaves = [q, k, cos, sin] if table_grad else [q, k]
    holder = {}

    def step():
        holder["out"] = kernel.apply_rotary_pos_emb_vision(q, k, cos, sin)
        torch.autograd.backward(holder["out"], [gq, gk])

    _warm_up_on_side_stream(step)
    for t in leaves:
        t.grad = None  # allocated inside the capture, so that replays write them
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(2):
        new = inputs(gen, S, H, D, dtype=torch.bfloat16)
        with torch.no_grad():
            for t, n in zip((gq, gk, q, k, cos, sin), (*new[:4], new[4].cos(), new[4].sin())):
                t.copy_(n)
        graph.replay()
        torch.cuda.synchronize()
        fresh = [t.detach().clone().requires_grad_(t.requires_grad) for t in (q, k, cos, sin)]
        eager_out = kernel.apply_rotary_pos_emb_vision(*fresh)
        eager_grads = torch.autograd.grad(eager_out, fresh[: len(leaves)], [gq, gk])
        for a, e in zip([*holder["out"], *(t.grad for t in leaves)], [*eager_out, *eager_grads]):
            assert torch.equal(a.detach(), e.detach())


# ------------------------------------------------------------------- streams


def test_runs_on_the_current_stream(kernel, gen):
    """With the default stream asleep, every public call on a side stream completes:
    the work was queued on the side stream, and its results are right."""
    S, H, D = 2048, 16, 128
    args = inputs(gen, S, H, D)
    out = poisoned_out(args)
    expected = all_outputs(kernel, args, poisoned_out(args))  # also compiles every kernel variant
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        all_outputs(kernel, args, poisoned_out(args))  # blocks cached for the side stream: no cudaMalloc below
    torch.cuda.synchronize()

    torch.cuda._sleep(2_000_000_000)  # ~1 s of GPU clock cycles on the default stream
    default_done = torch.cuda.Event()
    default_done.record()
    with torch.cuda.stream(side):
        got = all_outputs(kernel, args, out)
        side_done = torch.cuda.Event()
        side_done.record(side)
    side_done.synchronize()
    assert not default_done.query(), "the side stream waited for the default stream"
    torch.cuda.synchronize()
    for i, (g, e) in enumerate(zip(got, expected)):
        assert torch.equal(g, e), f"output {i}"


# -------------------------------------------------------------------- memory


def _stat(name):
    return torch.cuda.memory_stats()[name]


@pytest.mark.parametrize("S,H,D,dtype", [(4096, 16, 72, torch.bfloat16), (1024, 16, 128, torch.float32)])
def test_allocates_only_its_outputs(kernel, gen, S, H, D, dtype):
    """Measured in the caching allocator's requested bytes and allocation count, which
    do not depend on its block rounding: out= allocates nothing; every other call
    exactly its results, and nothing on top of them even for a moment. Counted as what
    the window allocates, not as current or peak bytes: under parallel workers a block
    allocated before the window was freed inside it (what freed it was not found), which
    lowered those."""
    args = inputs(gen, S, H, D, dtype=dtype)
    gq, gk, q, k, emb = args
    out = poisoned_out(args)
    cos, sin = emb.cos(), emb.sin()

    def rope_bwd_out():
        kernel.rope_bwd(*args, out=out)
        return []

    def vision(table_grad, interleaved=False):
        R = partial_width(D) if interleaved else D
        leaves = [
            q.detach().requires_grad_(),
            k.detach().requires_grad_(),
            cos[:, :R].detach().requires_grad_(table_grad),
            sin[:, :R].detach().requires_grad_(table_grad),
        ]
        outs = kernel.apply_rotary_pos_emb_vision(*leaves, interleaved=interleaved)
        return [*outs, *torch.autograd.grad(outs, leaves if table_grad else leaves[:2], [gq, gk])]

    calls = {
        "rope_bwd(out=)": rope_bwd_out,
        "rope_bwd": lambda: kernel.rope_bwd(*args),
        "rope_fwd": lambda: kernel.rope_fwd(q, k, emb),
        "vision fwd+bwd": lambda: vision(True),
        "vision fwd+bwd, no table grad": lambda: vision(False),
        "vision interleaved partial fwd+bwd": lambda: vision(True, interleaved=True),
    }
    for name, call in calls.items():
        call()  # warm-up: compilation
        torch.cuda.synchronize()
        torch.cuda.reset_accumulated_memory_stats()
        results = call()
        torch.cuda.synchronize()
        expected = sum(t.untyped_storage().nbytes() for t in results)
        # Every allocation of the window is one of the results: no temporaries, nothing kept.
        assert _stat("allocation.all.allocated") == sum(t.numel() > 0 for t in results), f"{name}: allocation count"
        assert _stat("requested_bytes.all.allocated") == expected, f"{name}: allocates more than its outputs"
        del results


# ------------------------------------------------------------- no host sync


@contextlib.contextmanager
def sync_is_an_error():
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_no_host_synchronisation(kernel, gen):
    args = inputs(gen, 512, 16, 72, dtype=torch.bfloat16)
    all_outputs(kernel, args, poisoned_out(args))  # warm-up: compilation may synchronise
    out = poisoned_out(args)
    torch.cuda.synchronize()
    with sync_is_an_error():
        gq, gk, q, k, emb = args
        kernel.rope_bwd(*args, out=out)
        kernel.rope_bwd(*args)
        kernel.rope_fwd(q, k, emb)
        for fn, table in (
            (kernel.rope_fwd, (emb,)),
            (kernel.apply_rotary_pos_emb_vision, (emb.cos(), emb.sin())),
            (interleaved_vision(kernel), (emb[:, :48].cos(), emb[:, :48].sin())),
        ):
            leaves = [t.detach().requires_grad_() for t in (q, k, *table)]
            torch.autograd.grad(fn(*leaves), leaves, [gq, gk])
    torch.cuda.synchronize()
