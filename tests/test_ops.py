"""Correctness of every public function and launch configuration against a float64
evaluation of the math (tests/reference.py: autograd of the eager forward, written as
transformers writes rotate_half, rotate_pairwise and partial rotary).

CPU tensors run the PyTorch path, or the Triton kernel in Triton's interpreter
when the process has TRITON_INTERPRET=1 (the test script runs this file both
ways, the interpret-marked cases only: tests/conftest.py); CUDA tensors run the
Triton kernel. Outputs are poisoned with NaN before every kernel writes them, so an
unwritten element fails the comparison.
"""

import functools
import math

import pytest
import torch

from . import reference
from .helpers import DEVICES, HAS_CUDA, INTERPRET, submodule

# fp32 lands near 1e-7 (a few roundings per element); bf16/fp16 outputs are rounded to 8/11 bits.
TOL = {torch.float32: 2e-6, torch.bfloat16: 1e-2, torch.float16: 2e-3}
DTYPES = list(TOL)
HEAD_DIMS = [72, 80, 128]
# Rotated channels R < D of the partial-rotary cases: tails of 32, 32 and 24 channels (24 is no
# power of two: its block is masked).
PARTIAL = {72: 40, 80: 48, 128: 104}
ROTARIES = ["halves", "halves-partial", "interleaved", "interleaved-partial"]


def rot_width(rotary, D):
    return PARTIAL[D] if rotary.endswith("partial") else D


def _inputs(S, HQ, D, dtype, device, gen, HK=None):
    x = reference.make_inputs(S, HQ, D, HK=HK, dtype=dtype, device=device, generator=gen)
    return x["grad_q_embed"], x["grad_k_embed"], x["q"], x["k"], x["embeddings"]


def _close(out, ref, dtype, what):
    err = reference.rel_err(out, ref)
    assert err <= TOL[dtype], f"{what}: rel err {err:.2e} > {TOL[dtype]:.0e}"


def _poisoned(t):
    return torch.full_like(t, float("nan"))


@pytest.mark.kernels_ci
@pytest.mark.interpret(dtype=torch.float32, D=72)
@pytest.mark.interpret(dtype=torch.bfloat16, D=80)
@pytest.mark.interpret(dtype=torch.float16, D=128)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", HEAD_DIMS)
def test_rope_bwd_and_fwd(kernel, device, dtype, D, gen):
    gq, gk, q, k, e = _inputs(11, 3, D, dtype, device, gen, HK=2)
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


@pytest.mark.kernels_ci
@pytest.mark.interpret(dtype=torch.bfloat16, D=80, rotary="halves-partial")
@pytest.mark.interpret(dtype=torch.float32, D=72, rotary="interleaved-partial")
@pytest.mark.interpret(dtype=torch.float16, D=128, rotary="interleaved")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", HEAD_DIMS)
@pytest.mark.parametrize("rotary", ROTARIES[1:])
def test_rope_bwd_and_fwd_variants(kernel, device, dtype, D, rotary, gen):
    """rope_fwd and rope_bwd (out= too) with angles [S, R] (R < D: partial rotary) and
    interleaved pairs, strided q/k: the forms of the families beyond rotate_half."""
    R, interleaved = rot_width(rotary, D), rotary.startswith("interleaved")
    gq, gk, q, k, e = _inputs(11, 3, D, dtype, device, gen, HK=2)
    q, k = (torch.cat([x, x], dim=-1)[..., ::2] for x in (q, k))  # strided views: every other channel
    e = e[:, :R].contiguous()
    fwd_ref, grad_ref = reference.reference_rotary_grads(gq, gk, q, k, e, interleaved=interleaved)
    for out in (
        kernel.rope_bwd(gq, gk, q, k, e, interleaved=interleaved),
        kernel.rope_bwd(gq, gk, q, k, e, interleaved=interleaved, out=tuple(map(_poisoned, (q, k, e)))),
    ):
        for o, r, name in zip(out, grad_ref, ("grad_q", "grad_k", "grad_embeddings")):
            assert o.shape == r.shape
            _close(o, r, torch.float32 if name == "grad_embeddings" else dtype, name)
    for o, r in zip(kernel.rope_fwd(q, k, e, interleaved=interleaved), fwd_ref):
        assert o.dtype == dtype
        _close(o, r, dtype, "rope_fwd")


