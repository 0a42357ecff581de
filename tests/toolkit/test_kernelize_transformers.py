"""Kernelize transformers' vision encoders by kernel name, and parity with transformers.

Random-init vision models built from config objects (no downloads) by the toolkit's models
module, so these live with the toolkit's tests. The eager twin runs first, while
transformers' rotary is untouched (with kernels 0.17 the kernelized layer is the module
global, shared by every model of a family; with 0.19 each model has its own copy); then the
model is kernelized through the user's mapping, kernel_mapping(<repo-id>, version=1), and
outputs and every parameter's gradient are compared. LOCAL_KERNELS names this checkout, so
the mapping's layer comes from build/ through kernels' LocalLayerRepository, with the network
refused (tests/offline.py).
"""

import copy
import functools
import re

import pytest
import torch
from kernels import KernelizeFallback, Mode, kernelize, use_kernel_mapping, use_kernelized_func

from rope_bwd_triton import models
from rope_bwd_triton.build import repo_id

from ..helpers import COMPILE_BACKEND, compiled_calls, generated_code
from ..reference import rel_err

# Tiny shapes (head_dim 16) for CPU; two images, so the attention's per-image split runs.
TINY = dict(hidden_size=32, num_heads=2, intermediate_size=64, depth=2, patch_size=4, out_hidden_size=48)
TINY_EXTRA = {
    "qwen3_omni_moe": dict(num_position_embeddings=16, deepstack_visual_indexes=[0]),
    "qwen2_5_vl": dict(window_size=16, fullatt_block_indexes=[1]),
    "qwen3_vl": dict(num_position_embeddings=16, deepstack_visual_indexes=[0]),
}
FAMILIES = tuple(TINY_EXTRA)  # the Qwen encoders (the other families: test_families.py)
TINY_GRIDS = [[1, 4, 8], [1, 4, 4]]
# Real widths: Qwen3-Omni 16 heads of 72, Qwen2.5-VL 16 heads of 80.
REAL = {
    "qwen3_omni_moe": dict(hidden_size=1152, num_heads=16, intermediate_size=4304, depth=2),
    "qwen2_5_vl": dict(hidden_size=1280, num_heads=16, intermediate_size=3420, depth=2, fullatt_block_indexes=[1]),
}
REAL_GRIDS = [[1, 32, 32], [1, 16, 32]]
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}  # bf16: a few roundings of 2^-8 through the net
ALL_MODES = [Mode.INFERENCE, Mode.TRAINING, Mode.TRAINING | Mode.TORCH_COMPILE]


def build(family, size, dtype, device, **config):
    config = (TINY | TINY_EXTRA[family] if size == "tiny" else REAL[family]) | config
    model = models.make_vision_model(family, dtype=dtype, device=device, **config)
    return model, models.make_images(model, TINY_GRIDS if size == "tiny" else REAL_GRIDS)


def run(model, inputs, mode):
    """Outputs, and the gradient of every parameter (None where it gets none)."""
    if Mode.TRAINING not in mode:
        with torch.no_grad():
            return list(models.output_tensors(model(*inputs))), {}
    out, loss = models.step(model, *inputs)
    loss.backward()
    return list(models.output_tensors(out)), {n: p.grad for n, p in model.named_parameters()}


def assert_close(got, ref, tol):
    (outs, grads), (ref_outs, ref_grads) = got, ref
    assert len(outs) == len(ref_outs) and grads.keys() == ref_grads.keys()
    for i, (o, r) in enumerate(zip(outs, ref_outs)):
        assert o.dtype == r.dtype and rel_err(o, r) < tol, f"output {i}: rel err {rel_err(o, r):.2e}"
    for name, g in grads.items():
        r = ref_grads[name]
        assert (g is None) == (r is None), name
        assert g is None or rel_err(g, r) < tol, f"grad of {name}: rel err {rel_err(g, r):.2e}"


def attached_layers(kernel, model) -> list:
    """The package's layer (its name) that each kernels function attached to a module of `model`
    runs (use_kernelized_func's `_kernel_funcs`), None for one still transformers'."""
    names = {getattr(kernel.layers, n).forward: n for n in kernel.integrations.LAYER_NAMES}
    funcs = [f for m in model.modules() for f in m.__dict__.get("_kernel_funcs", {}).values()]
    return [names.get(getattr(f.forward, "__func__", None)) for f in funcs]


def assert_kernelized(kernel, model, *layer_names):
    """Every rotary attached to `model` runs one of the package's layers `layer_names`, each of
    them at least one (ApplyRotaryPosEmbVision by default)."""
    got = attached_layers(kernel, model)
    assert got and set(got) == set(layer_names or ["ApplyRotaryPosEmbVision"]), got
    assert kernel.integrations.kernelized_layers(model) == got  # the package's own view says the same


