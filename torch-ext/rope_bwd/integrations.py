"""Kernelize transformers' rotary functions by kernel name, the vision encoders'
`apply_rotary_pos_emb_vision(q, k, cos, sin)` and the decoders' `apply_rotary_pos_emb(q, k,
cos, sin, unsqueeze_dim=1)`: `make_kernelizable` makes each family's function a kernelizable
layer under the layer name of its variant (found by evaluating the function, `classify`),
through kernels' `use_kernel_forward_from_hub` and `use_kernelized_func`; `kernel_mapping` maps
those names, and transformers' own hook "rotary_pos_emb", to this repository;
`kernelize_rotary` does both and kernelizes a model. Families are found at run time, from
transformers' sources, and a function that is none of the variants is refused, nothing
patched. `kernels` and `transformers` are imported inside the functions: the package itself
needs only torch.
"""

import importlib
import inspect
import os
import warnings
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn

from . import rotary_torch

REPO_ID = "rope-bwd/rope-bwd"
HOOK = "rotary_pos_emb"  # transformers' own layer name for the decoders' Llama-like rotary


class Form(NamedTuple):
    """A transformers rotary function: its name, parameters, and the layers' name stem."""

    name: str
    params: tuple
    stem: str


VISION = Form("apply_rotary_pos_emb_vision", ("q", "k", "cos", "sin"), "ApplyRotaryPosEmbVision")
DECODER = Form("apply_rotary_pos_emb", ("q", "k", "cos", "sin", "unsqueeze_dim"), "ApplyRotaryPosEmb")
FORMS = (VISION, DECODER)


class Variant(NamedTuple):
    """What a family's rotary computes: a rotation over the first cos.shape[-1] channels (the rest
    passed through) and a dtype rule (`classify` tells them), for a function of `form`."""

    form: Form
    interleaved: bool  # pairs (2i, 2i+1) rotated; else the two halves
    promotes: bool  # outputs in the promotion of q's (k's) dtype with cos's and sin's; else q's (k's)

    @property
    def layer_name(self) -> str:
        """The layers.py class of the variant, also its layer name for kernels."""
        return self.form.stem + "Interleaved" * self.interleaved + "Promoted" * self.promotes


# The one classification table: per form, its variants in the order `classify` prefers them.
VARIANTS = tuple(Variant(f, i, p) for f in FORMS for i in (False, True) for p in (False, True))
LAYER_NAMES = tuple(v.layer_name for v in VARIANTS)
LAYER_NAME = VARIANTS[0].layer_name  # the vision variant of most families (halves, dtypes kept)
HOOK_VARIANT = Variant(DECODER, False, True)  # Llama's body: what transformers' hook name stands for
_VARIANTS_TEXT = (
    "rotate_half or rotate_pairwise over the first cos.shape[-1] channels, the rest passed through; "
    "each output in its input's dtype or in its promotion with cos and sin"
)


class _Patch(NamedTuple):
    module: object  # the modeling module
    form: Form
    original: object  # its function (transformers' kernels layer, for a function it marks)
    function: object  # the module global while patched
    classes: dict  # attention class -> its own (__init__, forward) before the patch, None if untouched
    layer_name: str  # the layer name the function had (marked by transformers), or None


_PATCHED: dict = {}  # (family, form name) -> _Patch


def _module_name(family: str) -> str:
    return f"transformers.models.{family}.modeling_{family}"


def _defines(source: bytes, form: Form) -> bool:
    return f"{form.name}(".encode() in source


def find_families(form: Form = None) -> tuple:
    """The families of the installed transformers whose modeling module names a rotary function
    (of `form`, or of any), read from its sources (nothing imported). Candidates: each is
    classified when it is patched."""
    import transformers.models

    paths = tuple(transformers.models.__path__)
    if paths not in _FOUND:
        found = {f: [] for f in FORMS}
        for p in paths:
            for d in sorted(Path(p).iterdir()):
                path = d / f"modeling_{d.name}.py"
                if path.is_file():
                    source = path.read_bytes()
                    for f in FORMS:
                        if _defines(source, f):
                            found[f].append(d.name)
        _FOUND[paths] = {f: tuple(names) for f, names in found.items()}
    if form is not None:
        return _FOUND[paths][form]
    return tuple(sorted(set().union(*_FOUND[paths].values())))


