"""No route gives a model a rotary that is not its own.

kernels maps layer names, never families, and transformers marks functions of several variants
with one name (GPT-OSS's, whose table holds one value per pair, carries Llama's "rotary_pos_emb").
So whatever the route that maps a name to the package (kernelize_rotary; kernel_config for other
families or for all; the package's mapping registered for kernels.kernelize; a transformers
KernelConfig written by hand), the package's layer asks which variant the function it replaces
computes and runs that variant, or transformers' function with one warning. Tiny models of the
families that need it are loaded with from_pretrained through each route and compared with
transformers' own (logits and every gradient); every function transformers marks with the hook
is kernelized under each of the package's layers and compared with itself.
"""

import warnings

import pytest
import torch
from kernels import Mode

from rope_bwd_triton import models

from ..reference import rel_err

TOL = 1e-5  # float32 results of two correct rotaries through a tiny model
ROUTES = ("kernelize_rotary", "kernel_config(other families)", "kernel_config()", "kernel_mapping + kernelize")
# family -> (make a tiny model, the keyword inputs of one step)
TINY = {
    "gpt_oss": (lambda: models.make_decoder_model("gpt_oss"), lambda m: {"input_ids": models.make_tokens(m, 2, 9)}),
    "deepseek_v4": (
        lambda: models.make_decoder_model("deepseek_v4"),
        lambda m: {"input_ids": models.make_tokens(m, 2, 9)},
    ),
    "dinov3_vit": (models.make_dinov3, lambda m: {"pixel_values": torch.randn(2, 3, 32, 32, generator=_gen())}),
    "llama": (lambda: models.make_decoder_model("llama"), lambda m: {"input_ids": models.make_tokens(m, 2, 9)}),
}


def _gen():
    return torch.Generator().manual_seed(1)


def _loss(model, inputs):
    out = model(**inputs)
    return (out.logits if hasattr(out, "logits") else out.last_hidden_state).float()


def _run(model, inputs):
    """The output and every parameter's gradient of one step (a fixed random cotangent; DINOv3's
    training-time position augmentations drawn alike)."""
    torch.manual_seed(0)
    out = _loss(model, inputs)
    cot = torch.randn(out.shape, generator=_gen())
    out.backward(cot)
    return out.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def _load(kernel, folder, cls, route):
    import kernels

    rope = kernel
    if route == "kernelize_rotary":
        return rope.kernelize_rotary(cls.from_pretrained(folder), mode=Mode.TRAINING)
    if route == "kernel_config(other families)":
        return cls.from_pretrained(folder, kernel_config=rope.kernel_config("qwen3"))
    if route == "kernel_config()":
        return cls.from_pretrained(folder, kernel_config=rope.kernel_config())
    model = cls.from_pretrained(folder, use_kernels=False)
    with kernels.use_kernel_mapping(rope.kernel_mapping()):
        return kernels.kernelize(model, mode=Mode.TRAINING, device="cpu")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """family -> a tiny model of it saved (its folder, class, inputs) and transformers' own step
    of it loaded (output, gradients): made once per worker, for every route."""
    made = {}

    def of(family):
        if family not in made:
            make, inputs_of = TINY[family]
            model, folder = make().train(), tmp_path_factory.mktemp(family)
            model.save_pretrained(folder)
            cls, inputs = type(model), inputs_of(model)
            made[family] = folder, cls, inputs, _run(cls.from_pretrained(folder, use_kernels=False).train(), inputs)
        return made[family]

    return of


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("family", TINY)
def test_every_route_serves_the_models_own_rotary(kernel, integrations, rotary_calls, hub_twins, saved, family, route):
    """A tiny model saved and loaded through the route: logits and every gradient equal
    transformers' own; where the route maps the model's rotary to the package, its calls ran
    (GPT-OSS's through its own variant, whatever name mapped it), and nothing warned. The other
    hub kernels transformers maps (5.24: GPT-OSS's experts on the CPU) come from their offline
    twins."""
    folder, cls, inputs, (want, want_grads) = saved(family)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="rope-bwd")
        loaded = _load(kernel, folder, cls, route).train()
        got, grads = _run(loaded, inputs)
    assert rel_err(got, want) <= TOL and grads.keys() == want_grads.keys()
    assert all(rel_err(grads[n], want_grads[n]) <= TOL for n in want_grads), family
    # DINOv3's and DeepSeek-V4's functions carry no hook name: only the routes that patch them reach them
    mapped = family not in ("dinov3_vit", "deepseek_v4") or route in ("kernelize_rotary", "kernel_config()")
    assert (sum(rotary_calls.values()) > 0) == mapped, dict(rotary_calls)


