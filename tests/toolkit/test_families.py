"""Every family of the installed transformers whose vision attention calls a module-level
`apply_rotary_pos_emb_vision`: found at run time by the package, classified into its
variant, and, kernelized, equal to the family's own function (values, output dtypes, and
the gradients of q, k, cos and sin). Tiny vision encoders of families beyond the first
three, built from each family's own configuration class (random init, no downloads), train
a step kernelized as eager does, alone and together in one model.

The families come from this test's own reading of transformers' sources, so a release
that adds one is tested without a change here; families of the release this was written
against that the installed one lacks are listed, and skip with the reason. CUDA runs
where available; on CPU the PyTorch path runs, or the Triton kernel in Triton's
interpreter under TRITON_INTERPRET=1 (the function cases are small for it: S=5, 2 heads).
"""

import copy
import importlib
import inspect
import re
from pathlib import Path

import pytest
import torch
import transformers
from kernels import KernelizeFallback, Mode, kernelize, use_kernel_mapping

from rope_bwd_triton import models
from rope_bwd_triton.build import repo_id

from ..helpers import COMPILE_BACKEND, DEVICES, INTERPRET
from ..reference import rel_err
from .test_kernelize_transformers import assert_kernelized, run


def defining_families(name: str) -> list:
    """The families whose modeling module defines the function `name` (this test's own reading)."""
    pattern = re.compile(rf"^def {name}\(", re.M)
    base = Path(transformers.models.__path__[0])
    return sorted(
        d.name
        for d in base.iterdir()
        if (d / f"modeling_{d.name}.py").is_file() and pattern.search((d / f"modeling_{d.name}.py").read_text())
    )


FAMILIES = defining_families("apply_rotary_pos_emb_vision")
# The families of transformers 5.24, where this was written: those an older release lacks skip.
KNOWN = (
    "cohere_compass dots3_note ernie4_5_vl_moe exaone4_5 glm4v glm4v_moe glm5_next glm_ocr inkling2 kimi_k25 "
    "lfm3_vl minimax_m3_vl mlcd muse_glimmer muse_spark paddleocr_vl qwen2_5_omni qwen2_5_vl qwen2_vl qwen3_5 "
    "qwen3_5_moe qwen3_omni_moe qwen3_vl qwen3_vl_moe qwen4_exp step3p7 video_llama_3"
).split()
# (pairs, dtype rule) where a family is not rotate_half with its inputs' dtypes kept
VARIANTS = {"inkling2": ("interleaved", "kept"), "minimax_m3_vl": ("halves", "promoted")}
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}  # bf16: its rounding (2^-9), float32: a few float32 ops


def present(family):
    if family not in FAMILIES:
        pytest.skip(f"transformers {transformers.__version__} has no {family} (or it defines no vision rotary)")


def kernelized(integrations, layer_or_model, device, mode=Mode.TRAINING):
    # Raise on any failure of ours; layers of transformers' own that this mapping does not name
    # (GeluTanh, with kernels >= 0.19) keep their forward.
    with use_kernel_mapping(integrations.kernel_mapping(repo_id(), version=1)):
        return kernelize(
            layer_or_model, mode=mode, device=torch.device(device).type, use_fallback=KernelizeFallback.NO_LAYER
        )


def vision_config(family):
    """The family's vision configuration class (the first in its configuration module),
    or None."""
    module = importlib.import_module(f"transformers.models.{family}.configuration_{family}")
    classes = [
        c
        for name, c in vars(module).items()
        if inspect.isclass(c)
        and issubclass(c, transformers.PretrainedConfig)
        and c.__module__ == module.__name__
        and c.__name__ == name
        and "Vision" in name
    ]
    return classes[0] if classes else None