_FOUND: dict = {}  # transformers.models' path -> {form: families}


def _modeling_module(family: str):
    """The modeling module of `family`, imported; a ValueError when it defines no rotary."""
    name = _module_name(family)
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as e:
        if not name.startswith(str(e.name)):
            raise  # a dependency the module needs, not the family
        raise ValueError(
            f"transformers has no family {family!r} ({name} not found); families with a rotary: "
            f"{', '.join(find_families())}"
        ) from None
    if not any(hasattr(module, f.name) for f in FORMS):
        raise ValueError(f"{name} has no {' or '.join(f.name for f in FORMS)}")
    return module


def _calls(cls, form: Form) -> bool:
    code = getattr(inspect.unwrap(getattr(cls, "forward", None)), "__code__", None)
    return code is not None and form.name in code.co_names


def _attention_classes(module, form: Form) -> list:
    """Classes of `module` whose forward calls the module's global rotary function of `form`
    (found from the bytecode's global names, so no class name is hard-coded)."""
    return [
        cls
        for cls in vars(module).values()
        if inspect.isclass(cls)
        and issubclass(cls, nn.Module)
        and cls.__module__ == module.__name__
        and _calls(cls, form)
    ]


def _family_forms(cls):
    """(family, forms) whose rotary instances of `cls` call, or None."""
    parts = cls.__module__.split(".")
    if len(parts) != 4 or parts[:2] != ["transformers", "models"] or parts[3] != f"modeling_{parts[2]}":
        return None
    module = importlib.sys.modules.get(cls.__module__)
    forms = [f for f in FORMS if hasattr(module, f.name) and _calls(cls, f)]
    return (parts[2], forms) if forms else None


def families_in(*models) -> list:
    """The families whose rotary some module of `models` calls, in order of appearance."""
    found = {}
    for model in models:
        for cls in dict.fromkeys(type(m) for m in model.modules()):
            hit = _family_forms(cls)
            if hit is not None:
                found[hit[0]] = None
    return list(found)


# ------------------------------------------------------------------ classification

# The probes: S tokens, HQ/HK heads of D channels; R rotated in the partial case, R/2 odd (as
# MiniMax-M3's 78 of 80) so that no halves/pairs layout coincides with another. float64 probes
# tell the rotation by values and gradients; the mixed dtypes, on which the two dtype rules
# disagree, tell the rule.
_S, _HQ, _HK, _D, _R = 5, 2, 3, 16, 10
_DTYPES = (  # (q, k, cos and sin)
    (torch.float64,) * 3,
    (torch.bfloat16, torch.float32, torch.float32),
    (torch.float32, torch.bfloat16, torch.bfloat16),
    (torch.bfloat16,) * 3,
)
_PROBES = {  # form -> (leading dims of q and k as [..., S, H, D], of the tables, table width, dtypes)
    VISION: (
        *(((_S,), (), _D, d) for d in _DTYPES),
        *(((2, _S), (), _D, d) for d in _DTYPES),
        ((_S,), (), _R, _DTYPES[0]),
    ),
    DECODER: (  # q/k passed as [B, H, S, D], the tables [B, S, R] or shared [1, S, R]
        *(((2, _S), (2,), _D, d) for d in _DTYPES),
        ((2, _S), (1,), _D, _DTYPES[0]),
        ((2, _S), (2,), _R, _DTYPES[0]),
    ),
}
_TOL_FLOAT64 = 1e-4  # most families compute in float32 even on float64 inputs
_TOL_BF16 = 3e-2  # a few bf16 roundings (2^-9 each) of the largest value


def _probe_inputs(gen, lead, table_lead, rot, dtypes):
    def rnd(*shape, dtype):
        return torch.randn(*shape, generator=gen, dtype=torch.float64, device="cpu").to(dtype)

    q, k = rnd(*lead, _HQ, _D, dtype=dtypes[0]), rnd(*lead, _HK, _D, dtype=dtypes[1])
    return q, k, rnd(*table_lead, _S, rot, dtype=dtypes[2]), rnd(*table_lead, _S, rot, dtype=dtypes[2])


def _heads_first(form, x):
    """q or k as a function of `form` takes it, from [..., S, H, D], and back."""
    return x.transpose(-3, -2) if form is DECODER else x


