"""Kernelize transformers' vision rotary `apply_rotary_pos_emb_vision(q, k, cos, sin)` by
kernel name: `make_kernelizable` makes each family's function a kernelizable layer under the
layer name of its variant (found by evaluating the function, `classify`), `kernel_mapping`
maps those names to this repository, `kernelize_vision_rotary` does both and kernelizes a
model. Families are found at run time, from transformers' sources, and a function that is none
of the variants is refused, nothing patched. The layer is a patch of the process: a model
pickles without it. `kernels` and `transformers` are imported inside the functions: the
package itself needs only torch.
"""

import copy
import functools
import importlib
import inspect
import os
import pkgutil
import sys
import warnings
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn

from . import rotary_torch

LAYER_NAME = "ApplyRotaryPosEmbVision"  # the variant of most families (halves, dtypes kept)
REPO_ID = "rope-bwd/rope-bwd"
_FUNC_NAME = "apply_rotary_pos_emb_vision"
_SIGNATURE = ("q", "k", "cos", "sin")


class Variant(NamedTuple):
    """What a family's rotary computes: a rotation over the first cos.shape[-1] channels (the rest
    passed through) and a dtype rule (`classify` tells them)."""

    interleaved: bool  # pairs (2i, 2i+1) rotated; else the two halves
    promotes: bool  # outputs in the promotion of q's (k's) dtype with cos's and sin's; else q's (k's)

    @property
    def layer_name(self) -> str:
        return LAYER_NAME + "Interleaved" * self.interleaved + "Promoted" * self.promotes


VARIANT_LAYERS = {v: v.layer_name for v in (Variant(i, p) for i in (False, True) for p in (False, True))}
LAYER_NAMES = tuple(VARIANT_LAYERS.values())
_VARIANTS_TEXT = (
    "rotate_half or rotate_pairwise over the first cos.shape[-1] channels, the rest passed through; "
    "each output in its input's dtype or in its promotion with cos and sin"
)


class _Patch(NamedTuple):
    module: object  # the modeling module
    original: object  # its apply_rotary_pos_emb_vision
    layer: nn.Module  # the module global while patched
    inits: dict  # attention class -> its own __init__ before the patch, or None


_PATCHED: dict = {}  # family -> _Patch


def _module_name(family: str) -> str:
    return f"transformers.models.{family}.modeling_{family}"


def find_families() -> tuple:
    """The families of the installed transformers whose modeling module names
    `apply_rotary_pos_emb_vision`, read from its sources (nothing imported). Candidates:
    each is classified when it is patched."""
    import transformers.models

    paths = tuple(transformers.models.__path__)
    if paths not in _FOUND:
        needle = _FUNC_NAME.encode()
        _FOUND[paths] = tuple(
            sorted(
                d.name
                for p in paths
                for d in Path(p).iterdir()
                if (d / f"modeling_{d.name}.py").is_file() and needle in (d / f"modeling_{d.name}.py").read_bytes()
            )
        )
    return _FOUND[paths]


_FOUND: dict = {}  # transformers.models' path -> find_families()


def _modeling_module(family: str):
    """The modeling module of `family`, imported; a ValueError when it defines no rotary."""
    name = _module_name(family)
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as e:
        if not name.startswith(str(e.name)):
            raise  # a dependency the module needs, not the family
        raise ValueError(
            f"transformers has no family {family!r} ({name} not found); families with a vision rotary: "
            f"{', '.join(find_families())}"
        ) from None
    if not hasattr(module, _FUNC_NAME):
        raise ValueError(f"{name} has no {_FUNC_NAME}")
    return module


def _calls_rotary(cls) -> bool:
    code = getattr(inspect.unwrap(getattr(cls, "forward", None)), "__code__", None)
    return code is not None and _FUNC_NAME in code.co_names


def _attention_classes(module) -> list:
    """Classes of `module` whose forward calls the module's global rotary function
    (found from the bytecode's global names, so no class name is hard-coded)."""
    return [
        cls
        for cls in vars(module).values()
        if inspect.isclass(cls)
        and issubclass(cls, nn.Module)
        and cls.__module__ == module.__name__
        and _calls_rotary(cls)
    ]


def _family_of(cls):
    """The family whose rotary instances of `cls` call, or None."""
    parts = cls.__module__.split(".")
    if len(parts) != 4 or parts[:2] != ["transformers", "models"] or parts[3] != f"modeling_{parts[2]}":
        return None
    module = sys.modules.get(cls.__module__)
    return parts[2] if hasattr(module, _FUNC_NAME) and _calls_rotary(cls) else None


def families_in(*models) -> list:
    """The families whose vision rotary some module of `models` calls, in order of appearance."""
    found = {}
    for model in models:
        for cls in dict.fromkeys(type(m) for m in model.modules()):
            family = _family_of(cls)
            if family is not None:
                found[family] = None
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
_PROBES = (  # (leading dims of q and k, table width, dtypes)
    *(((_S,), _D, d) for d in _DTYPES),
    *(((2, _S), _D, d) for d in _DTYPES),
    ((_S,), _R, _DTYPES[0]),
)
_TOL_FLOAT64 = 1e-4  # most families compute in float32 even on float64 inputs
_TOL_BF16 = 3e-2  # a few bf16 roundings (2^-9 each) of the largest value