@pytest.mark.interpret(dtype=torch.float16, D=72)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", HEAD_DIMS)
def test_rope_fwd_autograd(kernel, device, dtype, D, gen):
    gq, gk, q, k, e = _inputs(9, 2, D, dtype, device, gen, HK=3)
    qq, kk, ee = (t.clone().requires_grad_() for t in (q, k, e))
    outs = kernel.rope_fwd(qq, kk, ee)
    torch.autograd.backward(outs, (gq, gk))
    ref = reference.reference_backward(gq, gk, q, k, e)
    fwd_ref = reference.reference_forward(*(t.cpu().double() for t in (q, k, e)))
    for o, r in zip(outs, fwd_ref):
        _close(o, r, dtype, "forward")
    for g, r, name in zip((qq.grad, kk.grad, ee.grad), ref, "qke"):
        _close(g, r, dtype if name != "e" else torch.float32, f"grad {name}")


@pytest.mark.kernels_ci
@pytest.mark.interpret(dtype=torch.float32, D=72, table_grad=False, rotary="halves")
@pytest.mark.interpret(dtype=torch.bfloat16, D=80, table_grad=True, rotary="interleaved-partial")
@pytest.mark.interpret(dtype=torch.float16, D=128, table_grad=False, rotary="interleaved")
@pytest.mark.interpret(dtype=torch.float32, D=128, table_grad=True, rotary="halves-partial")
@pytest.mark.interpret(dtype=torch.bfloat16, D=72, table_grad=False, rotary="halves-partial")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", HEAD_DIMS)
@pytest.mark.parametrize("table_grad", [False, True])
@pytest.mark.parametrize("rotary", ROTARIES)
def test_apply_rotary_pos_emb_vision(kernel, device, dtype, D, table_grad, rotary, gen):
    """transformers' signature: strided q/k views of one qkv projection, fp32 cos/sin [S, R]
    (R < D: partial rotary), rotate_half's pairs or interleaved ones."""
    S, H, R = 9, 3, rot_width(rotary, D)
    interleaved = rotary.startswith("interleaved")
    qkv = torch.randn(S, 3 * H * D, generator=gen).to(device=device, dtype=dtype)
    q, k, _ = qkv.reshape(S, 3, H, D).permute(1, 0, 2, 3).unbind(0)
    e = torch.randn(S, R, generator=gen).to(device)
    cos, sin = e.cos(), e.sin()
    gq, gk = (torch.randn(S, H, D, generator=gen).to(device=device, dtype=dtype) for _ in range(2))
    leaves = [
        q.detach().requires_grad_(),
        k.detach().requires_grad_(),
        cos.clone().requires_grad_(table_grad),
        sin.clone().requires_grad_(table_grad),
    ]
    outs = kernel.apply_rotary_pos_emb_vision(*leaves, interleaved=interleaved)
    torch.autograd.backward(outs, (gq, gk))
    fwd_ref, grad_ref = reference.reference_rotary_grads(gq, gk, q, k, cos, sin, interleaved=interleaved)
    for o, r in zip(outs, fwd_ref):
        assert o.dtype == dtype and o.shape == (S, H, D)
        _close(o, r, dtype, "forward")
    _close(leaves[0].grad, grad_ref[0], dtype, "grad q")
    _close(leaves[1].grad, grad_ref[1], dtype, "grad k")
    if table_grad:
        # fp32 math on exactly widened inputs: fp32 accuracy whatever q's dtype
        _close(leaves[2].grad, grad_ref[2], torch.float32, "grad cos")
        _close(leaves[3].grad, grad_ref[3], torch.float32, "grad sin")
    else:
        assert leaves[2].grad is None and leaves[3].grad is None