def _max_err(outs, refs) -> float:
    """Largest |out - ref| over the outputs, relative to their largest |ref|; a missing
    output (an unused gradient) counts as zeros."""
    err = max((r.double() if o is None else o.double() - r.double()).abs().max().item() for o, r in zip(outs, refs))
    return err / max(max(r.abs().max().item() for r in refs), 1e-30)


def _call(fn, form, args):
    """fn's outputs as [..., S, H, D], None when it raises (a call its model never makes), or a
    ValueError's text when they are not two tensors shaped like q and k."""
    q, k, cos, sin = args
    q, k = _heads_first(form, q), _heads_first(form, k)
    try:
        outs = fn(q, k, cos, sin)
    except Exception:
        return None
    if not (isinstance(outs, (tuple, list)) and len(outs) == 2 and all(isinstance(o, torch.Tensor) for o in outs)):
        return f"returned {type(outs).__name__}, not (q_embed, k_embed)"
    if tuple(outs[0].shape) != tuple(q.shape) or tuple(outs[1].shape) != tuple(k.shape):
        return f"returned shapes {[tuple(o.shape) for o in outs]}, not those of q and k"
    return [_heads_first(form, o) for o in outs]


def _mismatch(variant, args, outs, cot, grads) -> str:
    """How `outs` (and, on float64 probes, the gradients `grads` of cotangents `cot`) differ
    from the variant's on `args`; "" when they do not. The variant's values come from the
    package's math (rotary_torch) in float64 on the rounded inputs."""
    q, k, cos, _ = args
    want = tuple(torch.promote_types(x.dtype, cos.dtype) if variant.promotes else x.dtype for x in (q, k))
    got = tuple(o.dtype for o in outs)
    if got != want:
        return f"outputs in {got[0]} and {got[1]}, not {want[0]} and {want[1]}"
    exact = q.dtype == torch.float64
    ref_args = [a.detach().double().requires_grad_(exact) for a in args]
    refs = rotary_torch.forward(*ref_args, interleaved=variant.interleaved)
    errs = [_max_err(outs, refs)]
    if exact:
        ref_grads = torch.autograd.grad(refs, ref_args, cot)
        errs += [_max_err([g], [r]) for g, r in zip(grads, ref_grads)]
    err = max(errs)
    return "" if err <= (_TOL_FLOAT64 if exact else _TOL_BF16) else f"relative error {err:.2g} in values or gradients"


def _params(function):
    """The parameter names of a function, or of a kernels layer's forward; None if unknown."""
    try:
        return tuple(inspect.signature(function.forward if isinstance(function, nn.Module) else function).parameters)
    except (TypeError, ValueError):
        return None


def classify(function, name: str = None) -> Variant:
    """The variant that `function` (an `apply_rotary_pos_emb_vision` or `apply_rotary_pos_emb`,
    told by its parameters) computes, from small random probes against the package's math:
    every probe it does not raise on must match the variant, values, gradients of q, k, cos
    and sin (float64) and output dtypes, and it must run at least one full-rotary probe. The
    first variant of `VARIANTS` that matches, so dtypes kept where no probe tells the rule. A
    ValueError saying what differed when none does; `name` names the function there."""
    if function in _CLASSIFIED:
        return _CLASSIFIED[function]
    name = name or getattr(function, "__qualname__", repr(function))
    prefix = f"{name} matches none of the supported rotary variants ({_VARIANTS_TEXT})"
    params = _params(function)
    form = next((f for f in FORMS if f.params == params), None)
    if form is None:
        raise ValueError(f"{prefix}: it takes {params}, not {' or '.join(str(f.params) for f in FORMS)}")
    gen = torch.Generator().manual_seed(0)
    why = {v: "" for v in VARIANTS if v.form is form}  # variant -> the first probe it failed, and how
    ran_full = False
    for lead, table_lead, rot, dtypes in _PROBES[form]:
        args = _probe_inputs(gen, lead, table_lead, rot, dtypes)
        q_shape = list(_heads_first(form, args[0]).shape)
        what = f"q {q_shape} {dtypes[0]}, k {dtypes[1]}, cos/sin {list(args[2].shape)} {dtypes[2]}"
        exact = dtypes[0] == torch.float64
        outs = _call(function, form, [a.requires_grad_(exact) for a in args])
        if isinstance(outs, str) or (exact and outs is not None and not all(o.requires_grad for o in outs)):
            raise ValueError(f"{prefix}: {what}: {outs or 'its outputs carry no gradient'}")
        if outs is None:
            continue
        ran_full |= rot == _D
        cot = grads = None
        if exact:
            cot = [torch.randn(o.shape, generator=gen, dtype=torch.float64) for o in outs]
            grads = torch.autograd.grad(outs, args, cot, allow_unused=True)
        for variant in [v for v, w in why.items() if not w]:
            mismatch = _mismatch(variant, args, outs, cot, grads)
            why[variant] = mismatch and f"{what}: {mismatch}"
    if not ran_full:
        raise ValueError(f"{prefix}: it raised on every probe that rotates all of head_dim")
    variant = next((v for v, w in why.items() if not w), None)
    if variant is None:
        reasons = set(why.values())
        text = reasons.pop() if len(reasons) == 1 else "; ".join(f"as {v.layer_name}, {w}" for v, w in why.items())
        raise ValueError(f"{prefix}: {text}")
    _CLASSIFIED[function] = variant
    return variant