def vision_heads(family):
    """(head_dim, heads, config class name) of the family's vision attention with its
    configuration's defaults; (16, None, None) when there is none to read."""
    cls = vision_config(family)
    if cls is None:
        return 16, None, None
    cfg = cls()
    heads = getattr(cfg, "num_heads", None) or cfg.num_attention_heads
    width = getattr(cfg, "embed_dim", None) or cfg.hidden_size  # Qwen2-VL: embed_dim is the attention's
    return getattr(cfg, "head_dim", None) or width // heads, heads, cls.__name__


# ------------------------------------------------------------------ found and classified


def test_families_are_found_and_classified(kernel):
    """The package finds every family that defines the function (it may find more: it also
    counts a module that imports it), and classifies each as its variant."""
    integrations = kernel.integrations
    found = integrations.find_families("apply_rotary_pos_emb_vision")
    assert set(FAMILIES) <= set(found) and {"qwen2_vl", "qwen2_5_vl", "glm4v", "qwen3_vl"} <= set(found)
    for family in found:
        variant = integrations.classify(models.modeling_module(family).apply_rotary_pos_emb_vision)
        assert variant.form == "vision" and variant[1:3] == VARIANTS.get(family, ("halves", "kept")), family
        assert variant[3:] == ("channel", "first"), family
        assert variant.layer_name in integrations.LAYER_NAMES and hasattr(kernel.layers, variant.layer_name)


def _rotate_the_other_way(q, k, cos, sin):
    def turn(x):
        half = x.shape[-1] // 2
        return torch.cat((x[..., half:], -x[..., :half]), dim=-1)

    return q * cos[:, None] + turn(q) * sin[:, None], k * cos[:, None] + turn(k) * sin[:, None]


def _always_float32(q, k, cos, sin):
    c, s = cos[:, None].float(), sin[:, None].float()

    def rotary(x):
        x = x.float()
        x1, x2 = x.chunk(2, dim=-1)
        return x * c + torch.cat((-x2, x1), dim=-1) * s

    return rotary(q), rotary(k)


def _extra_argument(q, k, cos, sin, position_ids):
    return q, k


@pytest.mark.parametrize(
    "function, why",
    [
        (_rotate_the_other_way, "as ApplyRotaryPosEmbVision, .*relative error"),
        (_always_float32, "outputs in torch.float32, torch.float32, not torch.float64, torch.float64"),
        (_extra_argument, "it takes"),
    ],
    ids=["values", "dtypes", "signature"],
)
def test_a_function_of_no_variant_is_refused(kernel, integrations, monkeypatch, function, why):
    """Named, in a model, or among every family: a clear error naming it and why, and
    nothing patched (the default, every family, leaves it as it is and warns)."""
    M, other = models.modeling_module("qwen2_vl"), models.modeling_module("glm4v")
    own = other.apply_rotary_pos_emb_vision
    monkeypatch.setattr(M, "apply_rotary_pos_emb_vision", function)
    message = (
        r"transformers\.models\.qwen2_vl\.modeling_qwen2_vl\.apply_rotary_pos_emb_vision "
        rf"matches none of the supported rotary variants \(.*\): .*{why}"
    )
    with pytest.raises(ValueError, match=message):
        integrations.make_kernelizable(families=["glm4v", "qwen2_vl"])
    model = torch.nn.ModuleList(
        [build_encoder("glm4v", torch.float32, "cpu"), build_encoder("qwen2_vl", torch.float32, "cpu")]
    )
    with pytest.raises(ValueError, match=message):
        integrations.kernelize_vision_rotary(model, mode=Mode.TRAINING, device="cpu")
    assert not integrations._PATCHED and other.apply_rotary_pos_emb_vision is own
    assert M.apply_rotary_pos_emb_vision is function
    assert not any(hasattr(m, "_kernel_funcs") for m in model.modules())
    with pytest.warns(UserWarning, match=message):
        patched = integrations.make_kernelizable()
    assert "qwen2_vl" not in patched and "glm4v" in patched and M.apply_rotary_pos_emb_vision is function