@pytest.mark.interpret(D=72)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("D", [8, 72])
def test_partial_rotary_passes_the_tail_through_bitwise(kernel, device, D, gen):
    """Channels past R are copied, not computed: exactly the input's, whatever their values
    (NaN included), and their gradient exactly the upstream gradient's."""
    S, H, R = 5, 2, D // 2 if D == 8 else PARTIAL[D]
    q, k, gq, gk = (torch.randn(S, H, D, generator=gen).to(device, torch.bfloat16) for _ in range(4))
    q[0, 0, -1] = float("nan")
    cos, sin = (torch.randn(S, R, generator=gen).to(device) for _ in range(2))
    for interleaved in (False, True):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k)]
        outs = kernel.apply_rotary_pos_emb_vision(*leaves, cos, sin, interleaved=interleaved)
        torch.autograd.backward(outs, (gq, gk))
        for got, x in ((outs[0], q), (outs[1], k), (leaves[0].grad, gq), (leaves[1].grad, gk)):
            torch.testing.assert_close(got[..., R:], x[..., R:], rtol=0, atol=0, equal_nan=True)


@pytest.mark.interpret
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("form", ["angles", "interleaved-partial"])
@pytest.mark.parametrize("which", ["q", "k", "t", "qt"])
def test_partial_gradients(kernel, device, form, which, gen):
    """Only the asked-for gradients are computed (q only, k only, the table only, q and the
    table), and they are right: rope_fwd's angles, and cos/sin of partial interleaved pairs."""
    D = 80
    gq, gk, q, k, e = _inputs(9, 3, D, torch.float32, device, gen, HK=2)
    if form == "angles":
        tables, fn = [e], kernel.rope_fwd
    else:
        e = e[:, : PARTIAL[D]]
        tables = [e.cos(), e.sin()]
        fn = lambda *a: kernel.apply_rotary_pos_emb_vision(*a, interleaved=True)  # noqa: E731
    leaves = [t.clone().requires_grad_(n in which) for t, n in zip((q, k, *tables), "qktt")]
    torch.autograd.backward(fn(*leaves), (gq, gk))
    _, ref = reference.reference_rotary_grads(gq, gk, q, k, *tables, interleaved=form != "angles")
    for leaf, r, n in zip(leaves, ref, "qktt"):
        if n in which:
            _close(leaf.grad, r, torch.float32, f"grad {n}")
        else:
            assert leaf.grad is None


# ------------------------------------------------------ the kernel, launch by launch

# Launch configurations: several head chunks per program (BLOCK_R // 2 < heads); several channel
# blocks (only the first copies the tail) and a partial last token block; a mix.
CONFIGS = {
    "head_chunks": dict(BLOCK_S=1, BLOCK_D=64, BLOCK_R=8, num_warps=4),
    "channel_blocks": dict(BLOCK_S=4, BLOCK_D=8, BLOCK_R=2, num_warps=1),
    "mixed": dict(BLOCK_S=2, BLOCK_D=16, BLOCK_R=16, num_warps=2),
}
# What a launch computes: (backward, the table: angles or cos/sin, writes q, writes k, table gradient)
MODES = {
    "fwd": (False, "angles", True, True, False),
    "fwd_cs": (False, "cos_sin", True, True, False),
    "bwd": (True, "angles", True, True, True),
    "bwd_cs": (True, "cos_sin", True, True, True),
    "bwd_qk": (True, "cos_sin", True, True, False),
    "bwd_q": (True, "angles", True, False, False),
    "bwd_k": (True, "cos_sin", False, True, False),
    "bwd_table": (True, "angles", False, False, True),
    "bwd_q_table": (True, "cos_sin", True, False, True),
}
# (head_dim, rotated channels, interleaved, whole-row stores in fp32 where no table gradient is
# summed: half rows of 36 and 52 floats share 32-byte sectors, of 64 and 24 floats do not;
# interleaved pairs are stored whole anyway)
SHAPES = {
    "D72": (72, 72, False, True),
    "D128": (128, 128, False, False),
    "D128-R104": (128, 104, False, True),
    "D80-R48": (80, 48, False, False),
    "D80-R78": (80, 78, False, True),
    "D72-interleaved": (72, 72, True, False),
    "D80-R48-interleaved": (80, 48, True, False),
}


