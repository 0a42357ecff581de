"""Compile once per layout: a call site compiles a bounded number of kernels, whatever the
number of distinct sequence lengths S (training on images of many sizes sees a new S
nearly every step).

On the CPU, under Triton's interpreter, a recorder stands in for the kernel and records
the specialization of every launch as Triton keys its compiled kernels: the constexprs
and num_warps, and Triton's own specialization of each runtime argument (pointer dtype
and 16-byte alignment, integer width and divisibility, unless the kernel opts out). For
small S it also runs the real kernel in the interpreter, and the results are checked
against float64. On a GPU, Triton's compile hook counts real compilations.
"""

import gc
import importlib
import os

import pytest
import torch

from . import reference

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
# 25 sizes: 1, odd, even, multiples of 16, each tuning bucket, past 65536; then 24 new ones
# of the same classes, which must compile nothing new.
SIZES = [
    1,
    2,
    3,
    7,
    16,
    31,
    64,
    100,
    127,
    256,
    257,
    511,
    512,
    999,
    1024,
    1025,
    2048,
    3001,
    4096,
    4097,
    8191,
    16384,
    16385,
    65536,
    70001,
]
NEW_SIZES = [
    4,
    5,
    9,
    33,
    48,
    200,
    255,
    300,
    640,
    777,
    1000,
    1008,
    1500,
    2047,
    3333,
    4095,
    5000,
    9216,
    12345,
    16383,
    20000,
    32768,
    65537,
    69999,
]
RUN = (1, 9)  # sizes the interpreter also runs and checks, one of each list (the others are only recorded)
MAX_KERNELS = 8


def _launch(kernel):
    return importlib.import_module(f"{kernel.__name__}.launch")


def _heads(layout, S, H, D, dtype, gen, run):
    """q, k [S, H, D] in `layout`, and upstream gradients as the attention returns them."""
    new = (lambda *s: torch.randn(*s, generator=gen).to(dtype)) if run else (lambda *s: torch.empty(*s, dtype=dtype))
    if layout == "qkv":  # views of one qkv projection; sdpa's gradient [1, H, S, D] seen as [S, H, D]
        q, k, _ = new(S, 3 * H * D).view(S, 3, H, D).unbind(1)
        grads = [new(1, H, S, D).transpose(1, 2)[0] for _ in range(2)]
    else:  # "contiguous": flash-attention's [S, H, D], gradients too
        q, k = new(S, H, D), new(S, H, D)
        grads = [new(S, H, D) for _ in range(2)]
    return q, k, grads


def _tables(tables, S, R, gen, run):
    """angles, cos, sin [S, R]: contiguous, or expanded from one row (stride 0 over tokens)."""
    if tables == "expanded":
        e = torch.randn(1, R, generator=gen).expand(S, R)
    else:
        e = torch.randn(S, R, generator=gen) if run else torch.empty(S, R)
    return e, e.cos(), e.sin()


class Recorder:
    """Stands in for rotary_kernel: records each launch's compile key, runs the real
    (interpreted) kernel when asked."""

    def __init__(self, kernel):
        from triton._C.libtriton import native_specialize_impl
        from triton.backends.compiler import BaseBackend

        self.kernel, self.run = kernel, False
        self.keys = []
        self.arg_names = names = kernel.arg_names
        opt_out = set(kernel.kwargs.get("do_not_specialize") or ())
        self._spec = lambda i, a: native_specialize_impl(BaseBackend, a, False, names[i] not in opt_out, True)

    def __getitem__(self, grid):
        def launch(*args, **consts):
            runtime = tuple(self._spec(i, a) for i, a in enumerate(args))
            self.keys.append((tuple(sorted(consts.items())), runtime))
            if self.run:
                self.kernel[grid](*args, **consts)

        return launch


