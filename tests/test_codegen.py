"""The kernel's machine code, without a GPU: Triton compiles rotary_kernel for an H100/H200
(sm_90) on any machine. A layout whose strides grow with S (sdpa's gradient, passed as
multiples of S) must get the memory accesses of the same layout with constant strides (no
narrower vectors at head_dim 72/80), the kernel must compile whether S reaches it as a
runtime int (our launches) or as a constant (torch.compile may specialize it), with
interleaved pairs and partial rotary too, and the installed Triton must keep each loaded
tile in the layout it was loaded in."""

import importlib
import os
import re
from collections import Counter

import pytest
import torch

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") == "1",
    reason="compiles the JIT kernel (the interpreter replaces it): runs only without TRITON_INTERPRET=1",
)
PTRS = (
    "in_q_ptr",
    "in_k_ptr",
    "out_q_ptr",
    "out_k_ptr",
    "q_ptr",
    "k_ptr",
    "table_ptr",
    "sin_ptr",
    "grad_table_ptr",
    "grad_sin_ptr",
)
TABLES = ("table_ptr", "sin_ptr", "grad_table_ptr", "grad_sin_ptr")
CFG = (("BLOCK_S", 1), ("BLOCK_D", 64), ("BLOCK_R", 32), ("num_warps", 2))