def launch_and_check(launch, mode, cfg, shape, dtype, device, gen, offset=0, S=13, HQ=5, HK=3):
    """One launch (`launch`: the launch module) in `mode` on fresh inputs, with poisoned outputs
    that are views `offset` elements into their buffers, checked against float64. Returns the
    outputs by launch_fwd/launch_bwd's names."""
    adjoint, table_kind, write_q, write_k, grad_table = MODES[mode]
    D, R, interleaved, _ = SHAPES[shape]

    def rnd(*shape, dt=dtype):  # the offset taken on the device: a copy there would be aligned again
        return torch.randn(math.prod(shape) + offset, generator=gen).to(device=device, dtype=dt)[offset:].view(shape)

    def poisoned(t):
        return torch.full((t.numel() + offset,), float("nan"), dtype=t.dtype, device=t.device)[offset:].view(t.shape)

    gq, gk, q, k = rnd(S, HQ, D), rnd(S, HK, D), rnd(S, HQ, D), rnd(S, HK, D)
    angles = rnd(S, R, dt=torch.float32)
    table = {"angles": angles} if table_kind == "angles" else {"cos": angles.cos(), "sin": angles.sin()}
    ref_outs, ref_grads = reference.reference_rotary_grads(gq, gk, q, k, *table.values(), interleaved=interleaved)
    if not adjoint:
        outs = {"q_out": poisoned(q), "k_out": poisoned(k)}
        launch.launch_fwd(q=q, k=k, **outs, **table, pairs=interleaved, config=cfg)
        refs = dict(zip(outs, ref_outs))
    else:
        outs = {}
        if write_q:
            outs["grad_q"] = poisoned(q)
        if write_k:
            outs["grad_k"] = poisoned(k)
        if grad_table:
            outs.update({f"grad_{n}": poisoned(t) for n, t in table.items()})
        read = {"q": q, "k": k} if grad_table else {}  # q and k are read only for the table's gradient
        launch.launch_bwd(grad_q_embed=gq, grad_k_embed=gk, **read, **outs, **table, pairs=interleaved,
                          config=cfg)  # fmt: skip
        refs = dict(zip(["grad_q", "grad_k", *(f"grad_{n}" for n in table)], ref_grads))
    for name, o in outs.items():
        # the table's gradient is fp32 math on exactly widened inputs: fp32 accuracy
        _close(
            o, refs[name], dtype if o.dim() == 3 else torch.float32, f"{mode} {shape} {dtype} offset {offset}: {name}"
        )
    return outs


@pytest.fixture
def plan_constexprs(kernel, monkeypatch):
    """The constexprs of every launch plan the test builds (the plan cache emptied first, so that
    each launch builds its plan)."""
    launch = submodule(kernel, "launch")
    built, real = [], launch._constexprs
    monkeypatch.setattr(launch, "_constexprs", lambda *args: built.append(real(*args)) or built[-1])
    launch._plan.cache_clear()
    yield built
    launch._plan.cache_clear()