@pytest.fixture
def parity(kernel, integrations, rotary_calls):
    """check_parity on the test's fixtures."""
    return functools.partial(check_parity, kernel, integrations, rotary_calls)


def check_parity(kernel, integrations, rotary_calls, family, *, size, dtype, device, mode, built, **config):
    eager, inputs = build(family, size, dtype, device, **config)
    model = copy.deepcopy(eager)
    ref = run(eager, inputs, mode)
    if built == "before":
        integrations.make_kernelizable(model)
    else:
        integrations.make_kernelizable()
        model, _ = build(family, size, dtype, device)
    # Raise on any failure of ours; layers of transformers' own that this mapping does not name
    # (GeluTanh, with kernels >= 0.19) keep their forward.
    with use_kernel_mapping(integrations.kernel_mapping(repo_id(), version=1)):
        model = kernelize(model, mode=mode, device=torch.device(device).type, use_fallback=KernelizeFallback.NO_LAYER)
    assert_kernelized(kernel, model)
    if Mode.TORCH_COMPILE in mode:
        torch._dynamo.reset()
        # in place: parameter names stay those of the eager twin
        model.compile(backend=COMPILE_BACKEND[torch.device(device).type])
    tol = TOL[dtype] * (10 if Mode.TORCH_COMPILE in mode else 1)  # inductor reorders the fp32 sums
    assert_close(run(model, inputs, mode), ref, tol)
    # the layer ran (under torch.compile, traced into the graph)
    assert rotary_calls["apply_rotary_pos_emb_vision"] > 0