def _call(kernel, mode, q, k, grads, e, cos, sin, interleaved=False):
    """One call of the public API in `mode`; its outputs."""
    if mode == "fwd":
        return kernel.apply_rotary_pos_emb_vision(q, k, cos, sin, interleaved=interleaved)
    if mode == "rope_bwd":  # SOL-ExecBench's backward: angles, with their gradient
        return kernel.rope_bwd(*grads, q, k, e)
    leaves = [
        q.detach().requires_grad_(),
        k.detach().requires_grad_(),
        cos.detach().requires_grad_(mode == "bwd"),
        sin.detach().requires_grad_(mode == "bwd"),
    ]
    outs = kernel.apply_rotary_pos_emb_vision(*leaves, interleaved=interleaved)
    want = leaves if mode == "bwd" else leaves[:2]
    return torch.autograd.grad(outs, want, grads)


def _check(mode, got, q, k, grads, e, cos, sin, dtype, interleaved=False):
    tol = 2e-6 if dtype == torch.float32 else 1e-2
    if mode == "rope_bwd":
        refs = reference.reference_backward(*grads, q, k, e)
    else:
        outs, grads = reference.reference_rotary_grads(*grads, q, k, cos, sin, interleaved=interleaved)
        refs = outs if mode == "fwd" else grads
    assert len(got) <= len(refs)
    for g, r in zip(got, refs):
        assert reference.rel_err(g, r) <= (2e-6 if g.dtype == torch.float32 else tol)


CASES = [  # (layout, tables, mode, dtype, heads, head_dim, rotated channels, interleaved)
    *[
        ("qkv", "contiguous", m, dt, 16, 72, 72, False)
        for m in ("fwd", "bwd_qk", "bwd")
        for dt in (torch.bfloat16, torch.float16, torch.float32)
    ],
    ("qkv", "contiguous", "bwd_qk", torch.bfloat16, 16, 80, 80, False),
    ("qkv", "expanded", "bwd_qk", torch.bfloat16, 16, 72, 72, False),
    ("contiguous", "contiguous", "bwd_qk", torch.bfloat16, 16, 72, 72, False),
    ("contiguous", "expanded", "fwd", torch.float16, 16, 80, 80, False),
    ("contiguous", "contiguous", "rope_bwd", torch.float32, 16, 128, 128, False),
    ("contiguous", "contiguous", "bwd", torch.float32, 16, 128, 128, False),
    ("qkv", "contiguous", "bwd_qk", torch.bfloat16, 16, 80, 48, True),
    ("qkv", "contiguous", "fwd", torch.bfloat16, 16, 72, 40, False),
    ("contiguous", "contiguous", "bwd", torch.float32, 16, 128, 104, True),
]


@pytest.mark.interpret
@pytest.mark.skipif(not INTERPRET, reason="records the launches of CPU tensors: runs only under TRITON_INTERPRET=1")
@pytest.mark.parametrize(
    "layout,tables,mode,dtype,H,D,R,interleaved",
    CASES,
    ids=[f"{c[0]}-{c[1]}-{c[2]}-{str(c[3])[6:]}-D{c[5]}-R{c[6]}{'-interleaved' * c[7]}" for c in CASES],
)
def test_bounded_compilations(kernel, gen, monkeypatch, layout, tables, mode, dtype, H, D, R, interleaved):
    launch = _launch(kernel)
    recorder = Recorder(launch.rotary_kernel)
    monkeypatch.setattr(launch, "rotary_kernel", recorder)
    seen = set()
    for sizes in (SIZES, NEW_SIZES):
        for S in sizes:
            recorder.run = S in RUN
            q, k, grads = _heads(layout, S, H, D, dtype, gen, recorder.run)
            e, cos, sin = _tables(tables, S, R, gen, recorder.run)
            got = _call(kernel, mode, q, k, grads, e, cos, sin, interleaved)
            if recorder.run:
                _check(mode, got, q, k, grads, e, cos, sin, dtype, interleaved)
        keys = set(recorder.keys)
        if sizes is SIZES:
            seen = keys
            assert 1 <= len(keys) <= MAX_KERNELS, f"{len(keys)} kernels for {len(SIZES)} sizes"
        else:
            assert keys == seen, f"new sizes of seen classes compiled {len(keys - seen)} more kernels"
    # Nothing about S is specialized: its only trace in a key is its integer width.
    assert {runtime[10] for _, runtime in seen} == {("i32", None)}


