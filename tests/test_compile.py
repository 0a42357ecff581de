"""torch.library.opcheck of the three custom ops, and torch.compile(fullgraph=True)
of modules that use the public functions: no graph break, same results as eager,
one compilation for every sequence length once S is marked dynamic, and what the
compiled code runs: the kernel launched by inductor itself on CUDA (S static or dynamic,
head counts and head_dim too: they are specialized), rotary_torch's math fused by
inductor on the CPU, under Triton's interpreter too (no op, no kernel in the code)."""

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from . import reference
from .helpers import DEVICES, compiled_calls, generated_code

D = 8


def rnd(gen, device, *shape, dtype=torch.float32, grad=False):
    return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype).requires_grad_(grad)


# ------------------------------------------------------------------- opcheck

# opcheck's aot_dispatch_dynamic test (AOTAutograd tracing the op and its autograd rule with
# dynamic shapes) takes most of its time; it runs on the combinations that give the rule another
# structure (angles or cos/sin, which gradients, interleaved and partial pairs), the others (another
# dtype, or one side of a structure already traced) take the schema, autograd registration and fake
# tensor tests alone.
WITHOUT_AOT = ("test_schema", "test_autograd_registration", "test_faketensor")

# (id, q heads, k heads, dtype of q/k, cos/sin table (else angles), the table needs a gradient,
# table width (< D: partial rotary), interleaved pairs, aot_dispatch_dynamic too)
FWD_COMBOS = [
    ("angles", 2, 2, torch.float32, False, False, D, False, True),
    ("angles-grad", 2, 3, torch.float32, False, True, D, False, True),
    ("cos_sin", 3, 1, torch.float32, True, False, D, False, True),
    ("cos_sin-grad", 2, 2, torch.float32, True, True, D, False, True),
    ("cos_sin-grad-bf16", 2, 4, torch.bfloat16, True, True, D, False, False),
    ("cos_sin-grad-interleaved-partial", 2, 3, torch.float32, True, True, 6, True, True),
    ("angles-interleaved", 3, 2, torch.bfloat16, False, False, D, True, False),
]


@pytest.mark.kernels_ci
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("combo", FWD_COMBOS, ids=[c[0] for c in FWD_COMBOS])
def test_opcheck_rotary_fwd(kernel, gen, device, combo):
    _, hq, hk, dtype, cos_sin, table_grad, R, interleaved, aot = combo
    S = 5
    q, k = rnd(gen, device, S, hq, D, dtype=dtype, grad=True), rnd(gen, device, S, hk, D, dtype=dtype, grad=True)
    table = rnd(gen, device, S, R, grad=table_grad)
    sin = rnd(gen, device, S, R, grad=table_grad) if cos_sin else None
    utils = {} if aot else {"test_utils": WITHOUT_AOT}
    torch.library.opcheck(kernel.ops.rotary_fwd, (q, k, table, sin, interleaved), **utils)


# (id, q heads, k heads, dtype, cos/sin table, q and k given (table gradient), need_q, need_k, table
# width, interleaved pairs, aot_dispatch_dynamic too)
BWD_COMBOS = [
    ("angles-table_grad", 2, 2, torch.float32, False, True, True, True, D, False, True),
    ("angles-q_only", 2, 3, torch.float32, False, False, True, False, D, False, True),
    ("angles-table_grad-k_only", 3, 1, torch.float32, False, True, False, True, D, False, True),
    ("cos_sin-table_grad", 2, 3, torch.float32, True, True, True, True, D, False, True),
    ("cos_sin-k_only", 2, 2, torch.float32, True, False, False, True, D, False, True),
    ("cos_sin-table_only-bf16", 4, 2, torch.bfloat16, True, True, False, False, D, False, True),
    ("angles-bf16", 2, 2, torch.bfloat16, False, True, True, True, D, False, False),
    ("cos_sin-table_grad-interleaved-partial", 2, 3, torch.float32, True, True, True, True, 6, True, True),
    ("cos_sin-q_only-partial", 2, 2, torch.bfloat16, True, False, True, False, 4, False, False),
    ("angles-k_only-interleaved", 1, 3, torch.float32, False, False, False, True, D, True, False),
]


@pytest.mark.kernels_ci
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("combo", BWD_COMBOS, ids=[c[0] for c in BWD_COMBOS])
def test_opcheck_rotary_bwd(kernel, gen, device, combo):
    _, hq, hk, dtype, cos_sin, table_grad, need_q, need_k, R, interleaved, aot = combo
    S = 5
    gq, gk = rnd(gen, device, S, hq, D, dtype=dtype), rnd(gen, device, S, hk, D, dtype=dtype)
    q = rnd(gen, device, S, hq, D, dtype=dtype) if table_grad else None
    k = rnd(gen, device, S, hk, D, dtype=dtype) if table_grad else None
    table = rnd(gen, device, S, R)
    sin = rnd(gen, device, S, R) if cos_sin else None
    utils = {} if aot else {"test_utils": WITHOUT_AOT}
    torch.library.opcheck(kernel.ops.rotary_bwd, (gq, gk, q, k, table, sin, need_q, need_k, interleaved), **utils)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("hq,hk,dtype", [(2, 2, torch.float32), (1, 3, torch.float32), (2, 3, torch.bfloat16)])
