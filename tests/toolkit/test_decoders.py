"""Every family of the installed transformers whose modeling module defines the decoders'
`apply_rotary_pos_emb`: classified by the package's probes into its variant, or refused
with an error that names it; and, classified, the function kernelized equals the family's
own (values, output dtypes, gradients of q, k, cos and sin) on this test's own data: the
attention's [B, H, S, D] views of one projection with GQA, tables per sequence and shared
by the batch, bf16 q and k with float32 tables, and a partial rotary where the function
takes it. A refused function is checked against every layer of its form on that data: none
may compute it. On CPU tensors (the PyTorch path, or the Triton kernel in its interpreter
with TRITON_INTERPRET=1) and on the GPU, small shapes.
"""

import copy
import functools
import inspect
import os
import re
import zlib

import pytest
import torch
from kernels import Mode
from torch._dynamo.testing import CompileCounterWithBackend

from rope_bwd_triton import models

from ..helpers import COMPILE_BACKEND, DEVICES
from ..reference import rel_err
from .test_families import defining_families, kernelized
from .test_kernelize_transformers import assert_kernelized

FAMILIES = defining_families("apply_rotary_pos_emb")
B, S, HQ, HK, D = 2, 5, 4, 2, 16
R = D - 6  # a partial rotary: 5 pairs, an odd number
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
F32, BF16 = torch.float32, torch.bfloat16


def _params(fn):
    return tuple(inspect.signature(fn.forward if isinstance(fn, torch.nn.Module) else fn).parameters)


