"""Correctness of every public function and launch configuration against a float64
evaluation of the math (tests/reference.py: autograd of the eager forward).

CPU tensors run the PyTorch path, or the Triton kernel in Triton's interpreter
when the process has TRITON_INTERPRET=1 (the test script runs this file both
ways); CUDA tensors run the Triton kernel. Outputs are poisoned with NaN before
every kernel writes them, so an unwritten element fails the comparison.
"""

import types

import pytest
import torch

from . import reference
from .helpers import DEVICES, HAS_CUDA, INTERPRET, submodule

# fp32 lands near 1e-7 (a few roundings per element); bf16/fp16 outputs are rounded to 8/11 bits.
TOL = {torch.float32: 2e-6, torch.bfloat16: 1e-2, torch.float16: 2e-3}
DTYPES = list(TOL)
HEAD_DIMS = [72, 80, 128]


def _inputs(S, HQ, D, dtype, device, gen, HK=None):
    x = reference.make_inputs(S, HQ, D, HK=HK, dtype=dtype, device=device, generator=gen)
    return x["grad_q_embed"], x["grad_k_embed"], x["q"], x["k"], x["embeddings"]


def _ref_vision(q, k, cos, sin, gq, gk):
    """float64 autograd of transformers' apply_rotary_pos_emb_vision (math in float64)."""
    leaves = [t.detach().cpu().double().requires_grad_() for t in (q, k, cos, sin)]
    outs = reference.reference_vision_forward(*leaves)
    grads = torch.autograd.grad(outs, leaves, [g.detach().cpu().double() for g in (gq, gk)])
    return [o.detach() for o in outs], grads


def _close(out, ref, dtype, what):
    err = reference.rel_err(out, ref)
    assert err <= TOL[dtype], f"{what}: rel err {err:.2e} > {TOL[dtype]:.0e}"


def _poisoned(t):
    return torch.full_like(t, float("nan"))


@pytest.mark.kernels_ci
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", HEAD_DIMS)
def test_rope_bwd_and_fwd(kernel, device, dtype, D, gen):
    gq, gk, q, k, e = _inputs(37, 4, D, dtype, device, gen, HK=3)
    ref = reference.reference_backward(gq, gk, q, k, e)
    for out in (
        kernel.rope_bwd(gq, gk, q, k, e),
        kernel.rope_bwd(gq, gk, q, k, e, out=tuple(map(_poisoned, (q, k, e)))),
    ):
        for o, r, name in zip(out, ref, ("grad_q", "grad_k", "grad_embeddings")):
            assert o.dtype == (e.dtype if name == "grad_embeddings" else dtype) and o.device.type == device
            # the table gradient is fp32 math on exactly widened inputs: fp32 accuracy whatever q's dtype
            _close(o, r, torch.float32 if name == "grad_embeddings" else dtype, name)
    fwd_ref = reference.reference_forward(*(t.cpu().double() for t in (q, k, e)))
    for o, r in zip(kernel.rope_fwd(q, k, e), fwd_ref):
        assert o.dtype == dtype
        _close(o, r, dtype, "rope_fwd")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", HEAD_DIMS)
def test_apply_rotary_emb_autograd(kernel, device, dtype, D, gen):
    gq, gk, q, k, e = _inputs(29, 3, D, dtype, device, gen, HK=5)
    qq, kk, ee = (t.clone().requires_grad_() for t in (q, k, e))
    outs = kernel.apply_rotary_emb(qq, kk, ee)
    torch.autograd.backward(outs, (gq, gk))
    ref = reference.reference_backward(gq, gk, q, k, e)
    fwd_ref = reference.reference_forward(*(t.cpu().double() for t in (q, k, e)))
    for o, r in zip(outs, fwd_ref):
        _close(o, r, dtype, "forward")
    for g, r, name in zip((qq.grad, kk.grad, ee.grad), ref, "qke"):
        _close(g, r, dtype if name != "e" else torch.float32, f"grad {name}")