def test_opcheck_rope_bwd_out(kernel, gen, device, hq, hk, dtype):
    S = 5
    gq, q = (rnd(gen, device, S, hq, D, dtype=dtype) for _ in range(2))
    gk, k = (rnd(gen, device, S, hk, D, dtype=dtype) for _ in range(2))
    emb = rnd(gen, device, S, D)
    out = (torch.empty_like(q), torch.empty_like(k), torch.empty_like(emb))
    torch.library.opcheck(kernel.ops.rope_bwd_out, (gq, gk, q, k, emb, *out))


# ------------------------------------------------------------- torch.compile

H = 2


class VisionAttentionRope(torch.nn.Module):
    """The real models' pattern: q and k are strided views of one qkv projection, rotated
    by apply_rotary_pos_emb_vision, then attended to as [H, S, D]: their gradients come
    back transposed (head stride S*D, symbolic when S is)."""

    def __init__(self, kernel, hidden):
        super().__init__()
        self.kernel = kernel
        self.qkv = torch.nn.Linear(hidden, 3 * H * D)

    def forward(self, x, cos, sin):
        q, k, v = self.qkv(x).reshape(x.shape[0], 3, H, D).permute(1, 0, 2, 3).unbind(0)
        q, k = self.kernel.apply_rotary_pos_emb_vision(q, k, cos, sin)
        out = torch.nn.functional.scaled_dot_product_attention(*(t.transpose(0, 1) for t in (q, k, v)))
        return out.transpose(0, 1)


def _run(module, x, cos, sin, w):
    """Forward, backward with the upstream gradient w; output and every gradient."""
    for t in (x, cos, sin, *module.parameters()):
        t.grad = None
    y = module(x, cos, sin)
    y.backward(w)
    grads = [x.grad, cos.grad, sin.grad, *(p.grad for p in module.parameters())]
    return [y.detach(), *(g for g in grads if g is not None)]


def _check_compiled(module, compiled, x, cos, sin, w, n_grads):
    """Compiled forward + backward and eager, each against a float64 evaluation of the module
    (the PyTorch path): both within float32's tolerance. Compared with each other they differ
    by the order of the sums (the table's gradient over heads, inductor's fused reductions):
    1.02e-6 in one CPU run. Returns the generated code."""
    eager = _run(module, x, cos, sin, w)
    module64 = type(module)(module.kernel, module.qkv.in_features).to(x.device, torch.float64)
    module64.load_state_dict(module.state_dict())
    want = _run(module64, *(t.detach().double().requires_grad_(t.requires_grad) for t in (x, cos, sin)), w.double())
    with generated_code() as code:
        got = _run(compiled, x, cos, sin, w)
    assert len(got) == len(eager) == len(want) == n_grads
    for g, e, r in zip(got, eager, want):
        assert reference.rel_err(g, r) <= 1e-5 and reference.rel_err(e, r) <= 1e-5
    return "\n".join(code)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("table_grad", [False, True], ids=["cos_sin_buffers", "cos_sin_grad"])
def test_compile_dynamic_seq_len(kernel, gen, device, table_grad):
    torch.compiler.reset()
    hidden = 16
    module = VisionAttentionRope(kernel, hidden).to(device)
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(module, backend=counter, fullgraph=True)
    for i, S in enumerate((7, 12)):
        x = rnd(gen, device, S, hidden, grad=True)
        cos, sin = rnd(gen, device, S, D, grad=table_grad), rnd(gen, device, S, D, grad=table_grad)
        w = rnd(gen, device, S, H, D)
        for t in (x, cos, sin):
            torch._dynamo.mark_dynamic(t, 0)
        # The second length must reuse the first compilation.
        with torch._dynamo.config.patch(error_on_recompile=i > 0):
            code = _check_compiled(module, compiled, x, cos, sin, w, 6 if table_grad else 4)
        if i == 0:  # symbolic S: inductor still launches the kernel itself (static strides)
            assert compiled_calls(kernel, code) == ({"kernel"} if device == "cuda" else set())
    assert counter.frame_count == 1