def _compile(launch, consts, dtypes, S=None, stage="ptx"):
    """rotary_kernel compiled for sm_90 (seq_len a runtime i32, or the constant S); its PTX (or
    the code of another of Triton's stages: "ttgir")."""
    import triton
    from triton.backends.compiler import GPUTarget

    k = launch.rotary_kernel
    sig = {
        n: ("*" + dtypes[n] if n in PTRS else "i32" if n == "seq_len" and S is None else "constexpr")
        for n in k.arg_names
    }
    constexprs = {n: v for n, v in consts.items() if n != "num_warps"}
    if S is not None:
        constexprs["seq_len"] = S
    attrs = {(k.arg_names.index(p),): [["tt.divisibility", 16]] for p in PTRS}  # 16-byte aligned pointers
    src = triton.compiler.ASTSource(fn=k, signature=sig, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": consts["num_warps"]}).asm[stage]


def _memory_ops(ptx):
    return Counter(re.findall(r"\b((?:ld|st)\.global[.\w]*)", ptx))


def _case(launch, mode, D, dtype, S, encode, R=None, interleaved=False):
    """Constexprs and pointer dtypes of the real call's launch: q/k views of one qkv in the
    forward, sdpa's gradient [1, H, S, D] seen as [S, H, D] in the backward (q/k only, or with
    the table gradient); cos/sin [S, R] (R < D: partial rotary); strides encoded for S, or
    left as plain numbers."""
    H, R = 16, R or D
    views, grad, out, table = (3 * H * D, 0, D, 1), (D, 0, S * D, 1), (H * D, 0, D, 1), (R, 0, 1)  # by role
    big = "bf16" if dtype == torch.bfloat16 else "fp32"
    dtypes = {p: big for p in PTRS} | {p: "fp32" for p in TABLES}
    x = views if mode == "fwd" else grad
    tensors = [
        x,
        x,
        out,
        out,
        views if mode == "bwd" else None,
        views if mode == "bwd" else None,
        table,
        table,
        table if mode == "bwd" else None,
        table if mode == "bwd" else None,
    ]
    layout = tuple(
        None
        if st is None
        else (launch.encode_strides(st, S) if encode else st, dtype if i < 6 else torch.float32, True)
        for i, st in enumerate(tensors)
    )
    return launch._constexprs(H, H, D, R, mode != "fwd", interleaved, layout, CFG), dtypes


@pytest.fixture
def launch(kernel):
    pytest.importorskip("triton")
    return importlib.import_module(f"{kernel.__name__}.launch")


@pytest.mark.parametrize("mode", ["bwd_qk", "bwd"])
@pytest.mark.parametrize("D,R,interleaved", [(72, 72, False), (80, 80, False), (80, 48, True)])
def test_strides_that_grow_with_S_keep_the_vector_width(launch, mode, D, R, interleaved):
    S = 4097
    case = dict(R=R, interleaved=interleaved)
    encoded = _memory_ops(_compile(launch, *_case(launch, mode, D, torch.bfloat16, S, encode=True, **case)))
    constant = _memory_ops(_compile(launch, *_case(launch, mode, D, torch.bfloat16, S, encode=False, **case)))
    assert any(".v" in op for op in encoded), f"no vector accesses: {encoded}"
    assert encoded == constant


@pytest.mark.parametrize("mode", ["fwd", "bwd_qk", "bwd"])
@pytest.mark.parametrize("R,interleaved", [(72, False), (40, False), (40, True)])
def test_compiles_with_S_specialized_by_the_caller(launch, mode, R, interleaved):
    """inductor may pass S as a constant to a kernel it launches; strides that are multiples
    of S must still be computed (here: the same accesses as with S at run time)."""
    consts, dtypes = _case(launch, mode, 72, torch.bfloat16, 2048, encode=True, R=R, interleaved=interleaved)
    assert _memory_ops(_compile(launch, consts, dtypes, S=2048)) == _memory_ops(_compile(launch, consts, dtypes))


@pytest.mark.parametrize("mode", ["fwd", "bwd_qk", "bwd"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_loaded_tiles_are_used_in_place(launch, mode, dtype):
    """Both halves of a row come in by one load of a tile with an axis of 2, which tl.split
    needs in each thread's registers. Where the installed Triton puts that axis on lanes
    instead (it depends on the axis's place in the tile: launch.REGS_FIRST), it
    regroups every loaded tile through shared memory, and each regrouping waits for its tile
    before the next tile's loads issue: up to 1.6x the time on the H200. So no loaded tile
    may be converted to another layout."""
    ttgir = _compile(launch, *_case(launch, mode, 72, dtype, 4096, encode=True), stage="ttgir")
    # the heads' tiles: [2, S, H, D] or [S, H, D, 2] (the tables' [S, D, 2, 2] is regrouped by design)
    loaded = re.findall(r"(%\S+) = tt\.load \S+, .*tensor<(?:2x\d+x\d+x\d+|\d+x\d+x(?!2x)\d+x2)x!tt\.ptr", ttgir)
    assert len(loaded) == {"fwd": 2, "bwd_qk": 2, "bwd": 4}[mode], ttgir
    converted = [x for x in loaded if re.search(rf"ttg\.convert_layout {re.escape(x)}\b", ttgir)]
    assert not converted, f"loaded tiles regrouped through shared memory: {converted}"


# (mode, shape of test_ops' tables, REGS_FIRST): every mode, both pair layouts, partial rotary,
# both placements of the halves axis and both store paths (D72 and D128-R104 store whole rows
# where no table gradient is summed).
BRANCHES = [
    ("fwd", "D72", True),
    ("fwd_cs", "D80-R48-interleaved", False),
    ("bwd", "D128-R104", False),
    ("bwd_cs", "D72-interleaved", True),
    ("bwd_qk", "D128-R104", True),
    ("bwd_qk", "D72", False),
    ("bwd_q", "D80-R48", False),
    ("bwd_k", "D72-interleaved", False),
    ("bwd_table", "D80-R48-interleaved", True),
    ("bwd_q_table", "D128", False),
    ("bwd_cs", "D80-R78", False),
]


@pytest.mark.parametrize("mode,shape,regs_first", BRANCHES)
def test_every_branch_compiles(launch, monkeypatch, mode, shape, regs_first):
    """What the interpreter cannot show: Triton's compiler takes every constexpr branch (it
    types a function's statements past a taken branch's return too, where the interpreter runs
    Python). Contiguous bf16 heads, fp32 tables."""
    from .test_ops import MODES, SHAPES

    adjoint, table_kind, write_q, write_k, grad_table = MODES[mode]
    D, R, interleaved, _ = SHAPES[shape]
    H, cos_sin = 4, table_kind == "cos_sin"
    heads, table = ((H * D, 0, D, 1), torch.bfloat16, True), ((R, 0, 1), torch.float32, True)  # by role
    used = [True, True, write_q or not adjoint, write_k or not adjoint, grad_table, grad_table]
    used += [True, cos_sin, grad_table, grad_table and cos_sin]
    layout = tuple((heads if i < 6 else table) if u else None for i, u in enumerate(used))
    monkeypatch.setattr(launch, "REGS_FIRST", regs_first)
    consts = launch._constexprs(H, H, D, R, adjoint, interleaved, layout, CFG)
    dtypes = {p: "bf16" for p in PTRS} | {p: "fp32" for p in TABLES}
    assert _memory_ops(_compile(launch, consts, dtypes)), "no memory accesses"