@pytest.mark.kernels_ci
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", HEAD_DIMS)
@pytest.mark.parametrize("table_grad", [False, True])
def test_apply_rotary_pos_emb_vision(kernel, device, dtype, D, table_grad, gen):
    """transformers' signature: strided q/k views of one qkv projection, fp32 cos/sin."""
    S, H = 23, 4
    qkv = torch.randn(S, 3 * H * D, generator=gen).to(device=device, dtype=dtype)
    q, k, _ = qkv.reshape(S, 3, H, D).permute(1, 0, 2, 3).unbind(0)
    e = torch.randn(S, D, generator=gen).to(device)
    cos, sin = e.cos(), e.sin()
    gq, gk = (torch.randn(S, H, D, generator=gen).to(device=device, dtype=dtype) for _ in range(2))
    leaves = [
        q.detach().requires_grad_(),
        k.detach().requires_grad_(),
        cos.clone().requires_grad_(table_grad),
        sin.clone().requires_grad_(table_grad),
    ]
    outs = kernel.apply_rotary_pos_emb_vision(*leaves)
    torch.autograd.backward(outs, (gq, gk))
    fwd_ref, grad_ref = _ref_vision(q, k, cos, sin, gq, gk)
    for o, r in zip(outs, fwd_ref):
        assert o.dtype == dtype
        _close(o, r, dtype, "forward")
    _close(leaves[0].grad, grad_ref[0], dtype, "grad q")
    _close(leaves[1].grad, grad_ref[1], dtype, "grad k")
    if table_grad:
        # fp32 math on exactly widened inputs: fp32 accuracy whatever q's dtype
        _close(leaves[2].grad, grad_ref[2], torch.float32, "grad cos")
        _close(leaves[3].grad, grad_ref[3], torch.float32, "grad sin")
    else:
        assert leaves[2].grad is None and leaves[3].grad is None


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("which", ["q", "k", "e", "qe"])
def test_partial_gradients(kernel, device, which, gen):
    """Only the asked-for gradients are computed, and they are right."""
    gq, gk, q, k, e = _inputs(19, 3, 80, torch.float32, device, gen, HK=2)
    leaves = [t.clone().requires_grad_(n in which) for t, n in zip((q, k, e), "qke")]
    torch.autograd.backward(kernel.apply_rotary_emb(*leaves), (gq, gk))
    ref = reference.reference_backward(gq, gk, q, k, e)
    for leaf, r, n in zip(leaves, ref, "qke"):
        if n in which:
            _close(leaf.grad, r, torch.float32, f"grad {n}")
        else:
            assert leaf.grad is None


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "cfg",
    [
        dict(BLOCK_S=1, BLOCK_D=64, BLOCK_R=8, num_warps=4),  # one chunk of D/2, rows looped in chunks
        dict(BLOCK_S=4, BLOCK_D=8, BLOCK_R=2, num_warps=1),  # several channel chunks, odd tail of tokens
        dict(BLOCK_S=2, BLOCK_D=16, BLOCK_R=16, num_warps=2),
    ],
)
@pytest.mark.parametrize("mode", ["bwd", "bwd_qk", "fwd", "bwd_q_only"])
@pytest.mark.parametrize("D", [72, 128])
def test_launch_configurations(kernel, device, cfg, mode, D, gen):
    """The kernel itself across block shapes: masks, row loops and channel chunks, and both
    store paths (fp32 head_dim 72's 144-byte half rows share sectors: whole-row stores when no
    table gradient is summed; head_dim 128's do not)."""
    if device == "cpu" and not INTERPRET:
        pytest.skip("the Triton kernel runs on CPU tensors only under TRITON_INTERPRET=1")
    S, HQ, HK = 13, 5, 3
    gq, gk, q, k, e = _inputs(S, HQ, D, torch.float32, device, gen, HK=HK)
    rt = submodule(kernel, "rotary_triton")  # imported at first kernel use: maybe not yet
    assert rt._row_store(D // 2, 4, grad_table=mode == "bwd") == (D == 72 and mode != "bwd")
    _launch_and_check(rt, mode, cfg, gq, gk, q, k, e)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("regs_first", [False, True])
@pytest.mark.parametrize("mode", ["bwd", "bwd_qk", "fwd"])
def test_both_places_of_the_halves_axis(kernel, device, regs_first, mode, gen, monkeypatch):
    """The halves axis of the kernel's tiles goes first or last, whichever keeps it in
    registers on the installed Triton (_REGS_FIRST); both placements compute the same thing
    (the other one is what another Triton version runs), with whole-row stores or not."""
    if device == "cpu" and not INTERPRET:
        pytest.skip("the Triton kernel runs on CPU tensors only under TRITON_INTERPRET=1")
    rt = submodule(kernel, "rotary_triton")
    monkeypatch.setattr(rt, "_REGS_FIRST", regs_first)
    rt._plan.cache_clear()  # plans hold the constexprs
    try:
        gq, gk, q, k, e = _inputs(11, 3, 72, torch.float32, device, gen, HK=2)
        _launch_and_check(rt, mode, dict(BLOCK_S=2, BLOCK_D=32, BLOCK_R=4, num_warps=1), gq, gk, q, k, e)
    finally:
        rt._plan.cache_clear()


def _launch_and_check(rt, mode, cfg, gq, gk, q, k, e, offset=0):
    """One launch of the kernel (`rt`: the rotary_triton module) in `mode` on poisoned
    outputs (views `offset` elements into their buffers), checked against float64."""
    dtype, what = q.dtype, f", offset {offset}"

    def poisoned(t):
        return torch.full((t.numel() + offset,), float("nan"), dtype=t.dtype, device=t.device)[offset:].view(t.shape)

    dq, dk, de = poisoned(q), poisoned(k), poisoned(e)
    ref = reference.reference_backward(gq, gk, q, k, e)
    if mode == "bwd":
        rt.launch_bwd(gq, gk, e, None, dq=dq, dk=dk, q=q, k=k, dtable=de, config=cfg)
        for o, r, name in zip((dq, dk, de), ref, ("dq", "dk", "de")):
            _close(o, r, torch.float32 if name == "de" else dtype, f"{mode} {name}{what}")
    elif mode == "bwd_qk":
        rt.launch_bwd(gq, gk, e.cos(), e.sin(), dq=dq, dk=dk, config=cfg)
        _close(dq, ref[0], dtype, f"{mode} dq{what}")
        _close(dk, ref[1], dtype, f"{mode} dk{what}")
    elif mode == "bwd_q_only":
        rt.launch_bwd(gq, gk, e, None, dq=dq, config=cfg)
        _close(dq, ref[0], dtype, f"{mode} dq{what}")
        assert dk.isnan().all(), "k side written though not asked for"
    else:
        rt.launch_fwd(q, k, e, None, dq, dk, config=cfg)
        for o, r in zip((dq, dk), reference.reference_forward(*(t.cpu().double() for t in (q, k, e)))):
            _close(o, r, dtype, f"fwd{what}")


def test_gradcheck_torch_path(kernel):
    """float64 gradcheck of the custom op's autograd (CPU PyTorch path), tables and q/k."""
    if INTERPRET:
        pytest.skip("float64 is a PyTorch-path feature; the Triton kernel computes in float32")
    g = torch.Generator().manual_seed(0)
    q, k = (
        torch.randn(4, 2, 8, generator=g, dtype=torch.float64),
        torch.randn(4, 3, 8, generator=g, dtype=torch.float64),
    )
    e = torch.randn(4, 8, generator=g, dtype=torch.float64)
    args = [t.requires_grad_() for t in (q, k, e)]
    assert torch.autograd.gradcheck(kernel.apply_rotary_emb, args)
    cos, sin = (t.detach().clone().requires_grad_() for t in (e.cos(), e.sin()))
    assert torch.autograd.gradcheck(kernel.apply_rotary_pos_emb_vision, [args[0], args[1], cos, sin])


@pytest.mark.gpu
@pytest.mark.parametrize("S", reference.SEQ_LENS)
def test_suite_workloads_gpu(kernel, S, gen):
    """The 16 public workloads (fp32, H=16, D=128): our tolerance and the benchmark's pass rule."""
    gq, gk, q, k, e = _inputs(S, reference.HEADS, reference.HEAD_DIM, torch.float32, "cuda", gen)
    out = kernel.rope_bwd(gq, gk, q, k, e, out=tuple(map(_poisoned, (q, k, e))))
    for o, r in zip(out, reference.reference_backward(gq, gk, q, k, e)):
        _close(o, r, torch.float32, f"S={S}")
        assert reference.sol_pass_fraction(o, r) == 1.0


@pytest.mark.gpu
@pytest.mark.parametrize("H,D", [(16, 72), (16, 80)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("S", [1, 4096, 9216])
def test_real_model_shapes_gpu(kernel, H, D, dtype, S, gen):
    """Qwen3-Omni (16x72) and Qwen2.5-VL (16x80) as the models call it: q/k views of one
    qkv projection, fp32 cos/sin from a buffer (no table grad: q/k-only backward)."""
    qkv = torch.randn(S, 3 * H * D, generator=gen).to(device="cuda", dtype=dtype)
    q, k, _ = qkv.reshape(S, 3, H, D).permute(1, 0, 2, 3).unbind(0)
    e = torch.randn(S, D, generator=gen).cuda()
    cos, sin = e.cos(), e.sin()
    gq, gk = (torch.randn(S, H, D, generator=gen).to(device="cuda", dtype=dtype) for _ in range(2))
    qq, kk = q.detach().requires_grad_(), k.detach().requires_grad_()
    outs = kernel.apply_rotary_pos_emb_vision(qq, kk, cos, sin)
    torch.autograd.backward(outs, (gq, gk))
    fwd_ref, grad_ref = _ref_vision(q, k, cos, sin, gq, gk)
    for o, r in zip(outs, fwd_ref):
        _close(o, r, dtype, "forward")
    _close(qq.grad, grad_ref[0], dtype, "grad q")
    _close(kk.grad, grad_ref[1], dtype, "grad k")


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_cuda_matches_cpu_path(kernel, gen):
    """Both variants of the package compute the same function (Triton on CUDA vs PyTorch on CPU)."""
    gq, gk, q, k, e = _inputs(300, 16, 80, torch.float32, "cpu", gen)
    cpu = kernel.rope_bwd(gq, gk, q, k, e)
    gpu = kernel.rope_bwd(*(t.cuda() for t in (gq, gk, q, k, e)))
    for a, b in zip(cpu, gpu):
        assert reference.rel_err(b, a) < 1e-6


@pytest.mark.kernels_ci
@pytest.mark.parametrize("table_grad", [False, True])
def test_backward_keeps_q_and_k_only_for_the_table_gradient(kernel, table_grad, gen):
    """When cos/sin need no gradient (the real models) autograd saves only the table:
    the backward cannot read q and k, so it moves 4 of the 6 large tensors."""
    S, H, D = 7, 2, 16
    q, k = (torch.randn(S, H, D, generator=gen).requires_grad_() for _ in range(2))
    cos, sin = (torch.randn(S, D, generator=gen).requires_grad_(table_grad) for _ in range(2))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        outs = kernel.apply_rotary_pos_emb_vision(q, k, cos, sin)
    kept = {id(t) for t in saved}
    assert (id(q) in kept, id(k) in kept) == (table_grad, table_grad)
    assert {id(cos), id(sin)} <= kept
    torch.autograd.backward(outs, [torch.randn(o.shape, generator=gen) for o in outs])
    assert q.grad is not None and k.grad is not None and (cos.grad is not None) == table_grad


@pytest.mark.kernels_ci
@pytest.mark.parametrize("device", DEVICES)
def test_eager_path_matches_the_op(kernel, device, gen):
    """Eager calls run through an autograd.Function (no dispatcher round trip); the custom
    op with its registered autograd, which torch.compile traces, must agree bit for bit."""
    S, H, D = 11, 3, 80
    q, k = (torch.randn(S, H, D, generator=gen).to(device) for _ in range(2))
    cos, sin = (torch.randn(S, D, generator=gen).to(device) for _ in range(2))
    gq, gk = (torch.randn(S, H, D, generator=gen).to(device) for _ in range(2))
    results = []
    for fn in (kernel.apply_rotary_pos_emb_vision, kernel.ops.rotary_fwd):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, cos, sin)]
        outs = fn(*leaves)
        results.append((type(outs[0].grad_fn).__name__, outs, leaves))
        torch.autograd.backward(outs, (gq, gk))
    (eager_node, eager_outs, eager_leaves), (op_node, op_outs, op_leaves) = results
    assert "EagerRotary" in eager_node and "EagerRotary" not in op_node
    for a, b in zip(eager_outs, op_outs):
        assert torch.equal(a, b)
    for a, b in zip(eager_leaves, op_leaves):
        assert torch.equal(a.grad, b.grad)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", ["bwd", "bwd_qk", "fwd", "bwd_q_only"])
def test_direct_launch_gpu(kernel, dtype, mode, gen, monkeypatch):
    """Triton compiles a shape's kernel without launching it; then every launch of the shape,
    the first too, skips Triton's argument binding and calls the compiled kernel with
    addresses (null for the pointers a mode does not use), through torch's launcher where
    torch has one. Launches must see new data, compile anew for pointers of another alignment
    (Triton specializes on it), and call launch hooks (profilers) as Triton does, through
    Triton's launcher."""
    rt = submodule(kernel, "rotary_triton")
    rt._plan.cache_clear()  # no compiled kernel left from other tests
    static_runs, static = [], rt._static

    def spy(compiled, device):
        launch = static(compiled, device)
        return launch and (lambda *a: static_runs.append(1) or launch(*a))

    monkeypatch.setattr(rt, "_static", spy)
    S, H, D = 33, 4, 72
    cfg = dict(BLOCK_S=1, BLOCK_D=32, BLOCK_R=4, num_warps=1)  # two chunks of heads per program
    triton_runs = []  # Triton's binder: compilations (warmup=True) and launches
    run = rt.rotary_kernel.run
    monkeypatch.setattr(rt.rotary_kernel, "run", lambda *a, **kw: triton_runs.append(kw["warmup"]) or run(*a, **kw))

    def check(offset):
        # views at `offset` elements into their buffers: same shapes and strides every time
        base = [torch.randn(S * H * D + offset, generator=gen).to(device="cuda", dtype=dtype) for _ in range(4)]
        gq, gk, q, k = (b[offset:].view(S, H, D) for b in base)
        e = torch.randn(S, D, generator=gen).cuda()
        _launch_and_check(rt, mode, cfg, gq, gk, q, k, e, offset)

    check(0)
    assert triton_runs == [True], "the first launch of a shape went through Triton's binder"
    check(0)
    assert triton_runs == [True]
    check(1)  # 2- or 4-byte aligned pointers: another specialization, compiled by Triton
    assert triton_runs == [True, True]
    check(1)
    assert triton_runs == [True, True]
    hooked = []
    monkeypatch.setattr(rt.triton.knobs.runtime, "launch_enter_hook", lambda meta: hooked.append(meta.get()["name"]))
    check(0)
    assert triton_runs == [True, True] and hooked == ["rotary_kernel"]
    # the four launches without hooks; CUDA builds of torch have the launcher
    assert len(static_runs) == (4 if hasattr(torch._C, "_StaticCudaLauncher") else 0)


@pytest.fixture
def direct_launch_state(kernel, monkeypatch):
    """rotary_triton with its direct-launch state restored after the test."""
    rt = submodule(kernel, "rotary_triton")
    monkeypatch.setitem(rt._DIRECT, "ok", True)
    rt._plan.cache_clear()
    yield rt
    rt._plan.cache_clear()


def test_direct_launch_needs_triton_internals(direct_launch_state, monkeypatch):
    """A Triton without the internals the direct launch uses (here: no triton.knobs) gets no
    direct launcher, one warning, and every later launch through rotary_kernel[grid]."""
    rt = direct_launch_state
    monkeypatch.delattr(rt.triton, "knobs")
    stand_in = type("Compiled", (), {"run": None, "function": None, "packed_metadata": None, "launch_metadata": None})()
    with pytest.warns(RuntimeWarning, match="does not take the direct launch"):
        assert rt._direct(stand_in, (), 0) is None
    assert rt._DIRECT["ok"] is False
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert rt._direct(stand_in, (), 0) is None  # warned once


def _compiled_stand_in(**metadata):
    """What _static reads of a compiled kernel: its name, metadata, files and signature."""
    md = {"num_ctas": 1, "num_warps": 2, "shared": 64, "global_scratch_size": 0, "profile_scratch_size": 0, **metadata}
    signature = {"X": "*bf16", "Y": "*fp32", "S": "i32", "H": "constexpr", "N": "i64"}
    files = {"k.json": "/cache/k.json", "k.cubin": "/cache/k.cubin", "k.ptx": "/cache/k.ptx"}
    return types.SimpleNamespace(
        name="k",
        metadata=types.SimpleNamespace(**md),
        metadata_group=files,
        src=types.SimpleNamespace(signature=signature),
    )


def test_static_launch_takes_runtime_arguments_only(kernel, monkeypatch, request):
    """torch's launcher loads the kernel's cubin from Triton's cache onto the given device, once
    per process, then gets the loaded function, the grid, warps and shared memory, one type
    code per runtime argument (no constexprs) and a null per scratch pointer Triton appends. A
    kernel that needs what it does not do (scratch memory, cooperative launch, several CTAs),
    one without a cubin or one it cannot load, or a torch without it, gets none."""
    rt = submodule(kernel, "rotary_triton")
    loads, calls = [], []

    def load(path, name, shared, device):
        if path != "/cache/k.cubin":
            raise RuntimeError("CUDA driver error: file not found")
        loads.append((path, name, shared, device))
        return 1234, 20, 0

    fake = types.SimpleNamespace(_load_kernel=load, _launch_kernel=lambda *a: calls.append(a))
    monkeypatch.setattr(torch._C, "_StaticCudaLauncher", fake, raising=False)
    rt._load.cache_clear()
    request.addfinalizer(rt._load.cache_clear)
    launch = rt._static(_compiled_stand_in(), 3)
    assert loads == [("/cache/k.cubin", "k", 64, 3)]
    rt._static(_compiled_stand_in(), 3)
    assert len(loads) == 1, "a kernel loaded onto a device was loaded again"
    launch((7, 2), 99, (11, 12, 40, 13))
    assert calls == [(1234, 7, 2, 1, 2, 64, "OOilOO", (11, 12, 40, 13, None, None), 99)]
    older = _compiled_stand_in()  # a Triton without scratch pointers
    del older.metadata.global_scratch_size, older.metadata.profile_scratch_size
    rt._static(older, 0)((1, 1), 0, (1, 2, 3, 4))
    assert calls[-1][6:8] == ("OOil", (1, 2, 3, 4))
    for unsupported in (
        dict(global_scratch_size=256),
        dict(launch_cooperative_grid=True),
        dict(launch_pdl=True),
        dict(num_ctas=2),
    ):
        assert rt._static(_compiled_stand_in(**unsupported), 0) is None, unsupported
    for files in ({"k.json": "/cache/k.json"}, {"k.cubin": "/elsewhere/k.cubin"}):
        assert rt._static(types.SimpleNamespace(**{**vars(_compiled_stand_in()), "metadata_group": files}), 0) is None
    monkeypatch.delattr(torch._C, "_StaticCudaLauncher")
    assert rt._static(_compiled_stand_in(), 0) is None


@pytest.mark.parametrize("driver_up", [False, True])
def test_start_up_hashes_triton_in_a_thread_once(kernel, monkeypatch, driver_up):
    """Before the first compilation in a process, with Triton's driver not yet up, Triton's
    cache key (a hash of its libraries) is computed in a thread of its own, once, while Triton
    builds its driver utilities; with the driver up, nothing starts."""
    import threading

    import triton.runtime.cache

    rt = submodule(kernel, "rotary_triton")
    threads, done = [], threading.Event()

    def triton_key():
        threads.append(threading.current_thread())
        done.set()

    monkeypatch.setattr(triton.runtime.cache, "triton_key", triton_key)
    monkeypatch.setattr(triton.runtime.driver, "_active", object() if driver_up else None)
    rt._start_up.cache_clear()
    try:
        rt._start_up()
        rt._start_up()
        if not driver_up:
            assert done.wait(10)
            threads[0].join(10)
    finally:
        rt._start_up.cache_clear()
    if driver_up:
        assert threads == []
    else:
        assert len(threads) == 1 and threads[0] is not threading.main_thread() and threads[0].daemon


@pytest.mark.gpu
@pytest.mark.parametrize("broken", ["no knobs", "launcher signature"])
def test_direct_launch_falls_back_gpu(direct_launch_state, gen, monkeypatch, broken):
    """When the direct launch's assumptions fail (an internal missing, or a launcher that takes
    other arguments), launches go through Triton's kernel[grid] with one warning, and every
    result is right."""
    rt = direct_launch_state
    if broken == "no knobs":
        monkeypatch.delattr(rt.triton, "knobs")
    else:

        def changed(kernel, const_args, device):
            def launch(grid, device, args):
                raise TypeError("function takes 12 positional arguments")

            return launch

        monkeypatch.setattr(rt, "_direct", changed)
    triton_launches = []  # Triton's binder, compilations (warmup) aside
    run = rt.rotary_kernel.run

    def spy(*a, **kw):
        if not kw["warmup"]:
            triton_launches.append(1)
        return run(*a, **kw)

    monkeypatch.setattr(rt.rotary_kernel, "run", spy)
    S, H, D = 40, 4, 72
    cfg = dict(BLOCK_S=1, BLOCK_D=32, BLOCK_R=8, num_warps=1)
    with pytest.warns(RuntimeWarning, match="does not take the direct launch"):
        for _ in range(4):
            gq, gk, q, k, e = _inputs(S, H, D, torch.bfloat16, "cuda", gen)
            _launch_and_check(rt, "bwd_qk", cfg, gq, gk, q, k, e)
    assert rt._DIRECT["ok"] is False
    assert len(triton_launches) == 4, "a launch after the failure did not go through rotary_kernel[grid]"