def test_every_family_by_default(kernel, integrations):
    """make_kernelizable() with neither models nor names: every family found whose functions
    are all of a variant, vision and decoder ones, each function as its variant's layer (or
    transformers' hook name, for Llama's variant); the others named in one warning;
    restore_transformers puts every function back (the fixture checks)."""
    with pytest.warns(UserWarning, match="left as transformers has them") as warned:
        patched = integrations.make_kernelizable()
    (warning,) = [w for w in warned if "left as transformers has them" in str(w.message)]
    left = {line.split(":")[0] for line in str(warning.message).splitlines()[1:]}
    assert patched == [f for f in integrations.find_families() if f not in left] and set(FAMILIES) <= set(patched)
    assert {f for f, _ in integrations._PATCHED} == set(patched)
    for (family, name), patch in integrations._PATCHED.items():
        variant = integrations.classify(patch.original)
        want = integrations.HOOK if variant == integrations.HOOK_VARIANT else variant.layer_name
        assert getattr(models.modeling_module(family), name).kernel_layer_name == want, (family, name)


def test_unknown_family_is_named(kernel, integrations):
    with pytest.raises(ValueError, match="transformers has no family 'no_such_family'"):
        integrations.make_kernelizable(families=["no_such_family"])
    with pytest.raises(ValueError, match="modeling_bert has no apply_rotary_pos_emb_vision or apply_rotary_pos_emb"):
        integrations.make_kernelizable(families=["bert"])
    assert not integrations._PATCHED


# ---------------------------------------------------------- the function, family by family

S, HEADS = 5, 2
F32, BF16 = torch.float32, torch.bfloat16


def _accepts(own, lead, D, R):
    try:
        own(torch.zeros(*lead, HEADS, D), torch.zeros(*lead, HEADS, D), torch.zeros(S, R), torch.zeros(S, R))
    except Exception:  # shapes its model never passes
        return False
    return True


def _cases(own, D):
    """(what, leading dims, q/k dtype, cos/sin dtype, rotated channels): the dtypes families
    pass (cos/sin float32 with bf16 q/k in most, all bf16 in MiniMax-M3) on q [S, H, D], or
    [1, S, H, D] where the family's function takes only that; a batch of one and a partial
    rotary (head_dim - 2 channels: an odd number of pairs) in float32 where it takes them."""
    three_d = _accepts(own, (S,), D, D)
    lead = (S,) if three_d else (1, S)
    cases = [
        ("float32", lead, F32, F32, D),
        ("bf16 q/k, float32 cos/sin", lead, BF16, F32, D),
        ("bf16", lead, BF16, BF16, D),
    ]
    if three_d and _accepts(own, (1, S), D, D):
        cases.append(("float32, q [1, S, H, D]", (1, S), F32, F32, D))
    if _accepts(own, lead, D, D - 2):
        cases.append(("float32, partial rotary", lead, F32, F32, D - 2))
    return cases


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", sorted(set(FAMILIES) | set(KNOWN)))
def test_kernelized_function_equals_the_familys(kernel, integrations, family, device, gen):
    """The family's function kernelized (its variant's layer) against the family's own
    function in float64 on the same values: outputs and the gradients of q, k, cos and sin;
    the output dtypes those of the family's function on the inputs' dtypes. head_dim is
    the one of the family's vision configuration (defaults); the partial case rotates
    head_dim - 2 channels (an odd number of pairs) where the family's function takes it."""
    present(family)
    M = models.modeling_module(family)
    own = M.apply_rotary_pos_emb_vision
    variant = integrations.classify(own)
    integrations.make_kernelizable(families=[family])
    layer = kernelized(integrations, M.apply_rotary_pos_emb_vision, device)
    assert layer.forward.__func__ is getattr(kernel.layers, variant.layer_name).forward
    D = vision_heads(family)[0]
    for what, lead, dt, table_dt, R in _cases(own, D):

        def rnd(*shape, dtype):
            return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype).requires_grad_()

        q, k = rnd(*lead, HEADS, D, dtype=dt), rnd(*lead, HEADS, D, dtype=dt)
        cos, sin = rnd(S, R, dtype=table_dt), rnd(S, R, dtype=table_dt)
        outs = layer(q, k, cos, sin)
        with torch.no_grad():
            want_dtypes = [o.dtype for o in own(q, k, cos, sin)]
        assert [o.dtype for o in outs] == want_dtypes, what
        leaves = [t.detach().double().requires_grad_() for t in (q, k, cos, sin)]
        refs = own(*leaves)
        cot = [torch.randn(o.shape, generator=gen).to(device=device, dtype=o.dtype) for o in outs]
        grads = torch.autograd.grad(outs, (q, k, cos, sin), cot)
        ref_grads = torch.autograd.grad(refs, leaves, [c.double() for c in cot])
        for name, got, ref in zip(("q_embed", "k_embed"), outs, refs):
            assert rel_err(got, ref) <= TOL[got.dtype], f"{what}: {name} rel err {rel_err(got, ref):.2e}"
        for name, got, ref, x in zip(("q", "k", "cos", "sin"), grads, ref_grads, (q, k, cos, sin)):
            assert got.dtype == x.dtype and rel_err(got, ref) <= TOL[got.dtype], (
                f"{what}: grad of {name} rel err {rel_err(got, ref):.2e}"
            )