def _probe_inputs(gen, lead, rot, dtypes):
    def rnd(*shape, dtype):
        return torch.randn(*shape, generator=gen, dtype=torch.float64, device="cpu").to(dtype)

    q, k = rnd(*lead, _HQ, _D, dtype=dtypes[0]), rnd(*lead, _HK, _D, dtype=dtypes[1])
    return q, k, rnd(_S, rot, dtype=dtypes[2]), rnd(_S, rot, dtype=dtypes[2])


def _max_err(outs, refs) -> float:
    """Largest |out - ref| over the outputs, relative to their largest |ref|; a missing
    output (an unused gradient) counts as zeros."""
    err = max((r.double() if o is None else o.double() - r.double()).abs().max().item() for o, r in zip(outs, refs))
    return err / max(max(r.abs().max().item() for r in refs), 1e-30)


def _call(fn, args):
    """fn's outputs, None when it raises (a call its model never makes), or a ValueError's
    text when they are not two tensors shaped like q and k."""
    try:
        outs = fn(*args)
    except Exception:
        return None
    if not (isinstance(outs, (tuple, list)) and len(outs) == 2 and all(isinstance(o, torch.Tensor) for o in outs)):
        return f"returned {type(outs).__name__}, not (q_embed, k_embed)"
    if tuple(outs[0].shape) != tuple(args[0].shape) or tuple(outs[1].shape) != tuple(args[1].shape):
        return f"returned shapes {[tuple(o.shape) for o in outs]}, not those of q and k"
    return outs


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