@pytest.mark.interpret(mode="fwd", shape="D72", cfg="head_chunks")
@pytest.mark.interpret(mode="fwd_cs", shape="D80-R48-interleaved", cfg="channel_blocks")
@pytest.mark.interpret(mode="bwd", shape="D128", cfg="channel_blocks")
@pytest.mark.interpret(mode="bwd_cs", shape="D72-interleaved", cfg="mixed")
@pytest.mark.interpret(mode="bwd_qk", shape="D128-R104", cfg="head_chunks")
@pytest.mark.interpret(mode="bwd_q", shape="D80-R48", cfg="mixed")
@pytest.mark.interpret(mode="bwd_k", shape="D72", cfg="channel_blocks")
@pytest.mark.interpret(mode="bwd_table", shape="D128-R104", cfg="mixed")
@pytest.mark.interpret(mode="bwd_q_table", shape="D72-interleaved", cfg="head_chunks")
@pytest.mark.interpret(mode="bwd_qk", shape="D72", cfg="channel_blocks")
@pytest.mark.interpret(mode="fwd", shape="D128-R104", cfg="channel_blocks")
@pytest.mark.interpret(mode="bwd_cs", shape="D80-R48", cfg="head_chunks")
@pytest.mark.interpret(mode="fwd_cs", shape="D80-R78", cfg="channel_blocks")
@pytest.mark.interpret(mode="bwd", shape="D80-R78", cfg="mixed")
@pytest.mark.interpret(mode="bwd_q_table", shape="D80-R78", cfg="head_chunks")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", SHAPES)
def test_launch_configurations(kernel, device, cfg, mode, shape, gen, plan_constexprs):
    """The kernel itself across block shapes and what it computes: masks, head chunks, channel
    blocks, the tail of partial rotary, interleaved pairs, and both store paths (whole-row
    stores where half rows share 32-byte sectors and no table gradient is summed)."""
    if device == "cpu" and not INTERPRET:
        pytest.skip("the Triton kernel on CPU tensors: runs only under TRITON_INTERPRET=1")
    launch_and_check(submodule(kernel, "launch"), mode, CONFIGS[cfg], shape, torch.float32, device, gen)
    row_store = SHAPES[shape][3] and not MODES[mode][4]
    assert [c["ROW_STORE"] for c in plan_constexprs] == [row_store]


@pytest.mark.interpret
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("regs_first", [False, True])
@pytest.mark.parametrize(
    "mode,shape", [("fwd", "D72"), ("fwd", "D128"), ("bwd_qk", "D72"), ("bwd", "D72"), ("fwd_cs", "D128-R104")]
)
def test_both_places_of_the_halves_axis(kernel, device, regs_first, mode, shape, gen, monkeypatch, plan_constexprs):
    """The halves axis of the kernel's tiles goes first or last, whichever keeps it in
    registers on the installed Triton (launch.REGS_FIRST); both placements compute the same
    thing (the other one is what another Triton version runs), with whole-row stores or not,
    with a tail."""
    if device == "cpu" and not INTERPRET:
        pytest.skip("the Triton kernel on CPU tensors: runs only under TRITON_INTERPRET=1")
    launch = submodule(kernel, "launch")
    monkeypatch.setattr(launch, "REGS_FIRST", regs_first)
    cfg = dict(BLOCK_S=2, BLOCK_D=32, BLOCK_R=4, num_warps=1)
    launch_and_check(launch, mode, cfg, shape, torch.float32, device, gen, S=11, HQ=3, HK=2)
    row_store = SHAPES[shape][3] and not MODES[mode][4]
    assert [(c["REGS_FIRST"], c["ROW_STORE"]) for c in plan_constexprs] == [(regs_first, row_store)]