@pytest.mark.interpret(table_grad=True)  # traced calls take rotary_torch under the interpreter too
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("table_grad", [False, True], ids=["cos_sin_buffers", "cos_sin_grad"])
def test_compile_static_inlines_the_kernel(kernel, gen, device, table_grad):
    """Static shapes: inductor launches rotary_kernel from its own code on CUDA (no Python
    op per step) and fuses rotary_torch's math on CPU, under the interpreter too."""
    torch.compiler.reset()
    hidden, S = 16, 9
    module = VisionAttentionRope(kernel, hidden).to(device)
    compiled = torch.compile(module, backend="inductor", fullgraph=True)
    x = rnd(gen, device, S, hidden, grad=True)
    cos, sin = rnd(gen, device, S, D, grad=table_grad), rnd(gen, device, S, D, grad=table_grad)
    code = _check_compiled(module, compiled, x, cos, sin, rnd(gen, device, S, H, D), 6 if table_grad else 4)
    assert compiled_calls(kernel, code) == ({"kernel"} if device == "cuda" else set())


@pytest.mark.parametrize("device", DEVICES)
def test_compile_symbolic_heads_launch_the_kernel(kernel, gen, device):
    """Head counts and head_dim are constexprs of the kernel: with every size symbolic
    (dynamic=True) they are specialized, and inductor still launches the kernel on CUDA (rotary_torch's
    math on CPU); the results are eager's."""
    torch.compiler.reset()
    fn = kernel.apply_rotary_pos_emb_vision
    compiled = torch.compile(fn, backend="inductor", fullgraph=True, dynamic=True)
    with generated_code() as code:
        for S, hq, hk, d in ((7, 3, 2, 6), (11, 2, 4, 10)):
            q, k = rnd(gen, device, S, hq, d, grad=True), rnd(gen, device, S, hk, d, grad=True)
            cos, sin = rnd(gen, device, S, d, grad=True), rnd(gen, device, S, d, grad=True)
            gq, gk = rnd(gen, device, S, hq, d), rnd(gen, device, S, hk, d)
            results = []
            for f in (fn, compiled):
                out = f(q, k, cos, sin)
                results.append([*out, *torch.autograd.grad(out, (q, k, cos, sin), (gq, gk))])
            for g, e in zip(*results):
                assert reference.rel_err(g, e) <= 1e-6
    assert compiled_calls(kernel, "\n".join(code)) == ({"kernel"} if device == "cuda" else set())


@pytest.mark.parametrize("device", DEVICES)
def test_compile_rope_bwd_and_rope_fwd(kernel, gen, device):
    """The destination-passing and allocating backward and the forward compile
    without a graph break and write what eager writes."""
    torch.compiler.reset()
    S, hq, hk = 6, 2, 3

    def step(gq, gk, q, k, emb, out):
        kernel.rope_bwd(gq, gk, q, k, emb, out=out)
        return kernel.rope_bwd(gq, gk, q, k, emb), kernel.rope_fwd(q, k, emb)

    args = [rnd(gen, device, S, h, D) for h in (hq, hk, hq, hk)] + [rnd(gen, device, S, D)]
    out = tuple(torch.full_like(t, float("nan")) for t in args[2:])
    got_alloc, got_fwd = torch.compile(step, fullgraph=True, backend="inductor")(*args, out)
    ref = reference.reference_backward(*args)
    for o, a, r in zip(out, got_alloc, ref):
        assert reference.rel_err(o, r) <= 2e-6 and reference.rel_err(a, r) <= 2e-6
    for g, r in zip(got_fwd, reference.reference_forward(*(t.double().cpu() for t in args[2:]))):
        assert reference.rel_err(g, r) <= 2e-6


@pytest.mark.parametrize("device", DEVICES)
def test_compile_interleaved_partial(kernel, gen, device):
    """Interleaved pairs over part of each head (cos/sin [S, R], R < D), forward and backward with
    the table gradient, compiled without a graph break: float64's results, and the kernel
    launched by inductor on CUDA."""
    torch.compiler.reset()
    S, hq, hk, d, R = 9, 3, 2, 16, 10

    def fn(q, k, cos, sin):
        return kernel.apply_rotary_pos_emb_vision(q, k, cos, sin, interleaved=True)

    compiled = torch.compile(fn, backend="inductor", fullgraph=True)
    leaves = [rnd(gen, device, S, h, d, grad=True) for h in (hq, hk)] + [
        rnd(gen, device, S, R, grad=True) for _ in "cs"
    ]
    grads = [rnd(gen, device, S, h, d) for h in (hq, hk)]
    with generated_code() as code:
        outs = compiled(*leaves)
        got = [*outs, *torch.autograd.grad(outs, leaves, grads)]
    ref_outs, ref_grads = reference.reference_rotary_grads(*grads, *leaves, interleaved=True)
    for g, r in zip(got, [*ref_outs, *ref_grads]):
        assert reference.rel_err(g, r) <= 2e-6
    assert compiled_calls(kernel, "\n".join(code)) == ({"kernel"} if device == "cuda" else set())