def classify(function, name: str = None) -> Variant:
    """The variant that `function` (an `apply_rotary_pos_emb_vision`) computes, from small
    random probes against the package's math: every probe it does not raise on must match
    the variant, values, gradients of q, k, cos and sin (float64) and output dtypes, and it
    must run at least one full-rotary probe. The first variant of `VARIANT_LAYERS` that
    matches, so dtypes kept where no probe tells the rule. A ValueError saying what differed
    when none does; `name` names the function there."""
    if function in _CLASSIFIED:
        return _CLASSIFIED[function]
    name = name or getattr(function, "__qualname__", repr(function))
    prefix = f"{name} matches none of the supported rotary variants ({_VARIANTS_TEXT})"
    try:
        params = tuple(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        params = None
    if params != _SIGNATURE:
        raise ValueError(f"{prefix}: it takes {params}, not {_SIGNATURE}")
    gen = torch.Generator().manual_seed(0)
    why = dict.fromkeys(VARIANT_LAYERS, "")  # variant -> the first probe it failed, and how
    ran_full = False
    for lead, rot, dtypes in _PROBES:
        args = _probe_inputs(gen, lead, rot, dtypes)
        what = f"q {list(args[0].shape)} {dtypes[0]}, k {dtypes[1]}, cos/sin {list(args[2].shape)} {dtypes[2]}"
        exact = dtypes[0] == torch.float64
        outs = _call(function, [a.requires_grad_(exact) for a in args])
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


# ------------------------------------------------------------------- the layers


class _TransformersRotary(nn.Module):
    """transformers' `apply_rotary_pos_emb_vision` of one family as a kernelizable layer,
    through the subclass of its variant (kernels reads the layer name from the class).
    One instance per family, the module global: pickled, it is that global by name (on
    loading, transformers' function, or this process's layer while patched); deep-copied,
    itself (what a copied model's attention calls)."""

    def __init__(self, module_name: str, function):
        super().__init__()
        self.module_name, self.function = module_name, function

    def forward(self, q, k, cos, sin):
        return self.function(q, k, cos, sin)

    def __reduce__(self):
        return pkgutil.resolve_name, (f"{self.module_name}:{_FUNC_NAME}",)

    def __deepcopy__(self, memo):
        return self


# One class per variant: kernels keys layers by the class attribute kernel_layer_name.
_ROTARY_CLASSES = {
    v: type(f"_Transformers{name}", (_TransformersRotary,), {"__module__": __name__})
    for v, name in VARIANT_LAYERS.items()
}


class _KernelFuncs(dict):
    """The `_kernel_funcs` of an attention module, holding our layer: pickled, a plain dict
    without it (a loaded model needs neither this package nor the patch, and kernelize
    finds no stale layer there); copied, with it."""

    def __reduce__(self):
        return dict, ([(k, v) for k, v in self.items() if not isinstance(v, _TransformersRotary)],)

    def __copy__(self):
        return _KernelFuncs(self)

    def __deepcopy__(self, memo):
        return _KernelFuncs({k: copy.deepcopy(v, memo) for k, v in self.items()})


def _attach(module, layer):
    """Put `layer` in module._kernel_funcs, where kernelize looks (kernels.use_kernelized_func's
    key, the layer name)."""
    funcs = module.__dict__.get("_kernel_funcs")
    if not isinstance(funcs, _KernelFuncs):
        funcs = module.__dict__["_kernel_funcs"] = _KernelFuncs(funcs or {})
    funcs[type(layer).kernel_layer_name] = layer


def _attach_on_init(cls, layer):
    """Attach `layer` to every instance of `cls` built from now on."""
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        _attach(self, layer)

    cls.__init__ = __init__


def _plan(family: str):
    """(module, original, variant, attention classes) of `family`, checked; nothing patched.
    A ValueError when it cannot be."""
    module = _modeling_module(family)
    original = getattr(module, _FUNC_NAME)
    variant = classify(original, f"{module.__name__}.{_FUNC_NAME}")
    classes = _attention_classes(module)
    if not classes:
        raise ValueError(f"no class of {module.__name__} calls {_FUNC_NAME}")
    return module, original, variant, classes


def _patch(family: str, plan) -> _Patch:
    import kernels

    module, original, variant, classes = plan
    rotary_cls = _ROTARY_CLASSES[variant]
    kernels.replace_kernel_forward_from_hub(rotary_cls, variant.layer_name)
    layer = rotary_cls(module.__name__, original)
    inits = {cls: cls.__dict__.get("__init__") for cls in classes}
    for cls in classes:
        _attach_on_init(cls, layer)
    setattr(module, _FUNC_NAME, layer)
    _PATCHED[family] = _Patch(module, original, layer, inits)
    return _PATCHED[family]


def make_kernelizable(*models, families=None) -> list:
    """Make transformers' `apply_rotary_pos_emb_vision` of `families` a kernelizable layer
    under the layer name of its variant (idempotent); returns the families patched.

    families: names (`find_families()` lists them); by default those of `models`, or,
    without models, every family of the installed transformers (those whose function is
    none of the variants are left as they are, with a warning). A named family, or one of
    `models`, that cannot be patched is a ValueError, and then nothing is patched.
    Models built before the call are passed as `models`; models built after it need nothing."""
    if families is None and models:
        families = families_in(*models)
        if not families:
            raise ValueError(f"no module of the models calls a transformers {_FUNC_NAME}")
    if families is None:
        plans, skipped = {}, []
        for family in find_families():
            if family not in _PATCHED:
                try:
                    plans[family] = _plan(family)
                except (ValueError, ImportError) as e:  # ImportError: a dependency only that family needs
                    skipped.append(f"{family}: {e}")
        if skipped:
            warnings.warn("left as transformers has them:\n" + "\n".join(skipped), stacklevel=2)
    else:
        families = [families] if isinstance(families, str) else list(families)
        plans = {f: _plan(f) for f in dict.fromkeys(families) if f not in _PATCHED}
    for family, plan in plans.items():
        _patch(family, plan)
    if families is None:
        families = [f for f in find_families() if f in _PATCHED]
    attached = {cls: p.layer for p in _PATCHED.values() for cls in p.inits}
    for model in models:
        for sub in model.modules():
            layer = attached.get(type(sub))
            if layer is not None:
                _attach(sub, layer)
    return families


def restore_transformers() -> None:
    """Undo make_kernelizable: original functions and attention constructors back.
    Models built while patched keep the layer in their `_kernel_funcs` (not pickled);
    their forward calls the original function again."""
    for patch in _PATCHED.values():
        setattr(patch.module, _FUNC_NAME, patch.original)
        for cls, init in patch.inits.items():
            if init is None:
                delattr(cls, "__init__")
            else:
                cls.__init__ = init
    _PATCHED.clear()


def kernel_mapping(repo_id: str = REPO_ID, *, version: int = 1, trust_remote_code=True) -> dict:
    """The mapping for `kernels.register_kernel_mapping` / `use_kernel_mapping`: every
    layer name of `LAYER_NAMES` from `repo_id`, for CUDA and CPU, in every mode (the
    layers have a backward and compile without graph breaks).

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
    mapping = {}
    for name in LAYER_NAMES:
        layer_repo = repo(name)
        mapping[name] = {device: {mode: layer_repo for mode in modes} for device in ("cuda", "cpu")}
    return mapping


def _local_kernel_path(repo_id: str):
    """Where LOCAL_KERNELS (`repo_id=path:repo_id=path`, kernels' format) points `repo_id`, or
    None. Parsed here: kernels' own parser is private and moved between its releases."""
    entries = (e.split("=", 1) for e in os.environ.get("LOCAL_KERNELS", "").split(":") if "=" in e)
    return {repo: Path(path) for repo, path in entries}.get(repo_id)


def kernelize_vision_rotary(model, *, mode, device=None, repo_id: str = REPO_ID, version: int = 1, **kernelize_kwargs):
    """make_kernelizable for the families found in `model` (ValueError if there are none, or
    one is none of the variants: then nothing is patched), then `kernels.kernelize` under
    `kernel_mapping(repo_id, version=version)` (added to any mapping already registered).
    Returns the model, as kernelize does."""
    import kernels

    make_kernelizable(model)
    with kernels.use_kernel_mapping(kernel_mapping(repo_id, version=version)):
        return kernels.kernelize(model, mode=mode, device=device, **kernelize_kwargs)
