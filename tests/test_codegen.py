"""The kernel's machine code, without a GPU: Triton compiles rotary_kernel for an H100/H200
(sm_90) on any machine. A layout whose strides grow with S (sdpa's gradient, passed as
multiples of S) must get the memory accesses of the same layout with constant strides (no
narrower vectors at head_dim 72/80), the kernel must compile whether S reaches it as a
runtime int (our launches) or as a constant (torch.compile may specialize it), and the
installed Triton must keep each loaded tile in the layout it was loaded in."""

import importlib
import os
import re
from collections import Counter

import pytest
import torch

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") == "1", reason="compiles the JIT kernel, which the interpreter replaces"
)
PTRS = ("X_q", "X_k", "Y_q", "Y_k", "P_q", "P_k", "T0", "T1", "G0", "G1")
CFG = (("BLOCK_S", 1), ("BLOCK_D", 64), ("BLOCK_R", 32), ("num_warps", 2))


def _compile(rt, consts, dtypes, S=None, stage="ptx"):
    """rotary_kernel compiled for sm_90 (S a runtime i32, or the constant S); its PTX (or the
    code of another of Triton's stages: "ttgir")."""
    import triton
    from triton.backends.compiler import GPUTarget

    k = rt.rotary_kernel
    sig = {n: ("*" + dtypes[n] if n in PTRS else "i32" if n == "S" and S is None else "constexpr") for n in k.arg_names}
    constexprs = {n: v for n, v in consts.items() if n != "num_warps"}
    if S is not None:
        constexprs["S"] = S
    attrs = {(k.arg_names.index(p),): [["tt.divisibility", 16]] for p in PTRS}  # 16-byte aligned pointers
    src = triton.compiler.ASTSource(fn=k, signature=sig, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": consts["num_warps"]}).asm[stage]


def _memory_ops(ptx):
    return Counter(re.findall(r"\b((?:ld|st)\.global[.\w]*)", ptx))


def _case(rt, mode, D, dtype, S, encode):
    """Constexprs and pointer dtypes of the real call's launch: q/k views of one qkv in the
    forward, sdpa's gradient [1, H, S, D] seen as [S, H, D] in the backward (q/k only, or with
    the table gradient); strides encoded for S, or left as plain numbers."""
    H = 16
    views, grad, out, table = (3 * H * D, D, 1), (D, S * D, 1), (H * D, D, 1), (D, 1)
    big = "bf16" if dtype == torch.bfloat16 else "fp32"
    dtypes = {p: big for p in PTRS} | {"T0": "fp32", "T1": "fp32", "G0": "fp32", "G1": "fp32"}
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
        None if st is None else (rt._encode(st, S) if encode else st, dtype if i < 6 else torch.float32, True)
        for i, st in enumerate(tensors)
    )
    return rt._constexprs(H, D, H, mode != "fwd", layout, CFG), dtypes


@pytest.fixture
def rt(kernel):
    pytest.importorskip("triton")
    return importlib.import_module(f"{kernel.__name__}.rotary_triton")


@pytest.mark.parametrize("mode", ["bwd_qk", "bwd"])
@pytest.mark.parametrize("D", [72, 80])
def test_strides_that_grow_with_S_keep_the_vector_width(rt, mode, D):
    S = 4097
    encoded = _memory_ops(_compile(rt, *_case(rt, mode, D, torch.bfloat16, S, encode=True)))
    constant = _memory_ops(_compile(rt, *_case(rt, mode, D, torch.bfloat16, S, encode=False)))
    assert any(".v" in op for op in encoded), f"no vector accesses: {encoded}"
    assert encoded == constant


@pytest.mark.parametrize("mode", ["fwd", "bwd_qk", "bwd"])
def test_compiles_with_S_specialized_by_the_caller(rt, mode):
    """inductor may pass S as a constant to a kernel it launches; strides that are multiples
    of S must still be computed (here: the same accesses as with S at run time)."""
    consts, dtypes = _case(rt, mode, 72, torch.bfloat16, 2048, encode=True)
    assert _memory_ops(_compile(rt, consts, dtypes, S=2048)) == _memory_ops(_compile(rt, consts, dtypes))


@pytest.mark.parametrize("mode", ["fwd", "bwd_qk", "bwd"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_loaded_tiles_are_used_in_place(rt, mode, dtype):
    """Both halves of a row come in by one load of a tile with an axis of 2, which tl.split
    needs in each thread's registers. Where the installed Triton puts that axis on lanes
    instead (it depends on the axis's place in the tile: rotary_triton._REGS_FIRST), it
    regroups every loaded tile through shared memory, and each regrouping waits for its tile
    before the next tile's loads issue: up to 1.6x the time on the H200. So no loaded tile
    may be converted to another layout."""
    ttgir = _compile(rt, *_case(rt, mode, 72, dtype, 4096, encode=True), stage="ttgir")
    loaded = re.findall(r"(%\S+) = tt\.load \S+, .*tensor<(?:2x\d+x\d+x\d+|\d+x\d+x\d+x2)x!tt\.ptr", ttgir)
    assert len(loaded) == {"fwd": 2, "bwd_qk": 2, "bwd": 4}[mode], ttgir
    converted = [x for x in loaded if re.search(rf"ttg\.convert_layout {re.escape(x)}\b", ttgir)]
    assert not converted, f"loaded tiles regrouped through shared memory: {converted}"