def _interpreter_key(kernel, family):
    """What test_kernelized_function_equals_the_familys launches for the family (tests/toolkit/
    conftest.py keeps one family per key in Triton's interpreter): its variant's layer, its
    head_dim, and the shapes and dtypes of its cases; None (kept) for a family the installed
    transformers lacks."""
    if family not in FAMILIES:
        return None
    own = models.modeling_module(family).apply_rotary_pos_emb_vision
    D = vision_heads(family)[0]
    cases = tuple((lead, dt, table_dt, R) for _, lead, dt, table_dt, R in _cases(own, D))
    return kernel.integrations.classify(own).layer_name, D, cases


INTERPRETER_KEYS = {"test_kernelized_function_equals_the_familys": _interpreter_key}

# ------------------------------------------------------------------------- tiny encoders

# family -> tiny configuration (head_dim 16) of its vision model (models.FAMILIES)
ENCODERS = {
    "qwen2_vl": dict(embed_dim=32, hidden_size=48, num_heads=2, depth=2, mlp_ratio=2, patch_size=4),
    "glm4v": models.TRAINED["glm4v"][1],  # the tiny encoder e2e --varres --quick trains
    "inkling2": dict(
        hidden_size=32,
        num_attention_heads=2,
        num_hidden_layers=2,
        intermediate_size=64,
        patch_size=4,
        posemb_grid_size=4,
        projection_hidden_dim=48,
        text_hidden_size=48,
    ),
    # its rotary takes 12 of the 16 channels (3 axes of 2 pairs), 4 pass through
    "minimax_m3_vl": dict(
        hidden_size=32, num_attention_heads=2, num_hidden_layers=2, intermediate_size=64, patch_size=4
    ),
}
# Two images: the per-image attention split runs. Fewer tokens in Triton's interpreter, whose
# time grows with them.
GRIDS = [[1, 2, 4], [1, 2, 2]] if INTERPRET else [[1, 4, 8], [1, 4, 4]]
ENCODER_TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}  # as test_kernelize_transformers


def build_encoder(family, dtype, device):
    return models.make_vision_model(family, dtype=dtype, device=device, **ENCODERS[family])