def _hooked_functions():
    """(family, transformers' own function) of every modeling module that marks its rotary
    with transformers' hook name "rotary_pos_emb"."""
    from transformers import models as tm

    from rope_bwd_triton.models import modeling_module

    found = []
    for family in sorted(p.name for p in __import__("pathlib").Path(tm.__path__[0]).iterdir()):
        path = __import__("pathlib").Path(tm.__path__[0]) / family / f"modeling_{family}.py"
        if path.is_file() and b'use_kernel_forward_from_hub("rotary_pos_emb")' in path.read_bytes():
            found.append((family, modeling_module(family).apply_rotary_pos_emb))
    return found


def test_every_hooked_function_under_every_layer(kernel):
    """Each function transformers marks "rotary_pos_emb", kernelized under each of the package's
    decoder layers as kernels does it (a module of a class decorated by use_kernelized_func,
    kernelize with a mapping of the hook name to that layer): its results and gradients are the
    function's own; a function that is none of the variants runs itself, with one warning that
    names it."""
    import kernels

    functions = _hooked_functions()
    assert len(functions) > 100 and "gpt_oss" in dict(functions)
    names = [v.layer_name for v in kernel.layers.VARIANTS if v.form == "decoder"]
    gen = torch.Generator().manual_seed(0)
    unsupported = []
    for family, own in functions:
        raw = kernel.internals.kernels_function(type(own))
        q, k = torch.randn(2, 4, 5, 16, generator=gen), torch.randn(2, 2, 5, 16, generator=gen)
        for width in (16, 8):  # a table per channel, or per pair (GPT-OSS)
            cos, sin = torch.randn(2, 2, 5, width, generator=gen).unbind(0)
            try:
                want = raw(q, k, cos, sin)
                break
            except RuntimeError:
                continue
        for name in names:
            holder = kernels.use_kernelized_func(own)(type("Holder", (torch.nn.Module,), {"forward": _calls(own)}))()
            mapping = {"rotary_pos_emb": {"cpu": {Mode.TRAINING: _local_repo(kernel, name)}}}
            with kernels.use_kernel_mapping(mapping, inherit_mapping=False):
                holder = kernels.kernelize(holder, mode=Mode.TRAINING, device="cpu")
            leaves = [t.clone().requires_grad_() for t in (q, k, cos, sin)]
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                got = holder(*leaves)
                holder(*leaves)
            mine = [w for w in caught if "rope-bwd" in str(w.message)]
            assert len(mine) <= 1 and all(family in str(w.message) for w in mine), (family, name)
            if mine:
                unsupported.append(family)
            for g, w in zip(got, want):
                assert rel_err(g, w) <= TOL, (family, name)
            cot = [torch.randn(g.shape, generator=gen) for g in got]
            ref_leaves = [t.clone().requires_grad_() for t in (q, k, cos, sin)]
            ref = torch.autograd.grad(raw(*ref_leaves), ref_leaves, cot, allow_unused=True)
            for g, r in zip(torch.autograd.grad(got, leaves, cot, allow_unused=True), ref):
                assert (g is None) == (r is None) and (g is None or rel_err(g, r) <= TOL), (family, name)
    # a function none of the variants computes warns once per function, not once per layer or call
    assert all(unsupported.count(f) == 1 for f in unsupported), unsupported


def _calls(function):
    def forward(self, *args):
        return function(*args)

    return forward


def _local_repo(kernel, name):
    return next(iter(kernel.kernel_mapping()[name]["cpu"].values()))


def test_check_rotaries_names_what_runs(kernel, integrations, recwarn):
    """check_rotaries on a model, before any route: each rotary function it calls, with the
    package's layer for its variant (GPT-OSS's table of one value per pair under Llama's hook
    name; DINOv3's prefix), without a warning; its answer is what the layers then run."""
    gpt = models.make_decoder_model("gpt_oss")
    assert kernel.check_rotaries(gpt) == {"gpt_oss.apply_rotary_pos_emb": "ApplyRotaryPosEmbPairTablePromoted"}
    assert kernel.check_rotaries(models.make_dinov3()) == {
        "dinov3_vit.apply_rotary_pos_emb": "ApplyRotaryPosEmbPrefixPromoted"
    }
    assert not [w for w in recwarn if "rope-bwd" in str(w.message)]
    own = models.modeling_module("gpt_oss").apply_rotary_pos_emb
    assert kernel.layers.serving(own) == kernel.layers.VARIANTS[-4]