# (what, q dtype, k dtype, table dtype, table batch (0: [S - 2, width], the patch tokens after a
# prefix of two), table width, unsqueeze_dim)
CASES = [
    ("float32", F32, F32, F32, B, D, 1),
    ("float32, tables shared by the batch", F32, F32, F32, 1, D, 1),
    ("bf16 q and k, float32 tables", BF16, BF16, F32, B, D, 1),
    ("bf16 q, float32 k and tables", BF16, F32, F32, B, D, 1),
    ("float32, partial rotary", F32, F32, F32, B, R, 1),
    ("float32, q and k [B, S, H, D]", F32, F32, F32, B, D, 2),
    ("float32, a table value per pair", F32, F32, F32, B, D // 2, 1),
    ("bf16 q and k, float32 tables of a value per pair", BF16, BF16, F32, B, D // 2, 1),
    ("float32, tables of a value per pair, partial", F32, F32, F32, B, R // 2, 1),
    ("float32, tables of the tokens past a prefix", F32, F32, F32, 0, D, 1),
    ("bf16 q and k, tables of the tokens past a prefix", BF16, BF16, F32, 0, D, 1),
]
FULL = {what for what, *_, width, _ in CASES if width in (D, D // 2) and "bf16" not in what}  # every channel rotated


def _case_inputs(gen, device, dt_q, dt_k, dt_table, tables, rot, heads_first):
    """q and k as an attention makes them (one projection, split, heads first or not), the tables."""
    proj = torch.randn(B, S, (HQ + HK) * D, generator=gen).to(device)
    q, k = (x.unflatten(-1, (-1, D)) for x in proj.split([HQ * D, HK * D], -1))
    if heads_first:
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    shape = (tables, S, rot) if tables else (S - 2, rot)
    cos, sin = (torch.randn(*shape, generator=gen).to(device, dt_table) for _ in range(2))
    return [q.to(dt_q), k.to(dt_k), cos, sin]


def _call(fn, single, q, k, cos, sin, unsqueeze_dim):
    """The function's (q_embed, k_embed): a function of one tensor is called for each."""
    kw = {} if unsqueeze_dim == 1 else {"unsqueeze_dim": unsqueeze_dim}
    if single:
        return fn(q, cos, sin, **kw), fn(k, cos, sin, **kw)
    return tuple(fn(q, k, cos, sin, **kw))


class Cases:
    """The CASES on one device, drawn once for every family: each case's inputs and output
    cotangents, and each layer's outputs and gradients on them, computed once. A layer is the
    same for every family of its variant, and each launch in Triton's interpreter takes most
    of a second."""

    def __init__(self, gen, device):
        self.data = {}
        for what, dt_q, dt_k, dt_table, tables, rot, dim in CASES:
            args = _case_inputs(gen, device, dt_q, dt_k, dt_table, tables, rot, heads_first=dim == 1)
            cots = [torch.randn(x.shape, generator=gen).to(device) for x in args[:2]]
            self.data[what] = args, dim, cots
        self.results = {}

    def taken(self, own, single):
        """The cases own takes (it raises on shapes its models never pass)."""
        taken = []
        for what, (args, dim, _) in self.data.items():
            try:
                with torch.no_grad():
                    _call(own, single, *args, dim)
            except Exception:
                continue
            taken.append(what)
        return taken

    def run(self, name, layer, single, what):
        """The layer's (outputs, gradients of q, k, cos and sin) on the case, or what it raised."""
        if (name, what) not in self.results:
            args, dim, cots = self.data[what]
            leaves = [a.detach().requires_grad_() for a in args]
            try:
                outs = _call(layer, single, *leaves, dim)
                grads = torch.autograd.grad(
                    outs, leaves, [c.to(o.dtype) for c, o in zip(cots, outs)], allow_unused=True
                )
                self.results[name, what] = [o.detach() for o in outs], grads
            except Exception as e:
                self.results[name, what] = e
        return self.results[name, what]

    def mismatch(self, name, layer, own, single, taken):
        """How the layer differs from own on the cases: dtypes, values or gradients (against own in
        float64), or "" when it does not."""
        for what in taken:
            args, dim, cots = self.data[what]
            got = self.run(name, layer, single, what)
            if isinstance(got, Exception):
                return f"{what}: raised {type(got).__name__}: {got}"
            outs, grads = got
            with torch.no_grad():
                want = [o.dtype for o in _call(own, single, *args, dim)]
            if [o.dtype for o in outs] != want:
                return f"{what}: outputs in {[o.dtype for o in outs]}, not {want}"
            ref_leaves = [a.detach().double().requires_grad_() for a in args]
            refs = _call(own, single, *ref_leaves, dim)
            cot = [c.to(o.dtype).double() for c, o in zip(cots, outs)]  # what the layer's backward got
            ref_grads = torch.autograd.grad(refs, ref_leaves, cot, allow_unused=True)
            for out_name, o, ref in zip(("q_embed", "k_embed"), outs, refs):
                if rel_err(o, ref) > TOL[o.dtype]:
                    return f"{what}: {out_name} rel err {rel_err(o, ref):.2e}"
            for x_name, g, ref, x in zip(("q", "k", "cos", "sin"), grads, ref_grads, args):
                if (g is None) != (ref is None) or (g is not None and g.dtype != x.dtype):
                    return f"{what}: grad of {x_name} {None if g is None else g.dtype}, want {x.dtype}"
                if g is not None and rel_err(g, ref) > TOL[g.dtype]:
                    return f"{what}: grad of {x_name} rel err {rel_err(g, ref):.2e}"
        return ""


@pytest.fixture(scope="module")
def cases(request):
    """Cases per device, for the module: seeded from its id (and ROPE_SEED, as the gen fixture)."""
    seed = zlib.crc32(request.node.nodeid.encode()) ^ int(os.environ.get("ROPE_SEED", "0"))
    gen, by_device = torch.Generator().manual_seed(seed), {}

    def on(device):
        if device not in by_device:
            by_device[device] = Cases(gen, device)
        return by_device[device]

    return on


def test_the_package_finds_every_family(kernel):
    """find_families reads the same sources: every family defining the function (it may find
    more: a module that only calls or imports it)."""
    found = kernel.integrations.find_families("apply_rotary_pos_emb")
    assert set(FAMILIES) <= set(found) and {"llama", "qwen3", "gemma2", "phi3", "qwen3_omni_moe"} <= set(FAMILIES)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", FAMILIES)
def test_decoder_family(kernel, integrations, family, device, cases):
    """Classified: the family's function kernelized (a copy of the module global of the class
    make_kernelizable gives it, as kernels gives each model its own) runs the variant's layer
    and equals the family's own function. Refused: an error naming the function, nothing
    patched, and no layer of its form computes it (or it takes parameters no form takes)."""
    M = models.modeling_module(family)
    own = M.apply_rotary_pos_emb
    qualified = f"{M.__name__}.apply_rotary_pos_emb"
    forms = {params: form for form, params in kernel.layers.PARAMS.items() if form != "vision"}
    form = forms.get(_params(own))
    try:
        variant = integrations.classify(own, qualified)
    except ValueError as e:
        variant, refusal = None, str(e)
    if variant is None:
        assert refusal.startswith(f"{qualified} matches none of the supported rotary variants"), refusal
        if form is None:
            assert f"it takes {_params(own)}" in refusal
        else:
            on, single = cases(device), form == "single"
            taken = on.taken(own, single)
            for v in (v for v in integrations.VARIANTS if v.form == form):
                layer = getattr(kernel.layers, v.layer_name)()
                assert not taken or on.mismatch(v.layer_name, layer, own, single, taken), (
                    f"refused, but {v.layer_name} computes it: {refusal}"
                )
        with pytest.raises(ValueError, match=re.escape(qualified)):
            integrations.make_kernelizable(families=[family])
        assert not integrations._PATCHED and M.apply_rotary_pos_emb is own
        return
    assert variant.form == form and variant.layer_name in integrations.LAYER_NAMES
    if integrations._attention_classes(M, "apply_rotary_pos_emb"):
        integrations.make_kernelizable(families=[family])
        assert integrations._PATCHED[family, "apply_rotary_pos_emb"].original is own
        layer = kernelized(integrations, type(M.apply_rotary_pos_emb)(), device)
        assert layer.forward.__func__ is getattr(kernel.layers, variant.layer_name).forward
    else:  # no class calls it by name (Jamba's attention has no rotary): nothing to patch, the layer alone
        with pytest.raises(ValueError, match=f"no class of {re.escape(M.__name__)} calls its rotary function"):
            integrations.make_kernelizable(families=[family])
        layer = getattr(kernel.layers, variant.layer_name)()
    on, single = cases(device), form == "single"
    # the cases of tables of a value per pair are for those variants alone (a channel variant takes
    # a D/2-wide table as the partial rotary its own case covers; an odd width, as no model asks)
    taken = [w for w in on.taken(own, single) if variant.table == "pair" or "per pair" not in w]
    assert FULL & set(taken), f"{qualified} raised on every case that rotates all of head_dim"
    assert not (mismatch := on.mismatch(variant.layer_name, layer, own, single, taken)), mismatch


def _interpreter_key(kernel, family):
    """What test_decoder_family launches for the family (tests/toolkit/conftest.py keeps one family
    per key in Triton's interpreter): its variant's layer on the cases it takes, each layer's
    results computed once per case (Cases); a refused function: None (kept)."""
    own = models.modeling_module(family).apply_rotary_pos_emb
    try:
        variant = kernel.integrations.classify(own)
    except ValueError:
        return None
    taken = _shapes().taken(own, variant.form == "single")
    return variant.layer_name, tuple(w for w in taken if variant.table == "pair" or "per pair" not in w)


@functools.cache
def _shapes():
    return Cases(torch.Generator().manual_seed(0), "cpu")  # which cases a function takes: their shapes alone


INTERPRETER_KEYS = {"test_decoder_family": _interpreter_key}

# ------------------------------------------------------------------------------ tiny models

TRAINED = [*models.DECODERS, *models.WHOLE]  # Llama, Qwen3, Gemma-2, Phi-3 (partial), Qwen3-VL, Qwen3-Omni
STEP_TOL = 1e-5  # float32 models: the kernel's rotary against transformers' through the net


def build(family, **config):
    """A tiny float32 model of `family` (models.py's factory, random init), its inputs, its step."""
    if family in models.DECODERS:
        model = models.make_decoder_model(family, **config)
        return model, (models.make_tokens(model, B, 7),), models.decoder_step
    model = models.WHOLE[family]()
    return model, (models.whole_inputs(model),), models.whole_step


def train_step(model, inputs, step):
    """One step: the outputs, the loss, and every parameter's gradient (None where it gets none)."""
    model.zero_grad(set_to_none=True)
    out, loss = step(model, *inputs)
    loss.backward()
    outs = out if isinstance(out, list) else [out.logits]
    return [o.detach() for o in outs], loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def assert_same_step(got, ref, tol=STEP_TOL):
    (outs, loss, grads), (ref_outs, ref_loss, ref_grads) = got, ref
    assert rel_err(loss, ref_loss) < tol, f"loss rel err {rel_err(loss, ref_loss):.2e}"
    assert len(outs) == len(ref_outs)
    for i, (o, r) in enumerate(zip(outs, ref_outs)):
        assert rel_err(o, r) < tol, f"output {i}: rel err {rel_err(o, r):.2e}"
    assert grads.keys() == ref_grads.keys()
    for name, g in grads.items():
        r = ref_grads[name]
        assert (g is None) == (r is None), name
        assert g is None or rel_err(g, r) < tol, f"grad of {name}: rel err {rel_err(g, r):.2e}"


@pytest.mark.parametrize("family", TRAINED)
def test_tiny_model_trains_as_eager(kernel, integrations, rotary_calls, family):
    """A float32 training step of the family's tiny model kernelized with kernelize_rotary
    (Mode.TRAINING, CPU): every attention that calls a rotary runs the package's layer of its
    variant, and the loss, the outputs and every parameter's gradient are eager's. Qwen3-Omni:
    its vision encoder, thinker, talker, code predictor and code2wav's transformer; Phi-3
    rotates half of each head."""
    eager, inputs, step = build(family)
    model = copy.deepcopy(eager)
    ref = train_step(eager, inputs, step)  # first: a layer shared by the family's models is then the eager one
    integrations.kernelize_rotary(model, mode=Mode.TRAINING, device="cpu")
    M = models.modeling_module(family)
    want = {integrations.classify(p.original).layer_name for (f, _), p in integrations._PATCHED.items() if f == family}
    assert_kernelized(kernel, model, *want)
    got = train_step(model, inputs, step)
    assert_same_step(got, ref)
    per_step = {name: sum(map(integrations._attention_classes(M, name).__contains__, map(type, model.modules())))
                for name in integrations.NAMES}  # fmt: skip
    assert per_step["apply_rotary_pos_emb"] > 0 and set(rotary_calls) == {n for n, c in per_step.items() if c}
    # a function of one tensor runs several times per attention (DeepSeek-V4: q, the key/value, its
    # compressors' entries, the output's inverse rotation); one of q and k once
    several = {v.form for v in map(integrations.classify, (p.original for p in integrations._PATCHED.values()))}
    for name, count in rotary_calls.items():
        assert count >= per_step[name] if "single" in several else count == per_step[name], (name, count)


def test_compiled_decoder_has_no_graph_break_nor_recompile(kernel, integrations):
    """A kernelized tiny Llama (Mode.TRAINING | TORCH_COMPILE) compiled whole, fullgraph: a training
    step at two sequence lengths, the token axis marked dynamic, compiles one graph (error_on_recompile
    on the second) whose loss and gradients are eager's."""
    eager, _, step = build("llama", num_hidden_layers=1)  # one layer: half the tracing
    model = copy.deepcopy(eager)
    lengths = (7, 12)
    batches = [(models.make_tokens(eager, B, n, seed=n),) for n in lengths]
    refs = [train_step(eager, ids, step) for ids in batches]
    integrations.kernelize_rotary(model, mode=Mode.TRAINING | Mode.TORCH_COMPILE, device="cpu")
    assert_kernelized(kernel, model, "ApplyRotaryPosEmbPromoted")
    torch._dynamo.reset()
    counter = CompileCounterWithBackend(COMPILE_BACKEND["cpu"])
    model.compile(backend=counter, fullgraph=True)  # in place: parameter names stay eager's
    for i, (ids, ref) in enumerate(zip(batches, refs)):
        torch._dynamo.mark_dynamic(ids[0], 1)
        with torch._dynamo.config.patch(error_on_recompile=i > 0):
            assert_same_step(train_step(model, ids, step), ref)
    assert counter.frame_count == 1