@pytest.mark.interpret
@pytest.mark.skipif(not INTERPRET, reason="the launch path of CPU tensors: runs only under TRITON_INTERPRET=1")
def test_plan_cache_does_not_grow_with_sizes(kernel, gen):
    """The launch path's caches are keyed by layout and tuning bucket, not by S; the routes of each
    S's signature hold nothing the garbage collector keeps tracking (a torch.Size would: then new
    sizes bring on its full collections, host time in the hundreds of microseconds per call)."""
    launch = _launch(kernel)
    tuning = importlib.import_module(f"{kernel.__name__}.tuning")
    q, k, grads = _heads("qkv", 8, 2, 16, torch.float32, gen, True)
    e, cos, sin = _tables("contiguous", 8, 16, gen, True)
    _call(kernel, "bwd_qk", q, k, grads, e, cos, sin)
    before = launch._plan.cache_info().currsize, tuning._lookup.cache_info().currsize
    for S in (2, 3, 5, 7, 9, 10, 11, 13):
        q, k, grads = _heads("qkv", S, 2, 16, torch.float32, gen, True)
        e, cos, sin = _tables("contiguous", S, 16, gen, True)
        _check("bwd_qk", _call(kernel, "bwd_qk", q, k, grads, e, cos, sin), q, k, grads, e, cos, sin, torch.float32)
    assert (launch._plan.cache_info().currsize, tuning._lookup.cache_info().currsize) == before
    gc.collect()
    assert launch._ROUTES and not any(gc.is_tracked(entry) for key in launch._ROUTES for entry in key)


@pytest.mark.interpret
@pytest.mark.skipif(not INTERPRET, reason="the launch path of CPU tensors: runs only under TRITON_INTERPRET=1")
def test_routes_are_bounded(kernel, gen, monkeypatch):
    """The routes (one per call signature, so one per S) never pass 1024: a call with a new
    signature that finds them full drops them all, then runs (checked) and keeps its own (one per
    launch it makes)."""
    launch = _launch(kernel)
    full = {("stand-in", i): None for i in range(1024)}
    monkeypatch.setattr(launch, "_ROUTES", full)
    q, k, grads = _heads("qkv", 6, 2, 16, torch.float32, gen, True)
    e, cos, sin = _tables("contiguous", 6, 16, gen, True)
    _check("bwd_qk", _call(kernel, "bwd_qk", q, k, grads, e, cos, sin), q, k, grads, e, cos, sin, torch.float32)
    assert launch._ROUTES is full and 0 < len(full) < 1024 and not any(key[0] == "stand-in" for key in full)


# ------------------------------------------------------------------------ GPU


@pytest.fixture
def rotary_compiles(kernel):
    """Keys of the rotary_kernel compilations Triton makes while the test runs (its compile hook),
    from a process that has compiled none: kernels of earlier tests in the process are dropped
    (Triton compiles them again from its disk cache), so that counts do not depend on the order."""
    import triton

    launch = _launch(kernel)
    launch._plan.cache_clear()
    launch.rotary_kernel.device_caches.clear()
    keys = []
    saved = triton.knobs.runtime.jit_post_compile_hook

    def hook(*, key, fn, **_):
        if fn.name == "rotary_kernel":
            keys.append(str(key))

    triton.knobs.runtime.jit_post_compile_hook = hook
    yield keys
    triton.knobs.runtime.jit_post_compile_hook = saved