def encoder_inputs(family, model, seed=0):
    """(pixel values, grid) for GRIDS, in the layout the family's vision model reads."""
    cfg, gen = model.config, torch.Generator().manual_seed(seed)
    if family == "inkling2":  # image patches [tokens, merge*patch, merge*patch, C], grid in merged tokens
        m, p = cfg.spatial_merge_size, cfg.patch_size
        grids = [[t, h // m, w // m] for t, h, w in GRIDS]
        shape = (sum(t * h * w for t, h, w in grids), m * p, m * p, cfg.num_channels)
    else:  # flattened patches [tokens, C * temporal * patch * patch]
        grids = GRIDS
        channels = getattr(cfg, "in_channels", None) or cfg.num_channels
        shape = (sum(t * h * w for t, h, w in grids), channels * cfg.temporal_patch_size * cfg.patch_size**2)
    pixels = torch.randn(shape, generator=gen).to(device=model.device, dtype=model.dtype)
    return pixels, torch.tensor(grids, device=model.device)


def assert_close(got, ref, tol):
    """Outputs one by one; gradients module by module (a layer's weight and bias as one
    tensor): the gradient of a key projection's bias is a sum that nearly cancels (softmax
    is blind to a shift every key shares), two orders of magnitude under its weight's, so on
    its own its bf16 rounding reads as a large relative error."""
    (outs, grads), (ref_outs, ref_grads) = got, ref
    assert len(outs) == len(ref_outs) and grads.keys() == ref_grads.keys()
    for i, (o, r) in enumerate(zip(outs, ref_outs)):
        assert o.dtype == r.dtype and rel_err(o, r) < tol, f"output {i}: rel err {rel_err(o, r):.2e}"
    modules = {}
    for name, g in grads.items():
        r = ref_grads[name]
        assert (g is None) == (r is None) and (g is None or g.dtype == r.dtype), name
        if g is not None:
            modules.setdefault(name.rpartition(".")[0], []).append((g.flatten(), r.flatten()))
    for module, pairs in modules.items():
        g, r = (torch.cat(t) for t in zip(*pairs))
        assert rel_err(g, r) < tol, f"grads of {module}: rel err {rel_err(g, r):.2e}"


def check_encoder(kernel, integrations, rotary_calls, family, dtype, device, autocast=False):
    eager = build_encoder(family, dtype, device)
    inputs = encoder_inputs(family, eager)
    model = copy.deepcopy(eager)
    with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=autocast):
        ref = run(eager, inputs, Mode.TRAINING)
        model = integrations.kernelize_vision_rotary(model, mode=Mode.TRAINING, device=torch.device(device).type)
        variant = integrations.classify(integrations._PATCHED[family, "apply_rotary_pos_emb_vision"].original)
        assert_kernelized(kernel, model, variant.layer_name)
        got = run(model, inputs, Mode.TRAINING)
    assert_close(got, ref, ENCODER_TOL[torch.bfloat16 if autocast else dtype])
    assert rotary_calls["apply_rotary_pos_emb_vision"] > 0


@pytest.mark.usefixtures("no_tf32")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", list(ENCODERS))
def test_tiny_encoder_trains_as_eager(kernel, integrations, rotary_calls, family, dtype, device):
    """A training step of the family's vision encoder (2 layers, random init), kernelized
    with kernelize_vision_rotary: every output and parameter gradient as eager's."""
    present(family)
    check_encoder(kernel, integrations, rotary_calls, family, dtype, device)


@pytest.mark.usefixtures("no_tf32")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", ["minimax_m3_vl", "qwen2_vl"])
def test_tiny_encoder_under_autocast(kernel, integrations, rotary_calls, family, device):
    """float32 weights under bf16 autocast: MiniMax-M3's rotary gets bf16 q/k and float32
    cos/sin and returns float32 (it computes in its inputs' dtypes), Qwen2-VL's returns bf16;
    the kernelized step returns the same dtypes and matches."""
    present(family)
    check_encoder(kernel, integrations, rotary_calls, family, torch.float32, device, autocast=True)


@pytest.mark.usefixtures("no_tf32")
@pytest.mark.parametrize("device", DEVICES)
def test_a_model_of_several_families(kernel, integrations, rotary_calls, device):
    """One module holding the encoders of families of different variants: each family gets
    its variant's layer, and a training step matches eager's."""
    families = [f for f in ENCODERS if f in FAMILIES]
    variants = {f: integrations.classify(models.modeling_module(f).apply_rotary_pos_emb_vision) for f in families}
    if len(set(variants.values())) < 2:  # the families of the other variants came later
        absent = next(f for f in ENCODERS if f not in FAMILIES)
        pytest.skip(f"transformers {transformers.__version__} has no {absent} (or it defines no vision rotary)")

    class Encoders(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoders = torch.nn.ModuleList(build_encoder(f, torch.float32, device) for f in families)

        def forward(self, *inputs):
            return [enc(*x).last_hidden_state for enc, x in zip(self.encoders, inputs)]

    eager = Encoders()
    inputs = [encoder_inputs(f, enc, seed=i) for i, (f, enc) in enumerate(zip(families, eager.encoders))]
    model = copy.deepcopy(eager)

    def step(m):
        outs = m(*inputs)
        sum(o.float().square().mean() for o in outs).backward()
        return outs, {n: p.grad for n, p in m.named_parameters()}

    ref = step(eager)
    integrations.kernelize_vision_rotary(model, mode=Mode.TRAINING, device=torch.device(device).type)
    assert {f for f, _ in integrations._PATCHED} == set(families)
    for f, encoder in zip(families, model.encoders):
        assert_kernelized(kernel, encoder, variants[f].layer_name)
    assert_close(step(model), ref, ENCODER_TOL[torch.float32])
    assert rotary_calls["apply_rotary_pos_emb_vision"] >= 2 * len(families)  # each encoder's 2 layers


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_variants(kernel, integrations, device, gen):
    """Every variant's layer compiles whole (fullgraph: no graph break), forward and backward,
    and matches the family's own function: Inkling2's pairs, MiniMax-M3's promoted dtypes
    (bf16 q and k, float32 cos and sin) in the call shape of the installed release (COMPILE_BACKEND
    of the device). One layer code serves the three variants: dynamo recompiles it with their
    flags symbolic (launch.py specializes them)."""
    backend = COMPILE_BACKEND[torch.device(device).type]
    families = [f for f in ("inkling2", "minimax_m3_vl", "qwen2_vl") if f in FAMILIES]
    integrations.make_kernelizable(families=families)
    torch._dynamo.reset()
    for family in families:
        M = models.modeling_module(family)
        own, layer = (
            integrations._PATCHED[family, "apply_rotary_pos_emb_vision"].original,
            M.apply_rotary_pos_emb_vision,
        )
        kernelized(integrations, layer, device, Mode.TRAINING | Mode.TORCH_COMPILE)
        compiled = torch.compile(layer, fullgraph=True, backend=backend)
        D = 16
        lead = (S,) if _accepts(own, (S,), D, D) else (1, S)
        R = D - 4 if _accepts(own, lead, D, D - 4) else D
        q, k = (torch.randn(*lead, HEADS, D, generator=gen).to(device, BF16).requires_grad_() for _ in range(2))
        cos, sin = (torch.randn(S, R, generator=gen).to(device).requires_grad_() for _ in range(2))
        outs = compiled(q, k, cos, sin)
        with torch.no_grad():
            assert [o.dtype for o in outs] == [o.dtype for o in own(q, k, cos, sin)], family
        leaves = [t.detach().double().requires_grad_() for t in (q, k, cos, sin)]
        refs = own(*leaves)
        cot = [torch.randn(o.shape, generator=gen).to(device, o.dtype) for o in outs]
        grads = torch.autograd.grad(outs, (q, k, cos, sin), cot)
        ref_grads = torch.autograd.grad(refs, leaves, [c.double() for c in cot])
        for got, ref in (*zip(outs, refs), *zip(grads, ref_grads)):
            assert rel_err(got, ref) <= TOL[got.dtype], f"{family}: rel err {rel_err(got, ref):.2e}"