@pytest.mark.parametrize("built", ["before", "after"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", FAMILIES)
def test_training_parity(parity, family, dtype, built):
    parity(family, size="tiny", dtype=dtype, device="cpu", mode=Mode.TRAINING, built=built)


@pytest.mark.parametrize("family", ["qwen3_omni_moe", "qwen2_5_vl"])
def test_inference_parity(parity, family):
    parity(family, size="tiny", dtype=torch.bfloat16, device="cpu", mode=Mode.INFERENCE, built="after")


def test_compile_training_parity(parity):
    mode = Mode.TRAINING | Mode.TORCH_COMPILE
    # one block: inductor's time on the CPU grows with the blocks it traces, each the same
    parity("qwen3_omni_moe", size="tiny", dtype=torch.float32, device="cpu", mode=mode, built="before", depth=1)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ALL_MODES, ids=["inference", "training", "training_compile"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", list(REAL))
def test_real_width_parity_cuda(parity, family, dtype, mode, no_tf32):
    parity(family, size="real", dtype=dtype, device="cuda", mode=mode, built="before")


@pytest.mark.gpu
def test_compiled_varying_image_sizes_cuda(kernel, integrations, no_tf32):
    """Training a compiled, kernelized Qwen3-Omni encoder on images of two sizes: dynamo compiles
    the second with S dynamic, and inductor still launches rotary_kernel itself (none of our ops
    in its code); outputs and every gradient match eager at both sizes."""
    family, dtype, mode = "qwen3_omni_moe", torch.float32, Mode.TRAINING | Mode.TORCH_COMPILE
    eager, _ = build(family, "real", dtype, "cuda")
    images = [models.make_images(eager, [grid]) for grid in REAL_GRIDS]
    refs = []
    for inputs in images:  # before kernelize: the rotary is shared; gradients set to None first
        eager.zero_grad(set_to_none=True)
        refs.append(run(eager, inputs, mode))
    model = copy.deepcopy(eager)
    integrations.make_kernelizable(model)
    with use_kernel_mapping(integrations.kernel_mapping(repo_id(), version=1)):
        model = kernelize(model, mode=mode, device="cuda", use_fallback=KernelizeFallback.NO_LAYER)
    torch._dynamo.reset()
    model.compile()
    for i, (inputs, ref) in enumerate(zip(images, refs)):
        model.zero_grad(set_to_none=True)
        with generated_code() as code:
            got = run(model, inputs, mode)
        assert_close(got, ref, TOL[dtype] * 10)
        assert compiled_calls(kernel, "\n".join(code)) == {"kernel"}, f"image {i}"
        if i:  # recompiled, with a symbol for S in the graphs that launch the kernel
            assert any(re.search(r"\bs\d+\b", c) for c in code if "rotary_kernel" in c)


def test_convenience_call(kernel, integrations, rotary_calls):
    """kernelize_vision_rotary with its defaults (the published repo-id, version 1) from a
    checkout: LOCAL_KERNELS set, the network refused (it used to resolve the version on the Hub)."""
    assert integrations.REPO_ID == repo_id()
    eager, inputs = build("qwen2_5_vl", "tiny", torch.float32, "cpu")
    ref = run(eager, inputs, Mode.TRAINING)
    model = integrations.kernelize_vision_rotary(copy.deepcopy(eager), mode=Mode.TRAINING, device="cpu")
    assert_kernelized(kernel, model)
    # only the model's own family is touched: its two functions (its text attention names
    # apply_rotary_pos_emb, although it calls apply_multimodal_rotary_pos_emb)
    assert set(integrations._PATCHED) == {("qwen2_5_vl", name) for name in integrations.NAMES}
    assert_close(run(model, inputs, Mode.TRAINING), ref, TOL[torch.float32])
    assert rotary_calls["apply_rotary_pos_emb_vision"] > 0
    with pytest.raises(ValueError, match="no module of the models calls"):
        integrations.kernelize_vision_rotary(torch.nn.Linear(2, 2), mode=Mode.TRAINING, device="cpu")


def attached(model, cls, layer_name):
    """The kernels layers attached to the modules of `model` of class `cls` under `layer_name`."""
    attns = [m for m in model.modules() if isinstance(m, cls)]
    assert attns, cls
    return [a.__dict__.get("_kernel_funcs", {}).get(layer_name) for a in attns]


def decorator_attaches(function):
    """What kernels' use_kernelized_func attaches to a module its decorated class builds, in the
    installed kernels: the module global itself (kernels 0.17) or a copy of its own (0.19)."""
    probe = use_kernelized_func(function)(type("Probe", (torch.nn.Module,), {}))()
    (attached,) = probe._kernel_funcs.values()
    return "global" if attached is function else "copy"


def test_make_kernelizable_is_idempotent_and_undone(kernel, integrations):
    """Twice is once (same layer, constructor wrapped once); every attention module, built before
    or after or deep-copied, holds the layer as kernels' decorator gives it (the global, or a copy
    of the same class); restore_transformers puts function and class back."""
    M = models.modeling_module("qwen3_omni_moe")
    cls, name = M.Qwen3OmniMoeVisionAttention, integrations.LAYER_NAME
    original, init = M.apply_rotary_pos_emb_vision, cls.__init__
    before, _ = build("qwen3_omni_moe", "tiny", torch.float32, "cpu")
    integrations.make_kernelizable(before)
    layer = M.apply_rotary_pos_emb_vision
    assert layer.kernel_layer_name == name and layer.forward.__self__ is layer
    wrapped_init = cls.__init__
    integrations.make_kernelizable(before)
    assert M.apply_rotary_pos_emb_vision is layer and cls.__init__ is wrapped_init
    after, _ = build("qwen3_omni_moe", "tiny", torch.float32, "cpu")
    shared = decorator_attaches(layer) == "global"
    for model in (before, after):
        assert all(type(f) is type(layer) and (f is layer) == shared for f in attached(model, cls, name))
    copied = attached(copy.deepcopy(after), cls, name)  # a deep copy: copies of its own, of the class
    assert all(type(f) is type(layer) and f is not layer for f in copied)
    integrations.restore_transformers()
    assert M.apply_rotary_pos_emb_vision is original and cls.__init__ is init
    assert not hasattr(build("qwen3_omni_moe", "tiny", torch.float32, "cpu")[0].blocks[0].attn, "_kernel_funcs")


def test_attention_classes_found(kernel):
    """The classes whose forward calls each rotary function, vision and decoder, from their code."""
    integrations = kernel.integrations
    names = {
        (f, name): [c.__name__ for c in integrations._attention_classes(models.modeling_module(f), name)]
        for f in FAMILIES
        for name in integrations.NAMES
    }
    assert names == {
        ("qwen3_omni_moe", "apply_rotary_pos_emb_vision"): ["Qwen3OmniMoeVisionAttention"],
        ("qwen3_omni_moe", "apply_rotary_pos_emb"): [
            "Qwen3OmniMoeThinkerTextAttention",
            "Qwen3OmniMoeTalkerCodePredictorAttention",
            "Qwen3OmniMoeCode2WavAttention",
        ],
        ("qwen2_5_vl", "apply_rotary_pos_emb_vision"): ["Qwen2_5_VLVisionAttention"],
        ("qwen2_5_vl", "apply_rotary_pos_emb"): ["Qwen2_5_VLAttention"],
        ("qwen3_vl", "apply_rotary_pos_emb_vision"): ["Qwen3VLVisionAttention"],
        ("qwen3_vl", "apply_rotary_pos_emb"): ["Qwen3VLTextAttention"],
    }