@pytest.fixture
def no_cudnn_attention():
    """sdpa without cuDNN's attention, for the tests that compare the attention step's
    gradients with float64. torch 2.11's cuDNN attention backward (H200) reuses what it built
    for one upstream-gradient stride on later calls of the same shapes with another stride,
    and returns wrong gradients of q, k and v (docs/tried.md): after
    earlier tests in the process ran 1024-token images in 1536-token batches, the step here
    failed at S = 2048 for that reason. The rotary's upstream gradient has sdpa's layout
    whichever backend computes it (the tests assert the strides)."""
    saved = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(False)
    yield
    torch.backends.cuda.enable_cudnn_sdp(saved)


def _attention_step(kernel, x, cos, sin, H, D, seen=None):
    """The Qwen vision attention's pattern on one packed qkv projection: q/k views rotated, then
    sdpa per image (here two) on [1, H, S, D] transposes, whose backward assembles the rotary's
    upstream gradient by a cat: [1, H, S, D] contiguous, seen as [S, H, D] (head stride S*D).
    `seen` gets those gradients."""
    S = x.shape[0]
    q, k, v = x.view(S, 3, H, D).unbind(1)
    q, k = kernel.apply_rotary_pos_emb_vision(q, k, cos, sin)
    if seen is not None:
        for name, t in (("q", q), ("k", k)):
            t.register_hook(lambda g, name=name: seen.__setitem__(name, g))
    images = [S // 2, S - S // 2] if S > 1 else [S]
    chunks = [torch.split(t.transpose(0, 1)[None], images, dim=2) for t in (q, k, v)]
    return torch.cat([torch.nn.functional.scaled_dot_product_attention(*c) for c in zip(*chunks)], dim=2)


@pytest.mark.gpu
def test_sdpa_layout_compiles_once_per_bucket_gpu(kernel, gen, rotary_compiles, no_cudnn_attention):
    """Forward and backward of the real call over 49 sizes: Triton compiles the kernels of the
    first size of each tuning bucket, and nothing for the 24 new sizes after them; the
    gradients of q and k match float64 at every size."""
    H, D = 16, 72
    for sizes in (SIZES, NEW_SIZES):
        before = len(rotary_compiles)
        for S in sizes:
            x = torch.randn(S, 3 * H * D, generator=gen).to("cuda", torch.bfloat16).requires_grad_()
            e = torch.randn(S, D // 2, generator=gen).repeat(1, 2).cuda()
            cos, sin = e.cos(), e.sin()
            seen = {}
            out = _attention_step(kernel, x, cos, sin, H, D, seen)
            (dx,) = torch.autograd.grad(out, x, torch.randn(out.shape, generator=gen).to("cuda", torch.bfloat16))
            assert seen["q"].stride() == (D, S * D, 1) or S == 1, "not sdpa's gradient layout"
            rows = torch.randint(S, (256,), generator=gen).cuda()
            q, k, _ = x.detach().view(S, 3, H, D).unbind(1)
            leaves = [t[rows].double().requires_grad_() for t in (q, k)]
            outs = reference.reference_vision_forward(*leaves, cos[rows].double(), sin[rows].double())
            refs = torch.autograd.grad(outs, leaves, [seen[n][rows].double() for n in "qk"])
            for got, ref in zip(dx.view(S, 3, H, D).unbind(1), refs):
                assert reference.rel_err(got[rows], ref) <= 1e-2
        if sizes is SIZES:
            assert 2 <= len(rotary_compiles) <= 2 * MAX_KERNELS  # forward and backward kernels
        else:
            assert len(rotary_compiles) == before, "a new size of a seen class compiled a kernel"


# -------------------------------------------------------------- torch.compile


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_compile_dynamic_new_sizes_recompile_nothing(kernel, gen, device, rotary_compiles_if_cuda):
    """torch.compile(dynamic=True) of the attention's rotary and sdpa, forward and backward, over
    6 sizes of one tuning bucket: one dynamo frame, no Triton compilation after the first size,
    the results of eager."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from torch._dynamo.testing import CompileCounterWithBackend

    torch.compiler.reset()
    H, D = 2, 8
    module = torch.nn.Linear(16, 3 * H * D).to(device)

    def fn(h, cos, sin):
        x = module(h)
        q, k, v = x.view(x.shape[0], 3, H, D).unbind(1)
        q, k = kernel.apply_rotary_pos_emb_vision(q, k, cos, sin)
        return torch.nn.functional.scaled_dot_product_attention(*(t.transpose(0, 1)[None] for t in (q, k, v)))

    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(fn, backend=counter, fullgraph=True, dynamic=True)
    for i, S in enumerate((300, 301, 512, 777, 1000, 1024)):
        h = torch.randn(S, 16, generator=gen).to(device).requires_grad_()
        e = torch.randn(S, D, generator=gen).to(device)
        w = torch.randn(1, H, S, D, generator=gen).to(device)
        results = []
        for f in (fn, compiled):
            out = f(h, e.cos(), e.sin())
            results.append([out, *torch.autograd.grad(out, [h, *module.parameters()], w)])
        for got, want in zip(*results):
            assert reference.rel_err(got, want) <= 1e-5
        if i == 0:
            first = len(rotary_compiles_if_cuda)
    assert counter.frame_count == 1
    assert len(rotary_compiles_if_cuda) == first, "a new size compiled a kernel"


@pytest.fixture
def rotary_compiles_if_cuda(request):
    if not torch.cuda.is_available():
        yield []
        return
    yield request.getfixturevalue("rotary_compiles")


def _errors_by_part(got, ref, H, D):
    """For a failure's message: the error of q's, k's and v's parts of a packed qkv gradient."""
    got, ref = (t.view(t.shape[0], 3, H, D) for t in (got, ref))
    return {n: reference.rel_err(got[:, i], ref[:, i]) for i, n in enumerate("qkv")}


@pytest.mark.gpu
def test_compile_reads_sdpa_gradient_in_place_gpu(kernel, gen, rotary_compiles, no_cudnn_attention):
    """S dynamic, heads static: the compiled backward launches the kernel itself, on sdpa's
    transposed gradient in place (no copy to contiguous in the graph), and a new S neither
    retraces nor compiles a kernel."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.backends.debugging import boxed_nop
    from torch._dynamo.testing import CompileCounterWithBackend

    torch.compiler.reset()
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return boxed_nop(gm, example_inputs)

    counter = CompileCounterWithBackend(aot_autograd(fw_compiler=keep, bw_compiler=keep))
    H, D = 16, 72

    def fn(x, cos, sin):
        return _attention_step(kernel, x, cos, sin, H, D)

    compiled = torch.compile(fn, backend=counter, fullgraph=True)
    for i, S in enumerate((1100, 1500, 2048, 3001, 4000)):
        x = torch.randn(S, 3 * H * D, generator=gen).to("cuda", torch.bfloat16).requires_grad_()
        e = torch.randn(S, D, generator=gen).cuda()
        cos, sin = e.cos(), e.sin()
        w = torch.randn(1, H, S, D, generator=gen).to("cuda", torch.bfloat16)
        for t in (x, cos, sin):  # every input whose first size is S
            torch._dynamo.mark_dynamic(t, 0)
        # Each against a float64 evaluation of the step (the PyTorch path): eager and compiled
        # bf16 may differ by sdpa's kernel choice, not by the rotary.
        x64 = x.detach().double().requires_grad_()
        out64 = fn(x64, cos.double(), sin.double())
        want = (out64, *torch.autograd.grad(out64, x64, w.double()))
        for how, f in (("eager", fn), ("compiled", compiled)):
            out = f(x, cos, sin)
            (dx,) = torch.autograd.grad(out, x, w)
            assert reference.rel_err(out, want[0]) <= 1e-2, (how, S, "output")
            assert reference.rel_err(dx, want[1]) <= 1e-2, (how, S, "gradient", _errors_by_part(dx, want[1], H, D))
        if i == 0:
            first = len(rotary_compiles)
    assert counter.frame_count == 1
    assert len(rotary_compiles) == first, "a new size compiled a kernel"
    wrapper = torch.ops.higher_order.triton_kernel_wrapper_functional
    calls = [n for g in graphs for n in g.graph.nodes if n.target is wrapper]
    assert calls, "the compiled graphs do not launch rotary_kernel"
    for node in calls:
        for name in ("in_q_ptr", "in_k_ptr"):
            src = node.kwargs["kwargs"][name]
            assert "clone" not in str(getattr(src, "target", "")), f"{name} is copied before the kernel"


def test_gradient_layouts_are_told_apart_without_S(kernel):
    """The backward's configuration key: sdpa's gradient ([1, H, S, D] seen as [S, H, D]) has its
    heads outside its tokens; q/k views of qkv, flash-attention's [S, H, D] and S = 1 do not."""
    outside = _launch(kernel)._outside

    def heads_outside(x):
        return outside(*x.shape[-3:-1], *x.stride()[-3:-1])

    for S in (2, 3, 16, 4097):
        assert heads_outside(torch.empty(1, 16, S, 72).transpose(1, 2)[0])
        assert not heads_outside(torch.empty(S, 16, 72))
        assert not heads_outside(torch.empty(S, 3, 16, 72)[:, 1])
    assert not heads_outside(torch.empty(1, 16, 1, 72).transpose(1, 2)[0])
    assert not heads_outside(torch.empty(1, 1, 5, 72).transpose(1, 2)[0])


def test_qwen_call_shares_one_configuration_across_buckets(kernel, monkeypatch):
    """The Qwen models' call (bf16, 16 + 16 heads of 72 or 80; forward and q/k-only backward, the
    latter for either gradient layout) gets one launch configuration in every S bucket on the
    H200, under each Triton version the shipped table has entries for, so a training run on
    images of any sizes compiles one kernel per direction."""
    import json

    tuning = importlib.import_module(f"{kernel.__name__}.tuning")
    versions = json.loads(tuning.config_file("NVIDIA H200").read_text())
    assert versions, "no tuned table for the H200"
    monkeypatch.setattr(tuning, "_device_props", lambda device: ("NVIDIA H200", 132))
    try:
        for version in versions:
            monkeypatch.setattr(tuning, "triton_version", lambda: version)
            tuning._lookup.cache_clear()  # it holds this machine's configurations, or another version's
            for mode, layout in (("fwd", ""), ("bwd_qk", ""), ("bwd_qk", "sdpa")):
                for D in (72, 80):
                    configs = {
                        tuple(tuning.get_config(mode, S, 16, 16, D, 2, torch.device("cpu"), layout).items())
                        for S in ((1,) if not layout else ()) + (256, 257, 1024, 4096, 16384, 16385, 70001)
                    }
                    assert len(configs) == 1, f"Triton {version}, {mode} {layout} head_dim {D}: {configs}"
    finally:
        tuning._lookup.cache_clear()


def test_input_checks_cache_does_not_grow_with_sizes(kernel, gen):
    """The argument checks are cached per layout, not per S; a mismatch still names the real sizes."""
    validation = importlib.import_module(f"{kernel.__name__}.validation")
    H, D = 2, 8

    def call(S, S_cos=None):
        q, k = (torch.randn(S, H, D, generator=gen) for _ in range(2))
        cos, sin = (torch.randn(S if S_cos is None else S_cos, D, generator=gen) for _ in range(2))
        return kernel.apply_rotary_pos_emb_vision(q, k, cos, sin)

    call(5)
    before = len(validation._PASSED)
    for S in (6, 7, 9, 16, 31, 100):
        call(S)
    assert len(validation._PASSED) == before
    with pytest.raises(ValueError, match=r"cos must have q's token count S = 7, got 6"):
        call(7, S_cos=6)