_CLASSIFIED: dict = {}  # function -> Variant


# ------------------------------------------------------------------- patching


def _attach(module, function):
    """Give an attention module built before its class was decorated the per-instance copy of
    `function` that `kernels.use_kernelized_func` gives the modules its decorated constructor
    builds. kernels has no public call for a module that already exists, so this writes the
    attribute that decorator writes (`_kernel_funcs`, keyed by the layer name): the one place
    this package touches kernels' private state."""
    funcs = module.__dict__.setdefault("_kernel_funcs", {})
    funcs.setdefault(type(function).kernel_layer_name, type(function)())


def _plan(family: str) -> list:
    """[(module, form, original, variant, attention classes)] of `family`'s rotary functions,
    classified; nothing patched. A ValueError when one cannot be patched."""
    module = _modeling_module(family)
    plans = []
    for form in FORMS:
        original = getattr(module, form.name, None)
        if original is None or not _attention_classes(module, form):
            continue
        variant = classify(original, f"{module.__name__}.{form.name}")
        plans.append((module, form, original, variant, _attention_classes(module, form)))
    if not plans:
        raise ValueError(f"no class of {module.__name__} calls its rotary function")
    return plans


def _patch(family: str, plan) -> None:
    """Make the family's function a kernelizable layer under its variant's layer name, by kernels'
    decorators: a function transformers marks itself (its hook "rotary_pos_emb") keeps its layer
    class and attention classes, renamed when it is not Llama's variant; any other is decorated,
    and its attention classes with it."""
    import kernels

    module, form, original, variant, classes = plan
    name = HOOK if variant == HOOK_VARIANT else variant.layer_name
    marked = getattr(original, "kernel_layer_name", None)
    if marked is not None:
        kernels.replace_kernel_forward_from_hub(type(original), name)
        function, saved = original, {}
    else:
        function = kernels.use_kernel_forward_from_hub(name)(original)
        function.can_torch_compile = True
        saved = {cls: (cls.__dict__.get("__init__"), cls.__dict__.get("forward")) for cls in classes}
        for cls in classes:
            kernels.use_kernelized_func(function)(cls)
        setattr(module, form.name, function)
    _PATCHED[family, form.name] = _Patch(module, form, original, function, saved, marked)


def make_kernelizable(*models, families=None) -> list:
    """Make transformers' rotary functions of `families` (vision and decoder) kernelizable layers
    under the layer name of their variant (idempotent); returns the families patched.

    families: names (`find_families()` lists them); by default those of `models`, or,
    without models, every family of the installed transformers (those whose function is
    none of the variants are left as they are, with a warning). A named family, or one of
    `models`, that cannot be patched is a ValueError, and then nothing is patched.
    Models built before the call are passed as `models`; models built after it need nothing."""
    if families is None and models:
        families = families_in(*models)
        if not families:
            raise ValueError(f"no module of the models calls a transformers {' or '.join(f.name for f in FORMS)}")
    done = {family for family, _ in _PATCHED}
    if families is None:
        plans, skipped = {}, []
        for family in find_families():
            if family not in done:
                try:
                    plans[family] = _plan(family)
                except (ValueError, ImportError) as e:  # ImportError: a dependency only that family needs
                    skipped.append(f"{family}: {e}")
        if skipped:
            warnings.warn("left as transformers has them:\n" + "\n".join(skipped), stacklevel=2)
    else:
        families = [families] if isinstance(families, str) else list(families)
        plans = {f: _plan(f) for f in dict.fromkeys(families) if f not in done}
    for family, family_plans in plans.items():
        for plan in family_plans:
            _patch(family, plan)
    if families is None:
        families = list(dict.fromkeys(family for family, _ in _PATCHED))
    functions = {cls: p.function for p in _PATCHED.values() for cls in _attention_classes(p.module, p.form)}
    for model in models:
        for sub in model.modules():
            if type(sub) in functions:
                _attach(sub, functions[type(sub)])
    return families