@pytest.mark.parametrize("interleaved", [False, True])
def test_gradcheck_torch_path(kernel, interleaved):
    """float64 gradcheck of the custom op's autograd (CPU PyTorch path), tables and q/k; the
    vision form also with interleaved pairs and partial rotary."""
    if INTERPRET:
        pytest.skip(
            "float64, a PyTorch-path feature (the kernel computes in float32): runs only without TRITON_INTERPRET=1"
        )
    g = torch.Generator().manual_seed(0)
    q, k = (
        torch.randn(4, 2, 8, generator=g, dtype=torch.float64),
        torch.randn(4, 3, 8, generator=g, dtype=torch.float64),
    )
    e = torch.randn(4, 8, generator=g, dtype=torch.float64)
    args = [t.requires_grad_() for t in (q, k, e)]
    assert torch.autograd.gradcheck(kernel.rope_fwd, args)
    fn = lambda *a: kernel.apply_rotary_pos_emb_vision(*a, interleaved=interleaved)  # noqa: E731
    for R in (8, 4):
        cos, sin = (t[:, :R].detach().clone().requires_grad_() for t in (e.cos(), e.sin()))
        assert torch.autograd.gradcheck(fn, [args[0], args[1], cos, sin])


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
@pytest.mark.parametrize("rotary", ["halves", "interleaved-partial"])
def test_real_model_shapes_gpu(kernel, H, D, dtype, S, rotary, gen):
    """Qwen3-Omni (16x72) and Qwen2.5-VL (16x80) as the models call it: q/k views of one
    qkv projection, fp32 cos/sin from a buffer (no table grad: q/k-only backward); and the
    same with interleaved pairs over part of each head."""
    R, interleaved = rot_width(rotary, D), rotary.startswith("interleaved")
    qkv = torch.randn(S, 3 * H * D, generator=gen).to(device="cuda", dtype=dtype)
    q, k, _ = qkv.reshape(S, 3, H, D).permute(1, 0, 2, 3).unbind(0)
    e = torch.randn(S, R, generator=gen).cuda()
    cos, sin = e.cos(), e.sin()
    gq, gk = (torch.randn(S, H, D, generator=gen).to(device="cuda", dtype=dtype) for _ in range(2))
    qq, kk = q.detach().requires_grad_(), k.detach().requires_grad_()
    outs = kernel.apply_rotary_pos_emb_vision(qq, kk, cos, sin, interleaved=interleaved)
    torch.autograd.backward(outs, (gq, gk))
    fwd_ref, grad_ref = reference.reference_rotary_grads(gq, gk, q, k, cos, sin, interleaved=interleaved)
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
    cos, sin = e[:, :48].cos(), e[:, :48].sin()
    cpu = kernel.apply_rotary_pos_emb_vision(q, k, cos, sin, interleaved=True)
    gpu = kernel.apply_rotary_pos_emb_vision(*(t.cuda() for t in (q, k, cos, sin)), interleaved=True)
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
@pytest.mark.interpret
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("interleaved", [False, True])
def test_eager_path_matches_the_op(kernel, device, interleaved, gen):
    """Eager calls run through an autograd.Function (no dispatcher round trip); the custom
    op with its registered autograd, which torch.compile traces, must agree bit for bit."""
    S, H, D, R = 7, 3, 80, 48 if interleaved else 80
    q, k = (torch.randn(S, H, D, generator=gen).to(device) for _ in range(2))
    cos, sin = (torch.randn(S, R, generator=gen).to(device) for _ in range(2))
    gq, gk = (torch.randn(S, H, D, generator=gen).to(device) for _ in range(2))
    results = []
    for fn in (functools.partial(kernel.apply_rotary_pos_emb_vision, interleaved=interleaved), kernel.ops.rotary_fwd):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, cos, sin)]
        outs = fn(*leaves) if fn is not kernel.ops.rotary_fwd else fn(*leaves, pairs=interleaved)
        results.append((type(outs[0].grad_fn).__name__, outs, leaves))
        torch.autograd.backward(outs, (gq, gk))
    (eager_node, eager_outs, eager_leaves), (op_node, op_outs, op_leaves) = results
    assert "EagerRotary" in eager_node and "EagerRotary" not in op_node
    for a, b in zip(eager_outs, op_outs):
        assert torch.equal(a, b)
    for a, b in zip(eager_leaves, op_leaves):
        assert torch.equal(a.grad, b.grad)