def restore_transformers() -> None:
    """Undo make_kernelizable: original functions, layer names and attention classes back.
    Models built while patched keep their copies of the layer; their forward calls the
    original function again."""
    import kernels

    for patch in _PATCHED.values():
        if patch.layer_name is not None:
            kernels.replace_kernel_forward_from_hub(type(patch.original), patch.layer_name)
        setattr(patch.module, patch.form.name, patch.original)
        for cls, own in patch.classes.items():
            for attr, value in zip(("__init__", "forward"), own):
                if value is None:
                    delattr(cls, attr)
                else:
                    setattr(cls, attr, value)
    _PATCHED.clear()


def kernel_mapping(repo_id: str = REPO_ID, *, version: int = 1, trust_remote_code=True) -> dict:
    """The mapping for `kernels.register_kernel_mapping` / `use_kernel_mapping`: every layer
    name of `LAYER_NAMES`, and transformers' own "rotary_pos_emb" (Llama's variant), from
    `repo_id`, for CUDA and CPU, in every mode (the layers have a backward and compile
    without graph breaks).

    When LOCAL_KERNELS names `repo_id` (a checkout, or hub CI's build), the layers come
    from there through kernels' LocalLayerRepository, as get_kernel's lookup does: a
    LayerRepository would resolve `version` on the Hub first. Otherwise, with
    HF_HUB_OFFLINE=1, kernels resolves `version` from its cache.

    trust_remote_code defaults to True because this code already comes from that
    repository; pass False (or a list) to have kernels check the publisher again."""
    from kernels import LayerRepository, LocalLayerRepository, Mode

    local = _local_kernel_path(repo_id)

    def repo(name):
        if local is not None:
            return LocalLayerRepository(local, layer_name=name)
        return LayerRepository(repo_id, layer_name=name, version=version, trust_remote_code=trust_remote_code)

    modes = [Mode.INFERENCE, Mode.TRAINING, Mode.INFERENCE | Mode.TORCH_COMPILE, Mode.TRAINING | Mode.TORCH_COMPILE]
    names = {name: name for name in LAYER_NAMES} | {HOOK: HOOK_VARIANT.layer_name}
    mapping = {}
    for key, name in names.items():
        layer_repo = repo(name)
        mapping[key] = {device: {mode: layer_repo for mode in modes} for device in ("cuda", "cpu")}
    return mapping


def _local_kernel_path(repo_id: str):
    """Where LOCAL_KERNELS (`repo_id=path:repo_id=path`, kernels' format) points `repo_id`, or
    None. Parsed here: kernels' own parser is private and moved between its releases."""
    entries = (e.split("=", 1) for e in os.environ.get("LOCAL_KERNELS", "").split(":") if "=" in e)
    return {repo: Path(path) for repo, path in entries}.get(repo_id)


def kernelize_rotary(model, *, mode, device=None, repo_id: str = REPO_ID, version: int = 1, **kernelize_kwargs):
    """make_kernelizable for the families found in `model`, vision encoders' and decoders'
    (ValueError if there are none, or one is none of the variants: then nothing is patched),
    then `kernels.kernelize` under `kernel_mapping(repo_id, version=version)` (added to any
    mapping already registered): one call swaps every rotary of a Qwen3-Omni. Returns the
    model, as kernelize does."""
    import kernels

    make_kernelizable(model)
    with kernels.use_kernel_mapping(kernel_mapping(repo_id, version=version)):
        return kernels.kernelize(model, mode=mode, device=device, **kernelize_kwargs)


# The name of the first release of version 1, which served the vision encoders alone.
kernelize_vision_rotary = kernelize_rotary
